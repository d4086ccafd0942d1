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
    std::lock_guard lock(mu_);
    ++counts_[offset];
  }
  auto p = std::make_shared<Pin>();
  p->owner = shared_from_this();
  p->offset = offset;
  p->keep = std::move(keep);
  return p;
}

bool ExtentPins::held(uint64_t offset) const {
  std::lock_guard lock(mu_);
  return counts_.count(offset) > 0;
}

void ExtentPins::release(uint64_t offset) {
  std::lock_guard lock(mu_);
  if (auto it = counts_.find(offset); it != counts_.end() && --it->second == 0) counts_.erase(it);
}

void FreeSpace::add_pending(uint64_t offset, uint64_t length, uint64_t freed_at) {
  if (length) pending_.push_back({offset, length, freed_at});
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
    free_bytes_ -= it->second;
    it = free_.erase(it);
  }
  free_.emplace(start, end - start);
  free_bytes_ += end - start;
}

void FreeSpace::release(uint64_t oldest, const ExtentPins* held) {
  std::vector<Extent> waiting;
  for (const Extent& e : pending_) {
    if (e.freed_at <= oldest && !(held && held->held(e.offset))) add_free(e.offset, e.length);
    else waiting.push_back(e);
  }
  pending_ = std::move(waiting);
}

std::optional<std::pair<uint64_t, uint64_t>> FreeSpace::take(uint64_t length) {
  const uint64_t need = align_up(std::max<uint64_t>(length, 1), kPageSize);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const uint64_t a = it->first, end = a + it->second;
    const uint64_t start = align_up(a, kPageSize), stop = end & ~(kPageSize - 1);
    if (stop <= start || stop - start < need) continue;
    free_.erase(it);
    free_bytes_ -= end - a;
    if (start > a) add_free(a, start - a);
    if (end > stop) add_free(stop, end - stop);
    return std::make_pair(start, stop - start);
  }
  return std::nullopt;
}

void FreeSpace::trim(uint64_t end) {
  auto it = free_.lower_bound(end);
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second > end) {
      free_bytes_ -= prev->first + prev->second - end;
      prev->second = end - prev->first;
    }
  }
  while (it != free_.end()) {
    free_bytes_ -= it->second;
    it = free_.erase(it);
  }
}

uint64_t FreeSpace::pending_bytes() const {
  uint64_t n = 0;
  for (const Extent& e : pending_) n += e.length;
  return n;
}

}  // namespace tdstore::storage
