#include "storage/graph_seal.h"

#include <openssl/crypto.h>

#include <cstring>

namespace tdstore::storage {
namespace {

// magic "TDSG" | u8 seal version 1 | u8 MAC algorithm 1 (HMAC-SHA-256) | u16 0 |
// key id (8 bytes) | u64 LE written_ns | MAC (32 bytes) | record
constexpr char kMagic[4] = {'T', 'D', 'S', 'G'};
constexpr size_t kIdAt = 8, kTimeAt = 16, kMacAt = 24;
constexpr std::string_view kDomain{"tdstore graph seal 1\0", 21};

std::array<uint8_t, 32> mac_of(const Key& key, std::string_view catalog_key, std::string_view head,
                               std::string_view record) {
  return hmac_sha256(key.secret, {kDomain, catalog_key, std::string_view("\0", 1),
                                  head.substr(0, kMacAt), record});
}

std::string hex8(std::string_view b) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) out += {d[c >> 4], d[c & 15]};
  return out;
}

int nibble(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

}  // namespace

std::string describe(const Unsealed& u) {
  switch (u.status) {
    case SealStatus::Trusted:
      return "signed by trusted key " + u.signer;
    case SealStatus::Unsigned:
      return "unsigned (written before records were signed)";
    case SealStatus::Foreign:
      return "signed by key " + u.signer + ", which this user does not trust";
    case SealStatus::Altered:
      return u.signer.empty()
                 ? "its seal is cut short"
                 : "altered: its MAC under trusted key " + u.signer + " does not match";
    case SealStatus::Newer:
      return "sealed by a newer build (a seal version or MAC algorithm this build does not know)";
  }
  return "";
}

bool replaceable(const Unsealed& u, const Keyring& keys) {
  if (u.status == SealStatus::Unsigned) return true;
  return keys.signing && !u.signer.empty() && u.signer == keys.signing->id &&
         (u.status == SealStatus::Trusted || u.status == SealStatus::Altered);
}

std::string seal(const Key& key, std::string_view catalog_key, std::string_view record,
                 uint64_t written_ns) {
  std::string out(kSealBytes, '\0');
  std::memcpy(out.data(), kMagic, 4);
  out[4] = 1, out[5] = 1;
  for (size_t i = 0; i < 8; ++i)
    out[kIdAt + i] = static_cast<char>(nibble(key.id[2 * i]) * 16 + nibble(key.id[2 * i + 1]));
  for (size_t i = 0; i < 8; ++i)
    out[kTimeAt + i] = static_cast<char>((written_ns >> (8 * i)) & 0xff);
  auto mac = mac_of(key, catalog_key, out, record);
  std::memcpy(out.data() + kMacAt, mac.data(), mac.size());
  out.append(record);
  return out;
}

Unsealed unseal(std::string_view value, std::string_view catalog_key, const Keyring& keys) {
  Unsealed u;
  if (value.size() < 4 || std::memcmp(value.data(), kMagic, 4) != 0) {
    u.record = value;  // a record from before sealing: its first bytes are a meta length
    return u;
  }
  if (value.size() >= 6 && (value[4] != 1 || value[5] != 1)) {
    u.status = SealStatus::Newer;
    if (value.size() >= kIdAt + 8) u.signer = hex8(value.substr(kIdAt, 8));  // as v1 places it
    return u;
  }
  if (value.size() < kSealBytes) {
    u.status = SealStatus::Altered;
    return u;
  }
  u.signer = hex8(value.substr(kIdAt, 8));
  for (size_t i = 0; i < 8; ++i)
    u.written_ns |= uint64_t{static_cast<unsigned char>(value[kTimeAt + i])} << (8 * i);
  u.record = value.substr(kSealBytes);
  const Key* key = keys.find(u.signer);
  if (!key) {
    u.status = SealStatus::Foreign;
    return u;
  }
  auto mac = mac_of(*key, catalog_key, value, u.record);
  u.status = CRYPTO_memcmp(mac.data(), value.data() + kMacAt, mac.size()) == 0
                 ? SealStatus::Trusted
                 : SealStatus::Altered;
  return u;
}

}  // namespace tdstore::storage
