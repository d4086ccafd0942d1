// Store: lookup by open addressing over two-version slots (the staged version first for the
// writer), entries, views and their pins, info().
#include <sys/mman.h>
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

const SlotRecord& Store::inline_record(uint64_t slot, int version) const {
  return *reinterpret_cast<const SlotRecord*>(dir_map_ + slot_at(slot, version));
}

// The committed arena copy of an inline version that fails its checksum: the record at
// `offset` when it is valid, sane, has `self == offset` and a generation <= g.
std::optional<SlotRecord> Store::arena_copy(uint64_t offset, uint64_t g) const {
  const uint64_t end = header_.arena_end;
  if (offset < kArenaDataOffset || offset > end || end - offset < sizeof(SlotRecord))
    return std::nullopt;
  SlotRecord r;
  std::memcpy(&r, mapping_->base() + offset, sizeof r);
  if (!record_valid(r) || !record_sane(r) || r.self != offset || r.generation > g)
    return std::nullopt;
  return r;
}

std::optional<SlotRecord> Store::resolve(uint64_t slot, bool with_staged, bool* damaged) const {
  if (with_staged && txn_)
    if (const SlotRecord* r = txn_->record(slot)) return *r;
  const uint64_t g = header_.generation;
  // A writer may be rewriting either version while we read. Copy the pair twice until both
  // copies agree (a double collect): the two versions then coexisted at one instant, so the
  // newer is current and the older is its predecessor. Reading them at different times could
  // pair a version with a much newer one and skip the version in between.
  // The writer's own process is the only one writing the directory, and not while it reads.
  SlotRecord r[2], again[2];
  const uint8_t* at[2] = {dir_map_ + slot_at(slot, 0), dir_map_ + slot_at(slot, 1)};
  std::memcpy(&r[0], at[0], sizeof r[0]);
  std::memcpy(&r[1], at[1], sizeof r[1]);
  const bool alone = writable_ && process_id() == pid_;
  while (!alone) {
    std::memcpy(&again[0], at[0], sizeof again[0]);
    std::memcpy(&again[1], at[1], sizeof again[1]);
    if (std::memcmp(r, again, sizeof r) == 0) break;
    std::memcpy(r, again, sizeof r);
  }
  // An inline version that fails its checksum is either a commit in progress or interrupted
  // (it overwrites the older version, starting with its generation field, which is then newer
  // than any committed one), or damage. Committed versions were synced before the header that
  // committed them and are never torn, so a damaged one is restored from its arena copy (at
  // its `self`, or at the other version's `prev`) or reported, never taken as absent.
  bool valid[2] = {false, false}, restored[2] = {false, false};
  for (int v = 0; v < 2; ++v) {
    if (record_valid(r[v])) {
      if (!record_sane(r[v]))
        corrupt(fmt_slot(slot, v) + " has fields out of range (key_len, ndim or state)");
      valid[v] = true;
    }
  }
  for (int v = 0; v < 2; ++v) {
    if (valid[v] || record_zero(r[v])) continue;
    std::optional<SlotRecord> copy = arena_copy(r[v].self, g);
    const SlotRecord& other = r[1 - v];
    if (!copy && valid[1 - v] && other.prev != 0)
      if (auto c = arena_copy(other.prev, g); c && c->generation < other.generation) copy = c;
    if (copy) {
      r[v] = *copy;
      valid[v] = restored[v] = true;
    } else if (r[v].generation <= g) {
      corrupt(fmt_slot(slot, v) + " fails its checksum and claims committed generation " +
              std::to_string(r[v].generation) + "; no intact copy of it is left");
    }
  }
  int best = -1, newer = -1;
  for (int v = 0; v < 2; ++v) {
    if (!valid[v]) continue;
    if (r[v].generation <= g) {
      if (best < 0 || r[v].generation > r[best].generation) best = v;
    } else if (newer < 0 || r[v].generation < r[newer].generation) {
      newer = v;
    }
  }
  if (best >= 0) {
    if (damaged && restored[best]) *damaged = true;
    return r[best];
  }
  if (newer < 0) return std::nullopt;
  // Both inline versions are newer than this snapshot: walk the history kept in the arena.
  // Generations strictly decrease along prev, which bounds the walk.
  SlotRecord cur = r[newer];
  const uint64_t limit = arena_size();
  while (cur.prev != 0) {
    if (cur.prev < kArenaDataOffset || cur.prev > limit || limit - cur.prev < sizeof(SlotRecord))
      corrupt("slot " + std::to_string(slot) + " history points outside the arena");
    const uint64_t later = cur.generation;
    // Copies of versions newer than this generation may lie past a reader's mapping.
    if (cur.prev + sizeof cur <= mapping_->size())
      std::memcpy(&cur, mapping_->base() + cur.prev, sizeof cur);
    else
      arena_file_->read_at(cur.prev, &cur, sizeof cur);
    if (!record_valid(cur) || !record_sane(cur))
      corrupt("slot " + std::to_string(slot) + " history record fails its checksum");
    if (cur.generation >= later)
      corrupt("slot " + std::to_string(slot) + " history does not go back in generations");
    if (cur.generation <= g) return cur;
  }
  return std::nullopt;
}

