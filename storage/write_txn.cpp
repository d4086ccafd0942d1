// The writer's transaction (write_txn.h): staging, write groups and the small-write buffer.
#include "storage/write_txn.h"

#include "tdstore/env.h"

namespace tdstore::storage {

WriteTxn::WriteTxn(ArenaAllocator::Setup allocator, std::shared_ptr<File> arena, uint64_t alignment)
    : arena_(std::move(arena)),
      alignment_(alignment),
      allocator_(std::make_unique<ArenaAllocator>(std::move(allocator))) {}

WriteTxn::~WriteTxn() = default;

const SlotRecord* WriteTxn::record(uint64_t slot) const {
  auto it = records_.find(slot);
  return it == records_.end() ? nullptr : &it->second;
}

void WriteTxn::stage(uint64_t slot, const SlotRecord& r, std::optional<uint64_t> committed_offset,
                     int64_t keys, int64_t bytes, bool keep_hash) {
  remember_slot(slot);
  if (auto it = records_.find(slot); it != records_.end()) {
    // A staged extent shared with the committed version is retired by commit(), not here.
    if (!committed_offset || *committed_offset != it->second.data_offset) retire(it->second, &r);
  }
  records_[slot] = r;
  if (!keep_hash) append_hashes_.erase(slot);
  keys_delta_ += keys;
  bytes_delta_ += bytes;
}

void WriteTxn::stage_index_entry(uint64_t position, uint64_t slot) {
  index_[position] = slot;
  if (undo_) undo_->positions.push_back(position);
}

void WriteTxn::stage_meta(const std::string& key, std::optional<std::string> value) {
  remember_meta(key);
  meta_[key] = std::move(value);
}

void WriteTxn::stage_batch_size(std::vector<int64_t> batch_size) {
  if (undo_ && !undo_->batch_size) undo_->batch_size = batch_size_;
  batch_size_ = std::move(batch_size);
}

uint64_t WriteTxn::allocate(uint64_t nbytes, uint64_t align) {
  const uint64_t at = allocator_->allocate(nbytes, align);
  if (undo_) undo_->allocated.emplace_back(at, nbytes);
  return at;
}

void WriteTxn::retire(const SlotRecord& old, const SlotRecord* replacement) {
  if (old.state != static_cast<uint8_t>(SlotState::Live) || old.data_capacity == 0) return;
  if (replacement && replacement->state == static_cast<uint8_t>(SlotState::Live) &&
      replacement->data_capacity != 0 && replacement->data_offset == old.data_offset)
    return;  // appended in place (an extent of no bytes shares no bytes, wherever it points)
  allocator_->retire(old.data_offset, old.data_capacity);
}

Xxh3Stream& WriteTxn::running_hash(uint64_t slot, bool* fresh) {
  auto& running = append_hashes_[slot];
  *fresh = !running;
  if (!running) running = std::make_unique<Xxh3Stream>();
  return *running;
}

void WriteTxn::begin_group() {
  if (undo_) {
    ++undo_->depth;
    return;
  }
  undo_ = std::make_unique<Undo>();
  undo_->depth = 1;
  undo_->keys_delta = keys_delta_;
  undo_->bytes_delta = bytes_delta_;
  undo_->retired = allocator_->retired_count();
}

void WriteTxn::end_group() {
  if (undo_ && --undo_->depth == 0) undo_.reset();
}

void WriteTxn::remember_slot(uint64_t slot) {
  if (!undo_ || undo_->records.count(slot)) return;
  std::optional<SlotRecord> before;
  if (const SlotRecord* r = record(slot)) before = *r;
  undo_->records.emplace(slot, before);
}

void WriteTxn::remember_meta(const std::string& key) {
  if (!undo_ || undo_->meta.count(key)) return;
  std::optional<std::optional<std::string>> before;
  if (auto it = meta_.find(key); it != meta_.end()) before = it->second;
  undo_->meta.emplace(key, before);
}

bool WriteTxn::abort_group() {
  if (!undo_ || --undo_->depth > 0) return false;  // an inner group: the outermost one undoes
  Undo u = std::move(*undo_);
  undo_.reset();
  for (auto& [slot, before] : u.records) {
    if (before)
      records_[slot] = *before;
    else
      records_.erase(slot);
    append_hashes_.erase(slot);  // its running hash may hold the group's rows
  }
  for (uint64_t p : u.positions) index_.erase(p);
  for (auto& [key, before] : u.meta) {
    if (before)
      meta_[key] = *before;
    else
      meta_.erase(key);
  }
  if (u.batch_size) batch_size_ = *u.batch_size;
  keys_delta_ = u.keys_delta;
  bytes_delta_ = u.bytes_delta;
  // The records the group replaced are staged again: what it retired is not free. What it
  // allocated is unreferenced: free after the next commit, like a replaced staged extent (a
  // view of it, taken inside the group, keeps it pinned meanwhile).
  allocator_->abort_group(u.retired, u.allocated);
  return true;
}

void WriteTxn::write_small(uint64_t offset, const void* src, uint64_t nbytes) {
  MutexLock lock(&pending_mu_);  // uncontended: const calls flushing it are not concurrent here
  const uint64_t end = pending_offset_ + pending_.size();
  if (!pending_.empty() && (offset < end || offset - end >= alignment_ ||
                            pending_.size() + (offset - end) + nbytes > kCombineBufferBytes))
    flush_locked();
  if (pending_.empty()) pending_offset_ = offset;
  pending_.append(offset - (pending_offset_ + pending_.size()), '\0');
  pending_.append(static_cast<const char*>(src), nbytes);
  has_pending_.store(true, std::memory_order_release);
}

void WriteTxn::flush() const {
  if (!has_pending_.load(std::memory_order_acquire)) return;
  MutexLock lock(&pending_mu_);
  flush_locked();
}

void WriteTxn::flush_locked() const {
  if (pending_.empty()) return;  // another const call flushed it
  try {
    arena_->write_at(pending_offset_, pending_.data(), pending_.size());
  } catch (...) {
    // Staged records point at bytes that never landed: nothing staged can be committed.
    pending_.clear();
    has_pending_.store(false, std::memory_order_release);
    broken_ = true;
    throw;
  }
  pending_.clear();
  has_pending_.store(false, std::memory_order_release);
}

void WriteTxn::clear_staged() {
  records_.clear();
  index_.clear();
  meta_.clear();
  batch_size_.reset();
  keys_delta_ = bytes_delta_ = 0;
}

void WriteTxn::committed(uint64_t g) {
  clear_staged();
  allocator_->committed(g);
}

void WriteTxn::rolled_back(uint64_t next_generation, uint64_t committed_end) {
  undo_.reset();  // a group around the rollback has nothing left to undo
  {
    MutexLock lock(&pending_mu_);
    pending_.clear();
    has_pending_.store(false, std::memory_order_release);
  }
  clear_staged();
  append_hashes_.clear();
  allocator_->rolled_back(next_generation, committed_end);
}

}  // namespace tdstore::storage
