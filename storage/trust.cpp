// tdstore/trust.h: the keyring as users see it, and signing records written before sealing.

#include "tdstore/trust.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>

#include "storage/graph_cache.h"
#include "storage/graph_meta.h"
#include "storage/graph_record.h"
#include "storage/graph_seal.h"
#include "storage/keyring.h"
#include "storage/store.h"
#include "tdstore/errors.h"

namespace tdstore {
namespace fs = std::filesystem;
using storage::Keyring;

KeyringInfo keyring_info() {
  const Keyring& k = Keyring::process();
  KeyringInfo info;
  if (k.signing) info.keys.push_back({k.signing->id, k.signing->path, true});
  for (const auto& t : k.trusted) info.keys.push_back({t.id, t.path, false});
  info.refused = k.refused;
  if (!k.cache_dir.empty()) info.graph_cache = k.cache_dir / "graphs";
  return info;
}

std::string create_key_file(const fs::path& path) { return storage::create_key(path).id; }

fs::path user_graph_cache() {
  std::string why;
  storage::Store* cache = storage::user_graph_cache(&why);
  if (!cache) throw IOError("this user's graph cache is not available: " + why);
  return cache->path();
}

SignResult sign_graphs(const fs::path& dir, std::string_view function) {
  const Keyring& keys = Keyring::process();
  if (!keys.signing)
    throw IOError("no signing key: " +
                  (keys.refused.empty() ? std::string("(none found)") : keys.refused.front()));
  // Unsigned records are planted by anyone who can write the catalog: sign only in a catalog
  // no other user can write, so that what the user vouches for is what the user's runs wrote.
  for (const fs::path& p : {dir / "catalog", dir / "catalog" / "data.mdb"}) {
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) continue;  // opening the store says what is wrong
    if (st.st_uid != ::geteuid())
      throw IOError(p.string() + " is owned by uid " + std::to_string(st.st_uid) +
                    ", not by this user: its unsigned graphs may be anyone's; clear them "
                    "(`tdstore cache --clear`) instead of signing them");
    if (st.st_mode & 022)
      throw IOError(p.string() +
                    " may be written by its group or others: its unsigned graphs may be anyone's; "
                    "clear them (`tdstore cache --clear`) instead of signing them");
  }
  auto store = storage::Store::open(dir, OpenMode::ReadOnly, {});
  const std::string prefix =
      std::string(storage::kCachePrefix) + (function.empty() ? "" : std::string(function) + "/");
  SignResult r;
  const uint64_t now =
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  for (const auto& [k, v] : store->scan_cache(prefix)) {
    bool is_graph = true;
    try {  // only whole graph records: anything else is damage, for --clear
      storage::parse_graph_meta(storage::decode_graph_record(v, k).meta);
    } catch (const CorruptionError&) {
      is_graph = false;
    }
    if (!is_graph || storage::unseal(v, k, keys).status != storage::SealStatus::Unsigned) {
      ++r.kept;
      continue;
    }
    store->put_cache(k, storage::seal(*keys.signing, k, v, now));
    ++r.signed_records;
  }
  return r;
}

}  // namespace tdstore
