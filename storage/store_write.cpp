// Store: the write transaction: put, append and erase staged per slot (their extents from the
// writer's ArenaAllocator), the small-write buffer, groups and rollback.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "storage/catalog.h"
#include "storage/checksum.h"
#include "storage/compact.h"
#include "storage/directory.h"
#include "storage/durable_dirs.h"
#include "storage/graph_record.h"
#include "storage/messages.h"
#include "storage/process.h"
#include "storage/store.h"
#include "storage/store_internal.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace fs = std::filesystem;

void Store::require_writable(std::string_view what) const {
  if (!writable_)
    throw ReadOnlyError(dir_.string() + ": " + std::string(what) +
                        " on a store opened ReadOnly; open it with OpenMode::ReadWrite");
  if (process_id() != pid_)
    throw Error(dir_.string() + ": " + std::string(what) +
                " through a writer handle inherited across fork; open the store in the child");
  if (broken_)
    throw IOError(dir_.string() + ": " + std::string(what) +
                  " refused: an earlier commit failed; reopen the store (the last committed "
                  "state is intact)");
}

uint64_t Store::allocate(uint64_t nbytes, uint64_t align) {
  const uint64_t at = allocator_->allocate(nbytes, align ? align : header_.alignment);
  if (undo_) undo_->allocated.emplace_back(at, nbytes);
  return at;
}

void Store::supersede(uint64_t slot, const SlotRecord& replacement) {
  auto it = staged_->records.find(slot);
  if (it == staged_->records.end()) return;
  // A staged extent shared with the committed version is retired by commit(), not here.
  auto committed = resolve(slot, false);
  if (committed && committed->state == static_cast<uint8_t>(SlotState::Live) &&
      committed->data_offset == it->second.data_offset)
    return;
  retire(it->second, &replacement);
}

void Store::retire(const SlotRecord& old, const SlotRecord* replacement) {
  if (old.state != static_cast<uint8_t>(SlotState::Live) || old.data_capacity == 0) return;
  if (replacement && replacement->state == static_cast<uint8_t>(SlotState::Live) &&
      replacement->data_offset == old.data_offset)
    return;  // appended in place
  allocator_->retire(old.data_offset, old.data_capacity);
}

