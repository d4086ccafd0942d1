// The writer's transaction: what a writable Store staged since its last commit, and the state
// only a writer has. Readers have none. It holds
//  - the staged changes: a new version per slot, format 4's new key index entries, catalog
//    records, the batch size, and the running change in live keys and live bytes;
//  - the write groups (Store::begin_group): what each part held when the group first changed
//    it, so that abort_group() puts the staged state back exactly;
//  - the running checksums of keys appended to, valid for their staged content;
//  - the small-write buffer: tensors of at most kCombineMaxBytes without spare capacity wait
//    in memory, bound for [offset, + size), so that neighbours go out in one write (gaps below
//    the alignment, which no extent can start in, are zero-filled);
//  - the arena allocator its extents come from, and whether the handle is broken.
// It knows slot records, extents and bytes; lookups (which slot a key is in, what is committed)
// are the Store's, which passes what it found in.
//
// Thread safety: the Store calls the staging members with exclusive access. flush() and the
// allocator's note_view() may run beside each other and beside the Store's other const calls: the
// buffer is guarded by its own mutex (checked by clang's -Wthread-safety) and the allocator by its
// own.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "storage/arena_allocator.h"
#include "storage/checksum.h"
#include "storage/directory.h"
#include "storage/mutex.h"

namespace tdstore {
class File;
}

namespace tdstore::storage {

class WriteTxn {
 public:
  static constexpr uint64_t kCombineMaxBytes = 4096;
  static constexpr uint64_t kCombineBufferBytes = 1 << 20;

  WriteTxn(ArenaAllocator::Setup allocator, std::shared_ptr<File> arena, uint64_t alignment);
  ~WriteTxn();

  // What is staged.
  bool empty() const { return records_.empty() && meta_.empty() && !batch_size_; }
  const std::unordered_map<uint64_t, SlotRecord>& records() const { return records_; }
  const SlotRecord* record(uint64_t slot) const;
  // Format 4: key index position -> the new slot it names.
  const std::unordered_map<uint64_t, uint64_t>& new_index_entries() const { return index_; }
  const std::map<std::string, std::optional<std::string>>& meta() const { return meta_; }
  const std::optional<std::vector<int64_t>>& batch_size() const { return batch_size_; }
  int64_t keys_delta() const { return keys_delta_; }
  int64_t bytes_delta() const { return bytes_delta_; }

  // Stages r as slot's new version. `committed_offset` is where the committed version's bytes
  // lie (nullopt when it holds none): an extent the staged version replaces is retired unless
  // it is that one (commit retires it) or r keeps it (appended in place). Drops the slot's
  // running checksum unless `keep_hash`. keys and bytes: the change in live keys and bytes.
  void stage(uint64_t slot, const SlotRecord& r, std::optional<uint64_t> committed_offset,
             int64_t keys, int64_t bytes, bool keep_hash = false);
  // Format 4: index position `position` names `slot`, a slot new in this transaction.
  void stage_index_entry(uint64_t position, uint64_t slot);
  void stage_meta(const std::string& key, std::optional<std::string> value);
  void stage_batch_size(std::vector<int64_t> batch_size);

  // Extents. allocate() records the extent for the enclosing write group.
  ArenaAllocator& allocator() { return *allocator_; }
  const ArenaAllocator& allocator() const { return *allocator_; }
  uint64_t allocate(uint64_t nbytes, uint64_t align);
  // An extent of a version no longer referenced (`replacement` keeps it when it has the same
  // offset): free after the next commit.
  void retire(const SlotRecord& old, const SlotRecord* replacement);

  // The running checksum of slot's staged content after appends; created empty (*fresh set)
  // the first time, for the caller to feed the stored bytes. forget_hash() when an append fails.
  Xxh3Stream& running_hash(uint64_t slot, bool* fresh);
  void forget_hash(uint64_t slot) { append_hashes_.erase(slot); }

  // Write groups: nested ones join the outermost. abort_group() returns true when the
  // outermost group was undone.
  void begin_group();
  void end_group();
  bool abort_group();
  bool in_group() const { return undo_ != nullptr; }

  // The small-write buffer. write_small() may flush first (not contiguous, or full); flush()
  // writes out what waits. A failed write breaks the handle, as a failed commit does.
  void write_small(uint64_t offset, const void* src, uint64_t nbytes) EXCLUDES(pending_mu_);
  void flush() const EXCLUDES(pending_mu_);

  bool broken() const { return broken_; }
  void set_broken() const { broken_ = true; }

  // After the commit of generation g, and after a rollback to the committed state.
  void committed(uint64_t g);
  void rolled_back(uint64_t next_generation, uint64_t committed_end);

 private:
  void remember_slot(uint64_t slot);
  void remember_meta(const std::string& key);
  void flush_locked() const REQUIRES(pending_mu_);
  void clear_staged();

  const std::shared_ptr<File> arena_;
  const uint64_t alignment_;
  std::unique_ptr<ArenaAllocator> allocator_;
  mutable std::atomic<bool> broken_{false};

  std::unordered_map<uint64_t, SlotRecord> records_;  // slot -> new version
  std::unordered_map<uint64_t, uint64_t> index_;      // format 4: index position -> new slot
  std::map<std::string, std::optional<std::string>>
      meta_;  // catalog key -> value (nullopt: delete)
  std::optional<std::vector<int64_t>> batch_size_;
  int64_t keys_delta_ = 0;
  int64_t bytes_delta_ = 0;
  // Running checksums of keys appended to, by slot (valid for the staged content).
  std::unordered_map<uint64_t, std::unique_ptr<Xxh3Stream>> append_hashes_;

  // The staged state the outermost group began from, saved as the group first changes each part.
  struct Undo {
    int depth = 0;
    std::unordered_map<uint64_t, std::optional<SlotRecord>> records;  // slot -> staged before
    std::vector<uint64_t> positions;                                  // index entries added
    std::map<std::string, std::optional<std::optional<std::string>>> meta;
    std::optional<std::optional<std::vector<int64_t>>> batch_size;
    int64_t keys_delta = 0, bytes_delta = 0;
    size_t retired = 0;                 // allocator_->retired_count() at the start
    ArenaAllocator::Extents allocated;  // extents allocate() handed out
  };
  std::unique_ptr<Undo> undo_;

  // has_pending_ lets the common case (nothing waiting) skip the lock.
  mutable Mutex pending_mu_;
  mutable std::atomic<bool> has_pending_{false};
  mutable std::string pending_ GUARDED_BY(pending_mu_);
  mutable uint64_t pending_offset_ GUARDED_BY(pending_mu_) = 0;
};

}  // namespace tdstore::storage
