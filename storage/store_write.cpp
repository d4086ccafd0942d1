// Store: the writes: put, append and erase checked against the snapshot and staged per slot in
// the writer's WriteTxn (their extents from its ArenaAllocator), groups and rollback.

#include <algorithm>
#include <cstring>
#include <vector>

#include "storage/checksum.h"
#include "storage/compressed.h"
#include "storage/directory.h"
#include "storage/messages.h"
#include "storage/process.h"
#include "storage/store.h"
#include "storage/store_internal.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace fs = std::filesystem;
namespace {

// A payload's bytes as compress_rows takes them: in memory, or read from its file with
// read_at, never through a mapping: a file cut short meanwhile is an IOError naming it, not a
// SIGBUS, nor zeros (which read_at reads past a file's end) stored as its rows. The bytes read
// are read again and compared, as land() compares a copy with its source: a read that met the
// file's end while another process rewrote it (truncated, then written again) read zeros, and
// by the size check the file may hold all its bytes again (CorruptionError naming `where`).
RowSource rows_of(const Payload& p, const std::string& where) {
  if (!p.file) return {static_cast<const uint8_t*>(p.data), {}};
  return {nullptr, [&p, where](uint64_t at, uint64_t n, void* dst) {
            p.file->read_at(p.file_offset + at, dst, n);
            constexpr uint64_t kPiece = 1 << 20;
            thread_local std::vector<uint8_t> again;  // a piece, kept by the thread
            again.resize(std::min(n, kPiece));
            for (uint64_t done = 0; done < n;) {
              const size_t k = static_cast<size_t>(std::min(n - done, kPiece));
              p.file->read_at(p.file_offset + at + done, again.data(), k);
              if (std::memcmp(static_cast<const uint8_t*>(dst) + done, again.data(), k) != 0)
                throw CorruptionError(where + ": the bytes read from " + p.file->path().string() +
                                      " at " + std::to_string(p.file_offset + at + done) +
                                      " read back different (did the file change while it was "
                                      "read?)");
              done += k;
            }
            if (p.file->size() < p.file_offset + at + n)
              throw IOError(p.file->path().string() + ": " + std::to_string(p.file->size()) +
                            " bytes, fewer than the " + std::to_string(p.file_offset + at) + " + " +
                            std::to_string(n) + " to store (cut short meanwhile?)");
          }};
}

}  // namespace

void Store::require_writable(std::string_view what) const {
  if (!writable_)
    throw ReadOnlyError(dir_.string() + ": " + std::string(what) +
                        " on a store opened ReadOnly; open it with OpenMode::ReadWrite");
  if (process_id() != pid_)
    throw ClosedError(
        dir_.string() + ": " + std::string(what) +
        " through a writer handle inherited across fork; open the store in the child");
  if (txn_->broken())
    throw IOError(dir_.string() + ": " + std::string(what) +
                  " refused: an earlier commit failed; reopen the store (the last committed "
                  "state is intact)");
}

void Store::stage(uint64_t slot, const SlotRecord& r, int64_t keys, int64_t bytes, bool keep_hash) {
  std::optional<uint64_t> committed_offset;
  if (txn_->record(slot))  // only a staged version's extent may be retired here
    if (auto c = resolve(slot, false);
        c && c->state == static_cast<uint8_t>(SlotState::Live) && c->data_capacity != 0)
      committed_offset = c->data_offset;
  txn_->stage(slot, r, committed_offset, keys, bytes, keep_hash);
}

void Store::land(uint64_t offset, const Payload& src, std::string_view key, Xxh3Stream& hash) {
  if (!src.file) {
    if (src.nbytes) arena_file_->write_at(offset, src.data, src.nbytes);
    hash.update(src.data, src.nbytes);
    return;
  }
  arena_file_->copy_from(*src.file, src.file_offset, offset, src.nbytes);
  // The copy made in the kernel, compared with its source: an import's exactness. The arena's
  // bytes, which the checksum covers, are read where they land, through the mapping (its pages
  // hold no private copies there: the allocator's `taken` discards them); the source's with
  // read_at, which a file cut short meanwhile cannot turn into a SIGBUS.
  constexpr uint64_t kPiece = 1 << 20;
  std::vector<uint8_t> source(std::min(src.nbytes, kPiece));
  for (uint64_t done = 0; done < src.nbytes;) {
    const size_t n = static_cast<size_t>(std::min(src.nbytes - done, kPiece));
    const uint8_t* landed = snap_->mapping->base() + offset + done;
    env_->advise(landed, n, Env::Advice::Populate);  // one call maps the piece in, not n / 4096
    src.file->read_at(src.file_offset + done, source.data(), n);
    if (std::memcmp(landed, source.data(), n) != 0)
      throw CorruptionError(dir_.string() + ": key " + in_quotes(key) + ": the bytes copied from " +
                            src.file->path().string() + " at " +
                            std::to_string(src.file_offset + done) +
                            " read back different (did the file change while it was copied?)");
    hash.update(landed, n);
    done += n;
  }
}

