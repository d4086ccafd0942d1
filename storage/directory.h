// Encoding and validation of key-directory headers and slot records (docs/FORMAT.md).
#pragma once

#include <cstdint>
#include <string_view>

#include "storage/format.h"

namespace tdstore::storage {

uint64_t header_checksum(const DirHeader& h);
void seal(DirHeader& h);  // sets the checksum
bool header_valid(const DirHeader& h);

uint64_t record_checksum(const SlotRecord& r);
void seal(SlotRecord& r);
// generation != 0 and the checksum matches.
bool record_valid(const SlotRecord& r);
// The key bytes. REQUIRES: record_sane(r) (key_len <= kMaxKeyBytes).
inline std::string_view record_key(const SlotRecord& r) { return {r.key, r.key_len}; }
// Fields a reader indexes with are in range: key_len in [1, kMaxKeyBytes], ndim <= kMaxDims,
// state live or erased. A crafted record can have a valid checksum and fail this.
bool record_sane(const SlotRecord& r);
// Whether all 512 bytes are zero (a version never written, or zeroed by recovery).
bool record_zero(const SlotRecord& r);
// The contribution of slot `slot` holding visible version `r` to DirHeader::dir_digest.
uint64_t slot_digest(uint64_t slot, const SlotRecord& r);

// Physical slot count for a key capacity: bit_ceil(capacity * 3 / 2), at least 8.
uint64_t slot_count_for(uint64_t key_capacity);
inline uint64_t slot_offset(uint64_t slot, int version) {
  return kSlotsOffset + slot * 2 * sizeof(SlotRecord) + static_cast<uint64_t>(version) * sizeof(SlotRecord);
}

}  // namespace tdstore::storage