std::optional<uint8_t> Store::put(std::string_view key, DType dtype,
                                  const std::vector<int64_t>& shape, const void* src,
                                  uint64_t nbytes, uint64_t capacity, uint8_t flags) {
  require_writable("put " + in_quotes(key));
  const bool ragged = flags & kSlotRagged;
  std::string_view owner = ragged ? ragged_owner(key) : std::string_view();
  check_key(owner.empty() ? key : owner, dir_.string(), ragged);
  if (!dtype_valid(static_cast<uint8_t>(dtype)))
    throw DTypeError(dir_.string() + ": key " + in_quotes(key) + ": dtype code " +
                     std::to_string(static_cast<int>(dtype)) + " is not in the registry");
  if (shape.size() > kMaxDims)
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + " has " +
                     std::to_string(shape.size()) + " dims; at most " + std::to_string(kMaxDims));
  const auto& batch = staged_ && staged_->batch_size ? *staged_->batch_size : batch_size_;
  if (!ragged &&
      (shape.size() < batch.size() || !std::equal(batch.begin(), batch.end(), shape.begin())))
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": shape " + shape_text(shape) +
                     " does not start with batch size " + shape_text(batch));
  const auto expect = shape_bytes(shape.data(), shape.size(), dtype_size(dtype));
  if (!expect)
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": shape " + shape_text(shape) +
                     " has a negative dimension or a byte count past 64 bits");
  if (*expect != nbytes)
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": " + std::to_string(nbytes) +
                     " bytes given, shape needs " + std::to_string(*expect));

  uint64_t hash = xxh3(key);
  uint64_t slot = UINT64_MAX, position = UINT64_MAX;
  auto old = probe(key, hash, &slot, &position);
  if (old) slot = old->first;
  int64_t live = static_cast<int64_t>(header_.live_keys) + (staged_ ? staged_->keys_delta : 0);
  if (!old && ((slot == UINT64_MAX && position == UINT64_MAX) ||
               live >= static_cast<int64_t>(header_.key_capacity)))
    throw CapacityError(
        dir_.string() + ": key directory full (" + std::to_string(live) + " of " +
        std::to_string(header_.key_capacity) + " keys) adding " + in_quotes(key) +
        "; rebuild it larger with `tdstore compact " + dir_.string() +
        " --key-capacity N` (tdstore::compact), or create the store with a larger key_capacity");

  capacity = std::max(capacity, nbytes);
  const uint64_t saved_tail = allocator_->tail();
  uint64_t offset = capacity ? allocate(capacity) : align_up(saved_tail, header_.alignment);
  try {
    if (nbytes && nbytes <= kCombineMaxBytes && capacity == nbytes) {
      write_small(offset, src, nbytes);
    } else if (nbytes) {
      flush_pending();
      arena_file_->write_at(offset, src, nbytes);
    }
  } catch (...) {
    if (capacity)
      allocator_->unallocate(offset, capacity, saved_tail);  // nothing committed was touched
    throw;
  }
  SlotRecord r{};
  r.data_offset = offset;
  r.data_nbytes = nbytes;
  r.data_capacity = capacity;
  r.content_hash = xxh3(src, nbytes);
  r.state = static_cast<uint8_t>(SlotState::Live);
  r.flags = flags;
  r.dtype = static_cast<uint8_t>(dtype);
  r.ndim = static_cast<uint8_t>(shape.size());
  r.key_len = static_cast<uint16_t>(key.size());
  r.key_hash = hash;
  std::copy(shape.begin(), shape.end(), r.shape);
  std::memcpy(r.key, key.data(), key.size());
  if (!staged_) staged_ = std::make_unique<Staged>();
  if (slot == UINT64_MAX) {  // format 4, a new slot: the next in creation order
    slot = header_.slots_used + staged_->index.size();
    if (slot >= header_.slot_count)
      corrupt("the key index has an empty position but every slot is in use");
    staged_->index[position] = slot;
    if (undo_) undo_->positions.push_back(position);
  }
  remember_slot(slot);
  supersede(slot, r);
  staged_->records[slot] = r;
  append_hashes_.erase(slot);
  if (MutexLock lock(&index_mu_); !old && key_index_) {
    key_index_->emplace(key);
    companions_ += key.find('\0') != std::string_view::npos;
  }
  staged_->keys_delta += old ? 0 : 1;
  staged_->bytes_delta +=
      static_cast<int64_t>(nbytes) - (old ? static_cast<int64_t>(old->second.data_nbytes) : 0);
  if (!old) return std::nullopt;
  return old->second.flags;
}

void Store::write_small(uint64_t offset, const void* src, uint64_t nbytes) {
  MutexLock lock(&pending_mu_);  // uncontended: const calls flushing it are not concurrent here
  const uint64_t end = pending_offset_ + pending_.size();
  if (!pending_.empty() && (offset < end || offset - end >= header_.alignment ||
                            pending_.size() + (offset - end) + nbytes > kCombineBufferBytes))
    flush_pending_locked();
  if (pending_.empty()) pending_offset_ = offset;
  pending_.append(offset - (pending_offset_ + pending_.size()), '\0');
  pending_.append(static_cast<const char*>(src), nbytes);
  has_pending_.store(true, std::memory_order_release);
}

void Store::flush_pending() const {
  if (!has_pending_.load(std::memory_order_acquire)) return;
  MutexLock lock(&pending_mu_);
  flush_pending_locked();
}

