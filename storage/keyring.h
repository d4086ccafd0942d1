// The keys a process signs and checks compiled-graph records with (tdstore/trust.h): where
// they live, how they are created and which key files are refused. Torch-free; the CLI and
// libtdstore share it.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tdstore::storage {

struct Key {
  std::array<uint8_t, 32> secret{};
  std::string id;  // 16 hex digits (key_id)
  std::filesystem::path path;
};

// The first 8 bytes of HMAC-SHA-256(secret, "tdstore key id"), in hex: names a key without
// revealing it.
std::string key_id(const std::array<uint8_t, 32>& secret);

// HMAC-SHA-256 of the concatenated parts (OpenSSL's libcrypto).
std::array<uint8_t, 32> hmac_sha256(const std::array<uint8_t, 32>& secret,
                                    std::initializer_list<std::string_view> parts);

struct Keyring {
  std::optional<Key> signing;  // nullopt: no key could be read or created (see refused)
  std::vector<Key> trusted;    // loading only
  std::vector<std::string> refused;
  std::filesystem::path config_dir, cache_dir;

  // The key with this id, signing key included; nullptr when this user does not hold it.
  const Key* find(std::string_view id) const;

  // Reads the keys from the environment as tdstore/trust.h says, creating the user's own key
  // when missing. Never throws: what cannot be used goes to `refused`.
  static Keyring load();
  // The process's keyring: load() once, on first use. Thread-safe.
  static const Keyring& process();
};

// Writes a fresh random key to path (O_EXCL, mode 0600). Error when it exists, IOError when it
// cannot be written. Returns the key.
Key create_key(const std::filesystem::path& path);

}  // namespace tdstore::storage
