#include "storage/directory.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "storage/checksum.h"

namespace tdstore::storage {

uint64_t header_checksum(const DirHeader& h) { return xxh3(&h, offsetof(DirHeader, checksum)); }
void seal(DirHeader& h) { h.checksum = header_checksum(h); }
bool header_valid(const DirHeader& h) {
  return std::memcmp(h.magic, kDirMagic, 8) == 0 && h.checksum == header_checksum(h);
}

uint64_t record_checksum(const SlotRecord& r) { return xxh3(&r, offsetof(SlotRecord, checksum)); }
void seal(SlotRecord& r) { r.checksum = record_checksum(r); }
bool record_valid(const SlotRecord& r) {
  return r.generation != 0 && r.checksum == record_checksum(r);
}

bool record_sane(const SlotRecord& r) {
  return r.key_len >= 1 && r.key_len <= kMaxKeyBytes && r.ndim <= kMaxDims &&
         (r.state == static_cast<uint8_t>(SlotState::Live) ||
          r.state == static_cast<uint8_t>(SlotState::Erased));
}

bool record_zero(const SlotRecord& r) {
  static const SlotRecord zero{};
  return std::memcmp(&r, &zero, sizeof r) == 0;
}

uint64_t slot_digest(uint64_t slot, const SlotRecord& r) {
  const uint64_t pair[2] = {slot, r.checksum};
  return xxh3(pair, sizeof pair);
}

uint64_t slot_count_for(uint64_t key_capacity) {
  return std::max<uint64_t>(8, std::bit_ceil(key_capacity + key_capacity / 2));
}

}  // namespace tdstore::storage
