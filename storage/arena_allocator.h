// The writer's arena allocator (docs/DESIGN.md, "Space reuse"): an extent is cut from the
// current free run, else from a new run of whole pages taken from the free space, else from
// the tail. It tracks what the transaction takes and retires: at commit the retired extents
// become pending at the new generation; at rollback the runs taken become pending too (views
// of staged extents may hold them) and the tail moves back.
//
// Invariant (store_internal.h): within a transaction an extent never shares a page with one
// already handed out through a view (note_view()): later extents of a run start on a fresh
// page, and the tail moves past the last exposed page.
//
// Thread safety: every member serializes on one mutex, so note_view() (from Store::view(), a
// const call) may run beside space figures and other views; the writer's Store calls the
// rest with exclusive access.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "storage/free_space.h"
#include "storage/mutex.h"

namespace tdstore::storage {

class ArenaAllocator {
 public:
  using Extents = std::vector<std::pair<uint64_t, uint64_t>>;  // offset, length
  struct Setup {
    std::string where;                // the store, for errors
    uint64_t tail = 0;                // the first byte past the committed arena, on a page boundary
    uint64_t limit = 0;               // bytes the arena mapping reserves: no extent ends past it
    std::unique_ptr<FreeSpace> free;  // nullptr: space is not reused, extents come from the tail
    // The oldest generation a registered reader reads, asked once per transaction before free
    // space is first handed out; what views in this process hold.
    std::function<uint64_t()> oldest_reader;
    std::shared_ptr<const ExtentPins> pins;
    // Called with a run of free pages just taken, before any of it is handed out (the Store
    // drops this process's own copies of its pages there).
    std::function<void(uint64_t offset, uint64_t length)> taken;
  };
  explicit ArenaAllocator(Setup setup);

  uint64_t tail() const EXCLUDES(mu_);
  bool reuses() const { return reuses_; }
  // An extent of nbytes at a multiple of align. CapacityError naming the store when it would
  // end past the limit.
  uint64_t allocate(uint64_t nbytes, uint64_t align) EXCLUDES(mu_);
  // Gives back an extent allocate() returned when writing into it failed: retired when it
  // came from a free run, else the tail moves back to saved_tail.
  void unallocate(uint64_t offset, uint64_t length, uint64_t saved_tail) EXCLUDES(mu_);
  // An extent the transaction no longer references: free once the commit is older than every
  // reader (nothing, without reuse).
  void retire(uint64_t offset, uint64_t length) EXCLUDES(mu_);
  // For a write group: how many extents are retired so far; undoing the group keeps the first
  // `retired` and retires what it allocated (views taken inside the group may hold them).
  size_t retired_count() const EXCLUDES(mu_);
  void abort_group(size_t retired, const Extents& allocated) EXCLUDES(mu_);
  // An extent handed out through a view: nothing allocated later in this transaction shares
  // its pages.
  void note_view(uint64_t offset, uint64_t nbytes) EXCLUDES(mu_);
  uint64_t exposed_end() const EXCLUDES(mu_);
  // After the commit of generation g: the rest of the last page joins the free space, the
  // retired extents become pending at g, and the tail starts on a fresh page.
  void committed(uint64_t g) EXCLUDES(mu_);
  // After a rollback to the committed arena end: the runs taken become pending at
  // next_generation and the tail moves back (not below the last exposed page).
  void rolled_back(uint64_t next_generation, uint64_t committed_end) EXCLUDES(mu_);
  // Free and pending bytes once what no reader at `oldest` or view can see is released.
  std::pair<uint64_t, uint64_t> free_and_pending(uint64_t oldest) EXCLUDES(mu_);

 private:
  void end_run() REQUIRES(mu_);
  const std::string where_;
  const uint64_t limit_;
  const bool reuses_;
  const std::function<uint64_t()> oldest_reader_;
  const std::shared_ptr<const ExtentPins> pins_;
  const std::function<void(uint64_t, uint64_t)> taken_;
  mutable Mutex mu_;
  const std::unique_ptr<FreeSpace> free_ PT_GUARDED_BY(mu_);
  uint64_t tail_ GUARDED_BY(mu_);          // next free arena byte (staged allocations end here)
  bool released_ GUARDED_BY(mu_) = false;  // free_ caught up with the readers this transaction
  // The run allocations are cut from: [run_start_, run_end_), next byte run_cur_.
  uint64_t run_start_ GUARDED_BY(mu_) = 0, run_end_ GUARDED_BY(mu_) = 0,
                      run_cur_ GUARDED_BY(mu_) = 0;
  uint64_t exposed_end_ GUARDED_BY(mu_) = 0;  // end of the highest extent handed out by a view
  Extents txn_runs_ GUARDED_BY(mu_), txn_retired_ GUARDED_BY(mu_);
};

}  // namespace tdstore::storage
