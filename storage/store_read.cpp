// Store: lookup by open addressing over two-version slots (the staged version first for the
// writer), entries, views and their pins, info().

#include <cstring>

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

uint64_t spec_fingerprint(const Entry& e, std::optional<uint64_t> offsets_hash) {
  // content_hash u64 | dtype u8 | ndim u8 | ragged u8 | shape int64 x ndim | offsets hash u64
  std::string b(reinterpret_cast<const char*>(&e.content_hash), 8);
  b.push_back(static_cast<char>(e.dtype));
  b.push_back(static_cast<char>(e.shape.size()));
  b.push_back(offsets_hash ? 1 : 0);
  b.append(reinterpret_cast<const char*>(e.shape.data()), e.shape.size() * 8);
  if (offsets_hash) b.append(reinterpret_cast<const char*>(&*offsets_hash), 8);
  return xxh3(b);
}

std::optional<uint64_t> key_fingerprint(const Store& store, std::string_view key,
                                        uint64_t* checksum) {
  auto e = store.find(key);
  if (!e) return std::nullopt;
  if (checksum) *checksum = e->content_hash;
  std::optional<uint64_t> offsets;
  if (e->flags & kSlotRagged)
    if (auto o = store.find(ragged_offsets_key(key))) offsets = o->content_hash;
  return spec_fingerprint(*e, offsets);
}

std::optional<SlotRecord> Store::resolve(uint64_t slot, bool with_staged, bool* damaged) const {
  if (with_staged && txn_)
    if (const SlotRecord* r = txn_->record(slot)) return *r;
  return snap_->resolve(slot, writable_ && process_id() == pid_, damaged);
}

std::vector<int64_t> Store::batch_size() const {
  if (txn_ && txn_->batch_size()) return *txn_->batch_size();
  return snap_->batch_size;
}

std::optional<uint64_t> Store::index_slot(uint64_t position) const {
  if (txn_)
    if (auto it = txn_->new_index_entries().find(position); it != txn_->new_index_entries().end())
      return it->second;
  return snap_->index_slot(position);
}

// Format 4 probes the key index: position p stands for the slot its entry names, or for an
// empty slot when it has none (entries only ever fill empty positions, and a slot an entry
// names that is empty at this generation was first written after it: its position was empty
// then too). The rules are otherwise those of format 3.
std::optional<std::pair<uint64_t, SlotRecord>> Store::probe(std::string_view key, uint64_t hash,
                                                            uint64_t* insert_slot,
                                                            uint64_t* insert_position) const {
  const uint64_t mask = snap_->header.slot_count - 1;
  std::optional<uint64_t> tomb;
  if (insert_position) *insert_position = UINT64_MAX;
  for (uint64_t i = 0; i <= mask; ++i) {
    uint64_t s = (hash + i) & mask;
    if (snap_->indexed) {
      auto named = index_slot(s);
      if (!named) {
        if (insert_slot) *insert_slot = tomb.value_or(UINT64_MAX);
        if (insert_position && !tomb) *insert_position = s;
        return std::nullopt;
      }
      s = *named;
    }
    auto r = resolve(s);
    if (!r) {
      if (insert_slot) *insert_slot = tomb.value_or(s);
      return std::nullopt;
    }
    bool same = r->key_hash == hash && record_key(*r) == key;
    if (r->state == static_cast<uint8_t>(SlotState::Live)) {
      if (same) return std::make_pair(s, *r);
    } else if (same) {  // the key's own tombstone: it comes back in the same slot
      if (insert_slot) *insert_slot = s;
      return std::nullopt;
    } else if (!tomb) {
      tomb = s;
    }
  }
  if (insert_slot) *insert_slot = tomb.value_or(UINT64_MAX);
  return std::nullopt;
}

std::optional<Entry> Store::find(std::string_view key) const {
  auto found = probe(key, xxh3(key), nullptr);
  if (!found) return std::nullopt;
  return entry_of(found->first, found->second);
}

// The entry a live slot version describes, after checking it against the arena.
Entry Store::entry_of(uint64_t slot, const SlotRecord& r) const {
  std::string_view key = record_key(r);
  if (!dtype_valid(r.dtype) || r.ndim > kMaxDims)
    corrupt("key " + in_quotes(key) + ": invalid dtype code or rank");
  Entry e;
  e.slot = slot;
  e.dtype = static_cast<DType>(r.dtype);
  e.shape.assign(r.shape, r.shape + r.ndim);
  e.offset = r.data_offset;
  e.nbytes = r.data_nbytes;
  e.content_hash = r.content_hash;
  e.capacity = r.data_capacity;
  e.flags = r.flags;
  // A staged version (an append stages a copy of the committed record) is no commit's yet.
  e.generation = txn_ && txn_->record(slot) ? 0 : r.generation;
  for (int64_t d : e.shape)
    if (d < 0) corrupt("key " + in_quotes(key) + ": negative dimension");
  const auto n = shape_bytes(e.shape.data(), e.shape.size(), dtype_size(e.dtype));
  const bool compressed = e.compressed();
  e.raw_nbytes = n.value_or(0);
  uint64_t end = txn_ ? txn_->allocator().tail() : snap_->header.arena_end;
  // Checked as differences: offset + nbytes may wrap past 2^64 in a crafted record. A compressed
  // key's blocks are checked where they are read (storage/compressed.h). An extent of no bytes
  // is never read, wherever it points (writers before this check placed some past arena_end).
  if (!n ||
      (compressed ? e.nbytes < kBlockTrailerBytes || !snap_->indexed ||
                        !row_layout(e.shape, dtype_size(e.dtype))
                  : *n != e.nbytes) ||
      e.capacity < e.nbytes ||
      (e.capacity && (e.offset < kArenaDataOffset || e.offset > end || end - e.offset < e.nbytes)))
    corrupt("key " + in_quotes(key) + ": extent [" + std::to_string(e.offset) + ", +" +
            std::to_string(e.nbytes) + ") does not fit shape " + shape_text({r.shape, r.ndim}) +
            " or the arena (" + std::to_string(end) + " bytes)");
  return e;
}