void Store::check_put(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                      uint8_t flags, uint64_t* shape_nbytes) const {
  const bool ragged = flags & kSlotRagged;
  std::string_view owner = ragged ? ragged_owner(key) : std::string_view();
  check_key(owner.empty() ? key : owner, dir_.string(), ragged);
  if (!dtype_valid(static_cast<uint8_t>(dtype)))
    throw DTypeError(dir_.string() + ": key " + in_quotes(key) + ": dtype code " +
                     std::to_string(static_cast<int>(dtype)) + " is not in the registry");
  if (shape.size() > kMaxDims)
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + " has " +
                     std::to_string(shape.size()) + " dims; at most " + std::to_string(kMaxDims));
  const auto& batch = txn_->batch_size() ? *txn_->batch_size() : snap_->batch_size;
  if (!ragged &&
      (shape.size() < batch.size() || !std::equal(batch.begin(), batch.end(), shape.begin())))
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": shape " + shape_text(shape) +
                     " does not start with batch size " + shape_text(batch));
  const auto expect = shape_bytes(shape.data(), shape.size(), dtype_size(dtype));
  if (!expect)
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": shape " + shape_text(shape) +
                     " has a negative dimension or a byte count past 64 bits");
  if (flags & kSlotCompressed) {
    if (!snap_->indexed)
      throw FormatError(dir_.string() + ": key " + in_quotes(key) +
                        ": a format-3 store holds no compressed keys; rewrite it in the current "
                        "format with `tdstore compact` first");
    if (!row_layout(shape, dtype_size(dtype)))
      throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": shape " + shape_text(shape) +
                       " has rows past 64 bits");
  }
  *shape_nbytes = *expect;
}

std::optional<uint8_t> Store::put(std::string_view key, DType dtype,
                                  const std::vector<int64_t>& shape, const Payload& payload,
                                  uint64_t capacity, uint8_t flags) {
  require_writable("put " + in_quotes(key));
  const void* const src = payload.data;
  const uint64_t nbytes = payload.nbytes;
  if (payload.file && (flags & kSlotCompressed))
    throw ArgumentError(dir_.string() + ": key " + in_quotes(key) +
                        ": a compressed key's bytes are put from memory, not from a file");
  uint64_t expect = 0;
  check_put(key, dtype, shape, flags, &expect);
  if (flags & kSlotCompressed)
    read_index(static_cast<const uint8_t*>(src), nbytes, *row_layout(shape, dtype_size(dtype)),
               dir_.string() + ": key " + in_quotes(key));
  else if (expect != nbytes)
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": " + std::to_string(nbytes) +
                     " bytes given, shape needs " + std::to_string(expect));
  capacity = std::max(capacity, nbytes);
  return place(key, dtype, shape, nbytes, capacity, flags, [&](uint64_t offset) -> uint64_t {
    if (payload.file) {
      flush_pending();
      Xxh3Stream landed;
      land(offset, payload, key, landed);
      return landed.digest();
    }
    if (nbytes && nbytes <= WriteTxn::kCombineMaxBytes && capacity == nbytes) {
      txn_->write_small(offset, src, nbytes);
    } else if (nbytes) {
      flush_pending();
      arena_file_->write_at(offset, src, nbytes);
    }
    return xxh3(src, nbytes);
  });
}