void Store::flush_pending_locked() const {
  if (pending_.empty()) return;  // another const call flushed it
  try {
    arena_file_->write_at(pending_offset_, pending_.data(), pending_.size());
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

void Store::append(std::string_view key, const std::vector<int64_t>& new_shape, const void* src,
                   uint64_t nbytes, uint64_t min_capacity) {
  require_writable("append to " + in_quotes(key));
  flush_pending();  // the stored bytes are read through the mapping, and written next to
  uint64_t hash = xxh3(key);
  auto found = probe(key, hash, nullptr);
  if (!found)
    throw KeyError(dir_.string() + ": cannot append to key " + in_quotes(key) + ": not found");
  auto [slot, old] = *found;
  auto e = find(key);
  uint64_t row_elems = 1;
  for (size_t d = 1; d < e->shape.size(); ++d) row_elems *= static_cast<uint64_t>(e->shape[d]);
  uint64_t row_bytes = row_elems * dtype_size(e->dtype);
  bool same_rows = e->shape.size() == new_shape.size() && !new_shape.empty() &&
                   std::equal(e->shape.begin() + 1, e->shape.end(), new_shape.begin() + 1) &&
                   new_shape[0] >= e->shape[0] &&
                   shape_bytes(new_shape.data(), new_shape.size(), dtype_size(e->dtype)) &&
                   static_cast<uint64_t>(new_shape[0] - e->shape[0]) * row_bytes == nbytes;
  if (!same_rows)
    throw ShapeError(dir_.string() + ": cannot append to key " + in_quotes(key) + " of shape " +
                     shape_text(e->shape) + ": rows of shape " + shape_text(new_shape) + " and " +
                     std::to_string(nbytes) + " bytes do not extend dim 0");
  SlotRecord r = old;
  auto& running = append_hashes_[slot];
  if (!running) {  // first append of this key in the session: hash what is stored, once
    running = std::make_unique<Xxh3Stream>();
    running->update(mapping_->base() + e->offset, e->nbytes);
  }
  const uint64_t saved_tail = allocator_->tail();
  uint64_t moved_to = 0, moved_cap = 0;
  try {
    if (e->capacity - e->nbytes >= nbytes) {
      if (nbytes) arena_file_->write_at(e->offset + e->nbytes, src, nbytes);
    } else {
      moved_cap = std::max({e->nbytes + nbytes, 4 * e->capacity, min_capacity});
      moved_to = allocate(moved_cap);
      if (e->nbytes) arena_file_->write_at(moved_to, mapping_->base() + e->offset, e->nbytes);
      if (nbytes) arena_file_->write_at(moved_to + e->nbytes, src, nbytes);
      r.data_offset = moved_to;
      r.data_capacity = moved_cap;
    }
  } catch (...) {
    if (moved_cap) allocator_->unallocate(moved_to, moved_cap, saved_tail);
    append_hashes_.erase(slot);  // its state may already include rows that never landed
    throw;
  }
  running->update(src, nbytes);
  r.data_nbytes = e->nbytes + nbytes;
  r.content_hash = running->digest();
  std::copy(new_shape.begin(), new_shape.end(), r.shape);
  if (!staged_) staged_ = std::make_unique<Staged>();
  remember_slot(slot);
  supersede(slot, r);
  staged_->records[slot] = r;
  staged_->bytes_delta += static_cast<int64_t>(nbytes);
}

bool Store::erase(std::string_view key) {
  require_writable("erase " + in_quotes(key));
  uint64_t hash = xxh3(key);
  auto old = probe(key, hash, nullptr);
  if (!old) return false;
  SlotRecord r = old->second;
  r.state = static_cast<uint8_t>(SlotState::Erased);
  r.flags = 0;
  r.data_offset = r.data_nbytes = r.data_capacity = r.content_hash = 0;
  r.ndim = 0;
  r.dtype = static_cast<uint8_t>(DType::UInt8);
  std::fill(std::begin(r.shape), std::end(r.shape), 0);
  if (!staged_) staged_ = std::make_unique<Staged>();
  remember_slot(old->first);
  supersede(old->first, r);
  staged_->records[old->first] = r;
  append_hashes_.erase(old->first);
  if (MutexLock lock(&index_mu_); key_index_)
    if (auto it = key_index_->find(key); it != key_index_->end()) {
      key_index_->erase(it);
      companions_ -= key.find('\0') != std::string_view::npos;
    }
  staged_->keys_delta -= 1;
  staged_->bytes_delta -= static_cast<int64_t>(old->second.data_nbytes);
  return true;
}

void Store::set_batch_size(std::vector<int64_t> batch_size) {
  require_writable("set_batch_size");
  validate_batch(dir_, batch_size);
  if (!staged_) staged_ = std::make_unique<Staged>();
  if (undo_ && !undo_->batch_size) undo_->batch_size = staged_->batch_size;
  staged_->batch_size = std::move(batch_size);
}

// The catalog snapshot reads go through. A handle used in a forked child must not touch the
// parent's LMDB environment: the child opens its own and pins a new snapshot (versions are
// filtered by this handle's generation, so it reads the same values unless the writer has
// replaced a value twice since).

bool Store::has_staged_changes() const { return staged_ && !staged_->empty(); }

void Store::begin_group() {
  require_writable("begin a write group");
  if (undo_) {
    ++undo_->depth;
    return;
  }
  undo_ = std::make_unique<Undo>();
  undo_->depth = 1;
  undo_->had_staged = staged_ != nullptr;
  undo_->keys_delta = staged_ ? staged_->keys_delta : 0;
  undo_->bytes_delta = staged_ ? staged_->bytes_delta : 0;
  undo_->retired = allocator_->retired_count();
}

void Store::end_group() {
  if (undo_ && --undo_->depth == 0) undo_.reset();
}

void Store::remember_slot(uint64_t slot) {
  if (!undo_ || undo_->records.count(slot)) return;
  std::optional<SlotRecord> before;
  if (staged_)
    if (auto it = staged_->records.find(slot); it != staged_->records.end()) before = it->second;
  undo_->records.emplace(slot, before);
}

void Store::remember_meta(const std::string& key) {
  if (!undo_ || undo_->meta.count(key)) return;
  std::optional<std::optional<std::string>> before;
  if (staged_)
    if (auto it = staged_->meta.find(key); it != staged_->meta.end()) before = it->second;
  undo_->meta.emplace(key, before);
}

void Store::abort_group() {
  if (!undo_ || --undo_->depth > 0) return;  // an inner group: the outermost one undoes
  Undo u = std::move(*undo_);
  undo_.reset();
  if (staged_) {
    for (auto& [slot, before] : u.records) {
      if (before)
        staged_->records[slot] = *before;
      else
        staged_->records.erase(slot);
      append_hashes_.erase(slot);  // its running hash may hold the group's rows
    }
    for (uint64_t p : u.positions) staged_->index.erase(p);
    for (auto& [key, before] : u.meta) {
      if (before)
        staged_->meta[key] = *before;
      else
        staged_->meta.erase(key);
    }
    if (u.batch_size) staged_->batch_size = *u.batch_size;
    staged_->keys_delta = u.keys_delta;
    staged_->bytes_delta = u.bytes_delta;
    if (!u.had_staged && staged_->empty()) staged_.reset();
  }
  reset_key_index();
  // The records the group replaced are staged again: what it retired is not free. What it
  // allocated is unreferenced: free after the next commit, like a replaced staged extent (a
  // view of it, taken inside the group, keeps it pinned meanwhile).
  allocator_->abort_group(u.retired, u.allocated);
}

void Store::rollback() {
  undo_.reset();  // a group around it has nothing left to undo
  {
    MutexLock lock(&pending_mu_);
    pending_.clear();
    has_pending_.store(false, std::memory_order_release);
  }
  staged_.reset();
  reset_key_index();
  append_hashes_.clear();
  allocator_->rolled_back(header_.generation + 1, header_.arena_end);
}

}  // namespace tdstore::storage