// Entries are aligned 8-byte words that a commit changes only from 0 to their final value:
// one atomic load reads either.
uint64_t Store::load_index_entry(uint64_t position) const {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(dir_map_ + index_entry_offset(position)),
                         __ATOMIC_ACQUIRE);
}

std::optional<uint64_t> Store::index_slot(uint64_t position) const {
  if (txn_)
    if (auto it = txn_->new_index_entries().find(position); it != txn_->new_index_entries().end())
      return it->second;
  const uint64_t e = load_index_entry(position);
  if (e == 0) return std::nullopt;
  if (e > header_.slot_count)
    corrupt("key index position " + std::to_string(position) + " names slot " +
            std::to_string(e - 1) + ", past the " + std::to_string(header_.slot_count) + " slots");
  return e - 1;
}

// Format 4 probes the key index: position p stands for the slot its entry names, or for an
// empty slot when it has none (entries only ever fill empty positions, and a slot an entry
// names that is empty at this generation was first written after it: its position was empty
// then too). The rules are otherwise those of format 3.
std::optional<std::pair<uint64_t, SlotRecord>> Store::probe(std::string_view key, uint64_t hash,
                                                            uint64_t* insert_slot,
                                                            uint64_t* insert_position) const {
  const uint64_t mask = header_.slot_count - 1;
  std::optional<uint64_t> tomb;
  if (insert_position) *insert_position = UINT64_MAX;
  for (uint64_t i = 0; i <= mask; ++i) {
    uint64_t s = (hash + i) & mask;
    if (indexed_) {
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
  e.generation = r.generation;
  for (int64_t d : e.shape)
    if (d < 0) corrupt("key " + in_quotes(key) + ": negative dimension");
  const auto n = shape_bytes(e.shape.data(), e.shape.size(), dtype_size(e.dtype));
  uint64_t end = txn_ ? txn_->allocator().tail() : header_.arena_end;
  // Checked as differences: offset + nbytes may wrap past 2^64 in a crafted record.
  if (!n || *n != e.nbytes || e.capacity < e.nbytes || e.offset < kArenaDataOffset ||
      e.offset > end || end - e.offset < e.nbytes)
    corrupt("key " + in_quotes(key) + ": extent [" + std::to_string(e.offset) + ", +" +
            std::to_string(e.nbytes) + ") does not fit shape " + shape_text({r.shape, r.ndim}) +
            " or the arena (" + std::to_string(end) + " bytes)");
  return e;
}

uint64_t Store::slot_limit() const {
  if (!indexed_) return header_.slot_count;
  return header_.slots_used + (txn_ ? txn_->new_index_entries().size() : 0);
}

void Store::for_each(const std::function<void(std::string_view, const Entry&)>& fn) const {
  for (uint64_t s = 0; s < slot_limit(); ++s) {
    bool staged = txn_ && txn_->record(s);
    if (!staged && inline_record(s, 0).generation == 0 && inline_record(s, 1).generation == 0)
      continue;
    auto r = resolve(s);
    if (!r || r->state != static_cast<uint8_t>(SlotState::Live)) continue;
    fn(record_key(*r), entry_of(s, *r));  // a key is live in one slot only
  }
}

Store::View Store::view(const Entry& e) const {
  flush_pending();
  if (e.offset > mapping_->size() || mapping_->size() - e.offset < e.nbytes)
    throw CapacityError(dir_.string() + ": extent ends at " + std::to_string(e.offset + e.nbytes) +
                        ", past this handle's arena_reserve " + std::to_string(mapping_->size()) +
                        "; reopen with a larger StoreOptions::arena_reserve");
  if (txn_) txn_->allocator().note_view(e.offset, e.nbytes);  // store_internal.h
  View v;
  v.data = mapping_->base() + e.offset;
  if (extent_pins_)
    v.pin = extent_pins_->pin(e.offset, mapping_);
  else if (current_pin_)
    v.pin = current_pin_;
  else
    v.pin = mapping_;
  return v;
}

StoreInfo Store::info() const {
  StoreInfo i;
  i.format_version = header_.format_version;
  i.generation = header_.generation;
  i.commit_time_ns = header_.commit_time_ns;
  i.key_capacity = header_.key_capacity;
  i.slot_count = header_.slot_count;
  i.slots_used = indexed_ ? header_.slots_used : 0;
  i.live_keys = header_.live_keys;
  i.live_bytes = header_.live_bytes;
  i.arena_end = header_.arena_end;
  i.arena_file_size = arena_size();
  i.arena_reserve = mapping_->size();
  i.alignment = header_.alignment;
  i.batch_size = batch_size_;
  return i;
}

}  // namespace tdstore::storage