std::optional<uint8_t> Store::place(std::string_view key, DType dtype,
                                    const std::vector<int64_t>& shape, uint64_t nbytes,
                                    uint64_t capacity, uint8_t flags,
                                    const std::function<uint64_t(uint64_t)>& write) {
  uint64_t hash = xxh3(key);
  uint64_t slot = UINT64_MAX, position = UINT64_MAX;
  auto old = probe(key, hash, &slot, &position);
  if (old) slot = old->first;
  int64_t live = static_cast<int64_t>(snap_->header.live_keys) + txn_->keys_delta();
  if (!old && ((slot == UINT64_MAX && position == UINT64_MAX) ||
               live >= static_cast<int64_t>(snap_->header.key_capacity)))
    throw CapacityError(
        dir_.string() + ": key directory full (" + std::to_string(live) + " of " +
        std::to_string(snap_->header.key_capacity) + " keys) adding " + in_quotes(key) +
        "; rebuild it larger with `tdstore compact " + dir_.string() +
        " --key-capacity N` (tdstore::compact), or create the store with a larger key_capacity");

  capacity = std::max(capacity, nbytes);
  ArenaAllocator& allocator = txn_->allocator();
  const uint64_t saved_tail = allocator.tail();
  // An extent of no bytes takes no space: it points at the first byte tensors may use, which
  // every arena has (never past arena_end, FORMAT.md, "Slot versions").
  uint64_t offset = capacity ? txn_->allocate(capacity, snap_->header.alignment) : kArenaDataOffset;
  uint64_t content_hash = 0;
  try {
    content_hash = write(offset);
  } catch (...) {
    if (capacity)
      allocator.unallocate(offset, capacity, saved_tail);  // nothing committed was touched
    throw;
  }
  SlotRecord r{};
  r.data_offset = offset;
  r.data_nbytes = nbytes;
  r.data_capacity = capacity;
  r.content_hash = content_hash;
  r.state = static_cast<uint8_t>(SlotState::Live);
  r.flags = flags;
  r.dtype = static_cast<uint8_t>(dtype);
  r.ndim = static_cast<uint8_t>(shape.size());
  r.key_len = static_cast<uint16_t>(key.size());
  r.key_hash = hash;
  std::copy(shape.begin(), shape.end(), r.shape);
  std::memcpy(r.key, key.data(), key.size());
  if (slot == UINT64_MAX) {  // format 4, a new slot: the next in creation order
    slot = snap_->header.slots_used + txn_->new_index_entries().size();
    if (slot >= snap_->header.slot_count)
      corrupt("the key index has an empty position but every slot is in use");
    txn_->stage_index_entry(position, slot);
  }
  stage(slot, r, old ? 0 : 1,
        static_cast<int64_t>(nbytes) - (old ? static_cast<int64_t>(old->second.data_nbytes) : 0));
  if (flags & kSlotCompressed) compressed_staged_ = true;
  if (MutexLock lock(&index_mu_); !old && key_index_) {
    key_index_->emplace(key);
    companions_ += key.find('\0') != std::string_view::npos;
  }
  if (!old) return std::nullopt;
  return old->second.flags;
}

std::optional<uint8_t> Store::put_compressed(std::string_view key, DType dtype,
                                             const std::vector<int64_t>& shape,
                                             const Payload& payload, const Compression& c,
                                             uint64_t capacity, uint8_t flags) {
  const uint64_t nbytes = payload.nbytes;
  require_writable("put " + in_quotes(key));
  check_compression(c, dir_.string() + ": key " + in_quotes(key));
  flags |= kSlotCompressed;
  uint64_t expect = 0;
  check_put(key, dtype, shape, flags, &expect);  // before the work of compressing
  if (expect != nbytes)
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": " + std::to_string(nbytes) +
                     " bytes given for shape " + shape_text(shape));
  const std::string where = dir_.string() + ": key " + in_quotes(key);
  const EncodedRows stored =
      compress_rows(rows_of(payload, where), *row_layout(shape, dtype_size(dtype)), c, where);
  const uint64_t size = stored.size();
  uint64_t room = size;  // capacity at this tensor's ratio, rounded up
  if (capacity > nbytes && nbytes)
    room = static_cast<uint64_t>(static_cast<long double>(size) * capacity / nbytes) + 1;
  // The pieces land one after another, each where it belongs: never joined in memory.
  return place(key, dtype, shape, size, room, flags, [&](uint64_t offset) -> uint64_t {
    if (size <= WriteTxn::kCombineMaxBytes && room == size) {
      std::string joined;
      for (std::string_view p : stored.pieces()) joined += p;
      txn_->write_small(offset, joined.data(), joined.size());
      return xxh3(joined.data(), joined.size());
    }
    flush_pending();
    Xxh3Stream hash;
    for (std::string_view p : stored.pieces()) {
      land(offset, Payload{p.data(), p.size()}, key, hash);
      offset += p.size();
    }
    return hash.digest();
  });
}

