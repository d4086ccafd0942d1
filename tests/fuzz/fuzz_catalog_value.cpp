// libFuzzer target: a catalog record as LMDB holds it (input: u8 key length, the key, the
// record). Decoding at every generation must end in a value, absence or a CorruptionError.
#include <cstdint>
#include <string_view>

#include "storage/catalog.h"
#include "tdstore/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  size_t key_len = data[0];
  if (size - 1 < key_len) return 0;
  std::string_view key(reinterpret_cast<const char*>(data) + 1, key_len);
  std::string_view record(reinterpret_cast<const char*>(data) + 1 + key_len, size - 1 - key_len);
  for (uint64_t gen : {uint64_t{0}, uint64_t{1}, uint64_t{7}, UINT64_MAX}) {
    try {
      tdstore::storage::catalog_value_at(key, record, gen);
    } catch (const tdstore::CorruptionError&) {
    }
  }
  return 0;
}
