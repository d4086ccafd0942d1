// Who may write the code a compiled function runs (docs/DESIGN.md, "Trust").
//
// A stored compiled graph is a program: loading it runs code its writer chose. So a graph record
// is loaded only when it carries a valid HMAC-SHA-256 under a key this user trusts; every other
// record (unsigned, signed by a key this user does not hold, altered) is never deserialized, and
// the function traces anew as on a miss (explain() says why).
//
// The keys, read once per process on first use:
//  - the signing key: the file named by $TDSTORE_KEY_FILE when set (CI, a team key), else this
//    user's own key, <config>/key, created on first use (32 random bytes, mode 0600, in a 0700
//    directory). <config> is $XDG_CONFIG_HOME/tdstore, else $HOME/.config/tdstore.
//  - keys trusted for loading only: every file in <config>/trusted/ (a team member's key, an
//    old key after switching to a team key).
// A key file holds 64 hexadecimal digits and a newline. One that is not owned by this user, or
// that its group or others may read or write, is refused (keyring_info() says why): a secret
// others can read signs nothing.
//
// Graphs the dict's store cannot hold (its catalog is not writable by this user, or the record
// under the key belongs to another signer) go to this user's graph cache, <cache>/graphs, a
// store of its own (<cache> is $XDG_CACHE_HOME/tdstore, else $HOME/.cache/tdstore), bounded by
// $TDSTORE_GRAPH_CACHE_BYTES (default 1 GiB; the records written longest ago go first) and safe
// for several processes at once (LMDB transactions).
//
// Thread safety: every function here may be called from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "tdstore/export.h"

namespace tdstore {

struct TrustedKey {
  std::string id;  // 16 hex digits: the first 8 bytes of HMAC-SHA-256(key, "tdstore key id")
  std::filesystem::path path;
  bool signs = false;  // the key new records are signed with
};

struct KeyringInfo {
  std::vector<TrustedKey> keys;       // the signing key first
  std::vector<std::string> refused;   // key files not used, each with the reason
  std::filesystem::path graph_cache;  // this user's graph cache (may not exist yet)
};

// The keys this process trusts, loading them (and creating this user's own key) on first use.
TDSTORE_API KeyringInfo keyring_info();

// This user's graph cache, created when missing: a store to name as CompileOptions::store (or
// tdstore.compile(store=...)) to keep a function's graphs there whatever the dict's store is.
// IOError naming the path when it cannot be created or opened.
TDSTORE_API std::filesystem::path user_graph_cache();

// Writes a new random key (a team key to share) to `path` with mode 0600 and returns its id.
// Error when path exists; IOError when it cannot be written.
TDSTORE_API std::string create_key_file(const std::filesystem::path& path);

struct SignResult {
  uint64_t signed_records = 0;  // unsigned records now signed with the signing key
  uint64_t kept = 0;  // records left as they were (signed by any key, or not a whole record)
};
// Signs the unsigned compiled-graph records of one function ("" for all) in the store at dir
// with this user's signing key: the user vouches for records written before sealing existed.
// Records signed by any key, and values that do not decode as graph records, are left alone
// (`tdstore cache --clear` removes them). Error, signing nothing, when the catalog is owned by
// another user or writable by others (anyone could have planted its unsigned records); IOError
// when it cannot be written.
TDSTORE_API SignResult sign_graphs(const std::filesystem::path& dir,
                                   std::string_view function = "");

}  // namespace tdstore