void Store::append(std::string_view key, const std::vector<int64_t>& new_shape,
                   const Payload& payload, uint64_t min_capacity) {
  require_writable("append to " + in_quotes(key));
  uint64_t nbytes = payload.nbytes;
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
  EncodedRows tail;  // a compressed key's new blocks and index: what is appended to its bytes
  if (e->compressed()) {
    const auto layout = row_layout(e->shape, dtype_size(e->dtype));
    const std::string where = dir_.string() + ": key " + in_quotes(key);
    const auto* object = snap_->mapping->base() + e->offset;
    tail = append_rows(object, e->nbytes, read_index(object, e->nbytes, *layout, where),
                       rows_of(payload, where), static_cast<uint64_t>(new_shape[0] - e->shape[0]),
                       where);
    nbytes = tail.size();
    min_capacity = 0;  // in raw bytes; the stored bytes grow by the factor of 4 below
  }
  SlotRecord r = old;
  bool fresh = false;
  Xxh3Stream& running = txn_->running_hash(slot, &fresh);
  // First append of this key in the session: hash what is stored, once.
  if (fresh) running.update(snap_->mapping->base() + e->offset, e->nbytes);
  ArenaAllocator& allocator = txn_->allocator();
  const uint64_t saved_tail = allocator.tail();
  uint64_t moved_to = 0, moved_cap = 0;
  // A compressed key's tail is in memory, in pieces; a raw key's rows are where the caller
  // has them.
  auto land_rows = [&](uint64_t offset) {
    if (!e->compressed()) return land(offset, payload, key, running);
    for (std::string_view p : tail.pieces()) {
      land(offset, Payload{p.data(), p.size()}, key, running);
      offset += p.size();
    }
  };
  try {
    if (e->capacity - e->nbytes >= nbytes) {
      land_rows(e->offset + e->nbytes);
    } else {
      moved_cap = std::max({e->nbytes + nbytes, 4 * e->capacity, min_capacity});
      moved_to = txn_->allocate(moved_cap, snap_->header.alignment);
      if (e->nbytes) arena_file_->write_at(moved_to, snap_->mapping->base() + e->offset, e->nbytes);
      land_rows(moved_to + e->nbytes);
      r.data_offset = moved_to;
      r.data_capacity = moved_cap;
    }
  } catch (...) {
    if (moved_cap) allocator.unallocate(moved_to, moved_cap, saved_tail);
    txn_->forget_hash(slot);  // its state may already include rows that never landed
    throw;
  }
  r.data_nbytes = e->nbytes + nbytes;
  r.content_hash = running.digest();
  std::copy(new_shape.begin(), new_shape.end(), r.shape);
  stage(slot, r, 0, static_cast<int64_t>(nbytes), /*keep_hash=*/true);
  if (e->compressed()) compressed_staged_ = true;
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
  stage(old->first, r, -1, -static_cast<int64_t>(old->second.data_nbytes));
  if (MutexLock lock(&index_mu_); key_index_)
    if (auto it = key_index_->find(key); it != key_index_->end()) {
      key_index_->erase(it);
      companions_ -= key.find('\0') != std::string_view::npos;
    }
  return true;
}

void Store::set_batch_size(std::vector<int64_t> batch_size) {
  require_writable("set_batch_size");
  validate_batch(dir_, batch_size);
  txn_->stage_batch_size(std::move(batch_size));
}

bool Store::has_staged_changes() const { return txn_ && !txn_->empty(); }

void Store::begin_group() {
  require_writable("begin a write group");
  txn_->begin_group();
}

void Store::end_group() {
  if (txn_) txn_->end_group();
}

void Store::abort_group() {
  if (txn_ && txn_->abort_group()) reset_key_index();
}

void Store::rollback() {
  if (!txn_) return;  // a reader stages nothing
  txn_->rolled_back(snap_->header.generation + 1, snap_->header.arena_end);
  compressed_staged_ = false;
  reset_key_index();
}

}  // namespace tdstore::storage
