// Arena space a writer may hand out again (docs/DESIGN.md, "Space reuse"). An extent freed by
// the commit of generation F waits in the pending list until no reader can see a generation
// older than F and no view in the writer's own process holds it; its bytes then join the free
// map, coalesced with their neighbours. Runs are handed out in whole pages, so a page that
// still holds a live extent (or a page a reader may have copied on write) is never rewritten.
// Not synchronized: owned by the writer's Store. ExtentPins is thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "storage/mutex.h"

namespace tdstore::storage {

// The arena extents views in the writer's process hold, by offset.
class ExtentPins : public std::enable_shared_from_this<ExtentPins> {
 public:
  // Keeps `offset` held (and `keep`, the arena mapping, alive) while the result lives.
  std::shared_ptr<const void> pin(uint64_t offset, std::shared_ptr<const void> keep);
  bool held(uint64_t offset) const;

 private:
  struct Pin;
  void release(uint64_t offset);
  mutable Mutex mu_;
  std::unordered_map<uint64_t, uint64_t> counts_ GUARDED_BY(mu_);  // offset -> live pins
};

class FreeSpace {
 public:
  struct Extent {
    uint64_t offset, length, freed_at;
  };
  void add_pending(uint64_t offset, uint64_t length, uint64_t freed_at);
  // Joins [offset, offset + length) to the free map (a union: bytes already free stay free once).
  void add_free(uint64_t offset, uint64_t length);
  // Moves every pending extent freed at or before `oldest` and not held into the free map.
  void release(uint64_t oldest, const ExtentPins* held);
  // The whole pages of the lowest free run that holds at least `length` bytes from a page
  // boundary, removed from the free map: {offset, length}, both page multiples.
  std::optional<std::pair<uint64_t, uint64_t>> take(uint64_t length);
  // Drops free bytes at or past `end` (the writer's tail moved back below them).
  void trim(uint64_t end);
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t pending_bytes() const;
  const std::map<uint64_t, uint64_t>& free_runs() const { return free_; }

 private:
  void insert_run(uint64_t offset, uint64_t length);
  std::map<uint64_t, uint64_t>::iterator erase_run(std::map<uint64_t, uint64_t>::iterator it);

  std::map<uint64_t, uint64_t> free_;  // offset -> length: disjoint, coalesced
  std::set<uint64_t> paged_;           // offsets of the runs in free_ that hold a whole page
  uint64_t free_bytes_ = 0;
  std::vector<Extent> pending_;
};

}  // namespace tdstore::storage
