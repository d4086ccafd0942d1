// Encoding and validation of key-directory headers and slot records (docs/FORMAT.md).
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

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
// Where the slot versions lie in keys.tdd (FORMAT.md, "Key directory"). Versions 1-3: slot
// s's two versions side by side from offset 8192 on (1 KiB per slot). Version 4: after the
// key index (slot_count 8-byte entries, padded to whole pages), every slot's version 0, then
// every slot's version 1, so that new slots, written in creation order, fill whole pages.
// REQUIRES: slot_count a power of two of at most kMaxSlotCount (the header checks).
struct SlotLayout {
  uint64_t base = kSlotsOffset;  // offset of slot 0 version 0
  uint64_t slot_count = 0;
  bool split = false;  // version 4
  uint64_t offset(uint64_t slot, int version) const {
    const uint64_t v = static_cast<uint64_t>(version);
    return base + (split ? v * slot_count + slot : 2 * slot + v) * sizeof(SlotRecord);
  }
  // The slot and version of the record at `offset`. REQUIRES: a record offset of this layout.
  std::pair<uint64_t, int> slot_of(uint64_t offset) const {
    const uint64_t u = (offset - base) / sizeof(SlotRecord);
    if (split) return {u % slot_count, static_cast<int>(u / slot_count)};
    return {u / 2, static_cast<int>(u % 2)};
  }
  uint64_t end() const { return base + slot_count * 2 * sizeof(SlotRecord); }  // the file's size
};
inline SlotLayout slot_layout(uint32_t format_version, uint64_t slot_count) {
  if (format_version < kIndexedFormatVersion) return {kSlotsOffset, slot_count, false};
  return {kIndexOffset + align_up(slot_count * sizeof(uint64_t), kPageSize), slot_count, true};
}
// Index entry of version 4: 0 for an empty position, else slot + 1.
inline uint64_t index_entry_offset(uint64_t position) {
  return kIndexOffset + position * sizeof(uint64_t);
}

}  // namespace tdstore::storage
