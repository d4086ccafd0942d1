#include "storage/arena_allocator.h"

#include <algorithm>

#include "storage/format.h"
#include "tdstore/errors.h"

namespace tdstore::storage {

ArenaAllocator::ArenaAllocator(Setup setup)
    : where_(std::move(setup.where)),
      limit_(setup.limit),
      reuses_(setup.free != nullptr),
      oldest_reader_(std::move(setup.oldest_reader)),
      pins_(std::move(setup.pins)),
      taken_(std::move(setup.taken)),
      free_(std::move(setup.free)),
      tail_(setup.tail) {}

uint64_t ArenaAllocator::tail() const {
  MutexLock lock(&mu_);
  return tail_;
}

uint64_t ArenaAllocator::allocate(uint64_t nbytes, uint64_t align) {
  MutexLock lock(&mu_);
  if (free_ && nbytes) {
    if (!released_) {  // once per transaction: the readers' oldest generation only grows
      free_->release(oldest_reader_(), pins_.get());
      released_ = true;
    }
    uint64_t at = align_up(run_cur_, align);
    if (run_end_ > at && run_end_ - at >= nbytes) {
      free_->add_free(run_cur_, at - run_cur_);  // padding stays free (whole pages only are reused)
      run_cur_ = at + nbytes;
      txn_runs_.emplace_back(at, nbytes);
      return at;
    }
    if (auto run = free_->take(nbytes)) {
      end_run();
      run_start_ = run->first;
      run_end_ = run->first + run->second;
      // This process's private (copy-on-write) pages of the run, left by views that died,
      // would hide the bytes written now: the Store drops them.
      if (taken_) taken_(run_start_, run->second);
      run_cur_ = run_start_ + nbytes;
      txn_runs_.emplace_back(run_start_, nbytes);
      return run_start_;
    }
  }
  uint64_t start = align_up(tail_, align);
  if (exposed_end_ > (start & ~(kPageSize - 1)))
    start = std::max(start, align_up(exposed_end_, kPageSize));
  if (start + nbytes > limit_ || start + nbytes < start)
    throw CapacityError(where_ + ": arena full: " + std::to_string(nbytes) +
                        " more bytes at offset " + std::to_string(start) +
                        " exceed arena_reserve " + std::to_string(limit_) +
                        "; reopen with a larger StoreOptions::arena_reserve or compact");
  if (free_) free_->add_free(tail_, start - tail_);
  tail_ = start + nbytes;
  return start;
}

void ArenaAllocator::unallocate(uint64_t offset, uint64_t length, uint64_t saved_tail) {
  MutexLock lock(&mu_);
  if (offset >= run_start_ && offset < run_end_) {
    txn_retired_.emplace_back(offset, length);
  } else {
    tail_ = saved_tail;
    if (free_) free_->trim(tail_);  // padding freed past the tail is tail again
  }
}

void ArenaAllocator::end_run() {
  if (!free_) return;
  if (run_end_ > run_cur_) free_->add_free(run_cur_, run_end_ - run_cur_);
  run_start_ = run_cur_ = run_end_ = 0;
}

void ArenaAllocator::retire(uint64_t offset, uint64_t length) {
  MutexLock lock(&mu_);
  if (free_) txn_retired_.emplace_back(offset, length);
}

size_t ArenaAllocator::retired_count() const {
  MutexLock lock(&mu_);
  return txn_retired_.size();
}

void ArenaAllocator::abort_group(size_t retired, const Extents& allocated) {
  MutexLock lock(&mu_);
  txn_retired_.resize(std::min(txn_retired_.size(), retired));
  if (free_)
    for (auto [offset, length] : allocated)
      if (offset < tail_) txn_retired_.emplace_back(offset, length);
}

void ArenaAllocator::note_view(uint64_t offset, uint64_t nbytes) {
  MutexLock lock(&mu_);
  exposed_end_ = std::max(exposed_end_, offset + nbytes);
  if (offset >= run_start_ && offset < run_end_) {
    // Later extents of the run start on a fresh page.
    const uint64_t next =
        std::min(run_end_, std::max(run_cur_, align_up(offset + nbytes, kPageSize)));
    free_->add_free(run_cur_, next - run_cur_);
    run_cur_ = next;
  }
}

uint64_t ArenaAllocator::exposed_end() const {
  MutexLock lock(&mu_);
  return exposed_end_;
}

void ArenaAllocator::committed(uint64_t g) {
  MutexLock lock(&mu_);
  if (free_) {
    free_->add_free(tail_, align_up(tail_, kPageSize) - tail_);  // the rest of the last page
    end_run();
    for (auto [offset, length] : txn_retired_) free_->add_pending(offset, length, g);
  }
  tail_ = align_up(tail_, kPageSize);
  txn_runs_.clear();
  txn_retired_.clear();
  released_ = false;
}

void ArenaAllocator::rolled_back(uint64_t next_generation, uint64_t committed_end) {
  MutexLock lock(&mu_);
  // What this transaction took from free runs may be held by views made of staged extents.
  end_run();
  if (free_)
    for (auto [offset, length] : txn_runs_) free_->add_pending(offset, length, next_generation);
  txn_runs_.clear();
  txn_retired_.clear();
  released_ = false;
  tail_ = std::max(align_up(committed_end, kPageSize), align_up(exposed_end_, kPageSize));
  if (free_) free_->trim(tail_);  // padding freed past the tail is tail again
}

std::pair<uint64_t, uint64_t> ArenaAllocator::free_and_pending(uint64_t oldest) {
  MutexLock lock(&mu_);
  if (!free_) return {0, 0};
  free_->release(oldest, pins_.get());
  return {free_->free_bytes(), free_->pending_bytes()};
}

}  // namespace tdstore::storage
