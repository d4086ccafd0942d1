// Which arena bytes are free: derived from the key directory at a writer's open (no free list
// is stored, so a crash can never leave one inconsistent), then kept up to date by commits.
// Rules (FORMAT.md, "Space reuse"): along a slot's history V0 (visible), V1, V2, ... (newest
// first, generations h0 > h1 > ...), V0's extent is live; Vk's tensor extent was freed at
// h(k-1) (unless a newer version keeps it, appended in place); the arena copies of V0 and V1
// are live (they back the inline versions), Vk's copy (k >= 2) was freed at h(k-2), when its
// inline version was overwritten. An extent freed at F is reusable once oldest >= F.
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "storage/directory.h"
#include "storage/store.h"
#include "tdstore/env.h"

namespace tdstore::storage {

FreeSpace Store::scan_space(uint64_t oldest) const {
  constexpr uint64_t kLive = UINT64_MAX;
  const uint64_t g = snap_->header.generation;
  const uint64_t limit = std::min<uint64_t>(arena_size(), snap_->mapping->size());
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> extents;  // offset -> length, freed_at
  auto mark = [&](uint64_t offset, uint64_t length, uint64_t freed_at) {
    if (!length) return;
    auto [it, fresh] = extents.try_emplace(offset, length, freed_at);
    if (!fresh)
      it->second = {std::max(it->second.first, length), std::max(it->second.second, freed_at)};
  };
  std::vector<SlotRecord> chain;
  for (uint64_t s = 0; s < snap_->header.slot_count; ++s) {
    chain.clear();
    for (int v = 0; v < 2; ++v) {
      const SlotRecord& r = snap_->inline_record(s, v);
      if (!record_valid(r)) continue;
      if (r.generation > g) {  // a newer commit than this handle's (readers only): all live
        if (r.state == static_cast<uint8_t>(SlotState::Live))
          mark(r.data_offset, r.data_capacity, kLive);
        mark(r.self, sizeof(SlotRecord), kLive);
      } else {
        chain.push_back(r);
      }
    }
    if (chain.empty()) continue;
    std::sort(chain.begin(), chain.end(),
              [](const SlotRecord& a, const SlotRecord& b) { return a.generation > b.generation; });
    // Walk back while a version's extents may still be pending: Vk is needed while the
    // generation that freed its copy, h(k-2) (h0 for V1's tensor bytes), is newer than oldest.
    for (;;) {
      const size_t k = chain.size();
      const uint64_t freed = chain[k >= 2 ? k - 2 : 0].generation;
      const SlotRecord& last = chain.back();
      if (freed <= oldest || last.prev < kArenaDataOffset || last.prev > limit ||
          limit - last.prev < sizeof(SlotRecord))
        break;
      SlotRecord older;
      std::memcpy(&older, snap_->mapping->base() + last.prev, sizeof older);
      if (!record_valid(older) || older.generation >= last.generation) break;
      chain.push_back(older);
    }
    for (size_t k = 0; k < chain.size(); ++k) {
      const SlotRecord& r = chain[k];
      if (r.state == static_cast<uint8_t>(SlotState::Live))
        mark(r.data_offset, r.data_capacity, k == 0 ? kLive : chain[k - 1].generation);
      mark(r.self, sizeof(SlotRecord), k <= 1 ? kLive : chain[k - 2].generation);
    }
  }
  FreeSpace space;
  uint64_t cursor = kArenaDataOffset;  // bytes below are accounted for
  const uint64_t end = snap_->header.arena_end;
  for (const auto& [offset, info] : extents) {
    const auto [length, freed_at] = info;
    if (freed_at <= oldest) continue;  // free: left to the gaps
    if (std::min(offset, end) > cursor) space.add_free(cursor, std::min(offset, end) - cursor);
    if (freed_at != kLive && offset >= cursor) space.add_pending(offset, length, freed_at);
    cursor = std::max(cursor, offset + length);
  }
  if (end > cursor) space.add_free(cursor, end - cursor);
  return space;
}

SpaceInfo Store::space() const {
  SpaceInfo i{};
  i.arena_end = snap_->header.arena_end;
  i.live_bytes = snap_->header.live_bytes;
  const uint64_t oldest =
      readers_ ? readers_->oldest(snap_->header.generation) : snap_->header.generation;
  i.readers = readers_ ? readers_->readers() : 0;
  if (txn_ && txn_->allocator().reuses()) {
    std::tie(i.reusable_bytes, i.pending_bytes) = txn_->allocator().free_and_pending(oldest);
  } else {
    FreeSpace s = scan_space(oldest);
    i.reusable_bytes = s.free_bytes();
    i.pending_bytes = s.pending_bytes();
  }
  i.allocated_bytes = arena_file_->allocated_bytes();
  return i;
}

}  // namespace tdstore::storage
