#include "storage/free_space.h"

#include <algorithm>

#include "storage/format.h"

namespace tdstore::storage {

struct ExtentPins::Pin {
  std::shared_ptr<ExtentPins> owner;
  uint64_t offset;
  std::shared_ptr<const void> keep;
  ~Pin() { owner->release(offset); }
};

std::shared_ptr<const void> ExtentPins::pin(uint64_t offset, std::shared_ptr<const void> keep) {
  {
    MutexLock lock(&mu_);
    ++counts_[offset];
  }
  auto p = std::make_shared<Pin>();
  p->owner = shared_from_this();
  p->offset = offset;
  p->keep = std::move(keep);
  return p;
}

bool ExtentPins::held(uint64_t offset) const {
  MutexLock lock(&mu_);
  return counts_.count(offset) > 0;
}

void ExtentPins::release(uint64_t offset) {
  MutexLock lock(&mu_);
  if (auto it = counts_.find(offset); it != counts_.end() && --it->second == 0) counts_.erase(it);
}

void FreeSpace::add_pending(uint64_t offset, uint64_t length, uint64_t freed_at) {
  if (length) pending_.push_back({offset, length, freed_at});
}

namespace {
// Whether [offset, offset + length) holds a whole page.
bool paged(uint64_t offset, uint64_t length) {
  return ((offset + length) & ~(kPageSize - 1)) > align_up(offset, kPageSize);
}
}  // namespace

void FreeSpace::insert_run(uint64_t offset, uint64_t length) {
  free_.emplace(offset, length);
  free_bytes_ += length;
  if (paged(offset, length)) paged_.insert(offset);
}

std::map<uint64_t, uint64_t>::iterator FreeSpace::erase_run(
    std::map<uint64_t, uint64_t>::iterator it) {
  free_bytes_ -= it->second;
  paged_.erase(it->first);
  return free_.erase(it);
}

void FreeSpace::add_free(uint64_t offset, uint64_t length) {
  if (!length) return;
  uint64_t start = offset, end = offset + length;
  // Union with the runs it touches (a byte freed twice stays one free byte).
  auto it = free_.lower_bound(start);
  if (it != free_.begin() && std::prev(it)->first + std::prev(it)->second >= start) --it;
  while (it != free_.end() && it->first <= end) {
    start = std::min(start, it->first);
    end = std::max(end, it->first + it->second);
    it = erase_run(it);
  }
  insert_run(start, end - start);
}

void FreeSpace::release(uint64_t oldest, const ExtentPins* held) {
  std::vector<Extent> waiting;
  for (const Extent& e : pending_) {
    if (e.freed_at <= oldest && !(held && held->held(e.offset)))
      add_free(e.offset, e.length);
    else
      waiting.push_back(e);
  }
  pending_ = std::move(waiting);
}

std::optional<std::pair<uint64_t, uint64_t>> FreeSpace::take(uint64_t length) {
  const uint64_t need = align_up(std::max<uint64_t>(length, 1), kPageSize);
  for (uint64_t offset : paged_) {  // runs holding a whole page, by address; fragments skipped
    auto it = free_.find(offset);
    const uint64_t a = it->first, end = a + it->second;
    const uint64_t start = align_up(a, kPageSize), stop = end & ~(kPageSize - 1);
    if (stop - start < need) continue;
    erase_run(it);
    if (start > a) insert_run(a, start - a);
    if (end > stop) insert_run(stop, end - stop);
    return std::make_pair(start, stop - start);
  }
  return std::nullopt;
}

void FreeSpace::trim(uint64_t end) {
  auto it = free_.lower_bound(end);
  if (it != free_.begin() && std::prev(it)->first + std::prev(it)->second > end) {
    auto prev = std::prev(it);
    const uint64_t offset = prev->first;
    erase_run(prev);
    insert_run(offset, end - offset);
    it = free_.lower_bound(end);
  }
  while (it != free_.end()) it = erase_run(it);
}

uint64_t FreeSpace::pending_bytes() const {
  uint64_t n = 0;
  for (const Extent& e : pending_) n += e.length;
  return n;
}

}  // namespace tdstore::storage