uint64_t Store::slot_limit() const {
  if (!snap_->indexed) return snap_->header.slot_count;
  return snap_->header.slots_used + (txn_ ? txn_->new_index_entries().size() : 0);
}

void Store::for_each(const std::function<void(std::string_view, const Entry&)>& fn) const {
  for (uint64_t s = 0; s < slot_limit(); ++s) {
    bool staged = txn_ && txn_->record(s);
    if (!staged && snap_->inline_record(s, 0).generation == 0 &&
        snap_->inline_record(s, 1).generation == 0)
      continue;
    auto r = resolve(s);
    if (!r || r->state != static_cast<uint8_t>(SlotState::Live)) continue;
    fn(record_key(*r), entry_of(s, *r));  // a key is live in one slot only
  }
}

Store::View Store::view(const Entry& e) const {
  flush_pending();
  if (e.capacity == 0) return {snap_->mapping->base() + kArenaDataOffset, snap_->mapping};
  if (e.offset > snap_->mapping->size() || snap_->mapping->size() - e.offset < e.nbytes)
    throw CapacityError(dir_.string() + ": extent ends at " + std::to_string(e.offset + e.nbytes) +
                        ", past this handle's arena_reserve " +
                        std::to_string(snap_->mapping->size()) +
                        "; reopen with a larger StoreOptions::arena_reserve");
  if (txn_) txn_->allocator().note_view(e.offset, e.nbytes);  // store_internal.h
  View v;
  v.data = snap_->mapping->base() + e.offset;
  if (extent_pins_)
    v.pin = extent_pins_->pin(e.offset, snap_->mapping);
  else if (current_pin_)
    v.pin = current_pin_;
  else
    v.pin = snap_->mapping;
  return v;
}

void Store::read_rows(std::string_view key, const Entry& e, uint64_t first, uint64_t count,
                      void* dst) const {
  const auto layout = row_layout(e.shape, dtype_size(e.dtype));
  if (!layout)  // [0, 2^62, 2^62]: no bytes, yet a row's bytes past 64 bits
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": shape " + shape_text(e.shape) +
                     " has rows of more than 2^64 bytes");
  if (first > layout->rows || layout->rows - first < count)
    throw IndexError(dir_.string() + ": key " + in_quotes(key) + ": rows [" +
                     std::to_string(first) + ", +" + std::to_string(count) + ") past its " +
                     std::to_string(layout->rows) + " rows");
  const View v = view(e);
  const auto* object = static_cast<const uint8_t*>(v.data);
  if (!e.compressed()) {
    if (count) std::memcpy(dst, object + first * layout->row_bytes, count * layout->row_bytes);
    return;
  }
  const std::string where = dir_.string() + ": key " + in_quotes(key);
  storage::read_rows(object, read_index(object, e.nbytes, *layout, where), first, count, dst,
                     where);
}

void Store::check_stored(std::string_view key, const Entry& e) const {
  if (!e.compressed()) return;
  const View v = view(e);
  read_index(static_cast<const uint8_t*>(v.data), e.nbytes,
             *row_layout(e.shape, dtype_size(e.dtype)),  // entry_of: a compressed key has one
             dir_.string() + ": key " + in_quotes(key));
}

StoreInfo Store::info() const {
  StoreInfo i;
  i.format_version = snap_->header.format_version;
  i.generation = snap_->header.generation;
  i.commit_time_ns = snap_->header.commit_time_ns;
  i.key_capacity = snap_->header.key_capacity;
  i.slot_count = snap_->header.slot_count;
  i.slots_used = snap_->indexed ? snap_->header.slots_used : 0;
  i.live_keys = snap_->header.live_keys;
  i.live_bytes = snap_->header.live_bytes;
  i.arena_end = snap_->header.arena_end;
  i.arena_file_size = arena_size();
  i.arena_reserve = snap_->mapping->size();
  i.alignment = snap_->header.alignment;
  i.batch_size = snap_->batch_size;
  return i;
}

// The mapping maps the arena file from offset 0, and a pointer into it is only ever one of its
// own: views keep the mapping they point into alive, so its range is never reused meanwhile.
std::optional<Store::FileBytes> Store::arena_bytes(const void* p, size_t n) const {
  if (!snap_->mapping || !arena_file_) return std::nullopt;
  const auto* b = static_cast<const uint8_t*>(p);
  const uint8_t* base = snap_->mapping->base();
  if (b < base || n > snap_->mapping->size() ||
      static_cast<uint64_t>(b - base) > snap_->mapping->size() - n)
    return std::nullopt;
  return FileBytes{arena_file_, static_cast<uint64_t>(b - base)};
}

}  // namespace tdstore::storage
