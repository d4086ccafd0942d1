// The seal of a compiled-graph record (docs/FORMAT.md, "Sealed graph records"): who signed it,
// when, and an HMAC-SHA-256 over the catalog key and every byte of the record, checked before
// any of the record is parsed (tdstore/trust.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "storage/keyring.h"

namespace tdstore::storage {

inline constexpr size_t kSealBytes = 56;

enum class SealStatus : uint8_t {
  Trusted,   // signed by a key of the keyring, and the MAC matches
  Unsigned,  // a record written before sealing (no seal)
  Foreign,   // signed by a key the keyring does not hold
  Altered,   // signed by a key of the keyring, but the MAC does not match (or the seal is cut)
  Newer,     // a seal of a version (or MAC algorithm) this build does not know
};

struct Unsealed {
  SealStatus status = SealStatus::Unsigned;
  std::string signer;       // the key id, "" when unsigned
  uint64_t written_ns = 0;  // when it was sealed (0 when unsigned)
  std::string_view record;  // the record inside (storage/graph_record.h): use only if Trusted
};

// "signed by trusted key 0123abcd...", "unsigned ...", ...: why a record is (not) loaded.
std::string describe(const Unsealed& u);
// Whether a store's record is this user's to replace or remove: unsigned, or sealed (intact or
// not) under the key this user signs with. Records of other keys, trusted ones included (a
// teammate's), are theirs.
bool replaceable(const Unsealed& u, const Keyring& keys);

// The sealed value stored under catalog_key.
std::string seal(const Key& key, std::string_view catalog_key, std::string_view record,
                 uint64_t written_ns);
// What value (read under catalog_key) is. O(value bytes) for the MAC; nothing is parsed. A
// value shorter than a seal is Altered (cut short); a seal of another version is Newer.
Unsealed unseal(std::string_view value, std::string_view catalog_key, const Keyring& keys);

}  // namespace tdstore::storage
