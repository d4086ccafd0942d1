// Snapshot (snapshot.h): lookups of committed slot versions, and the arena mapping.
#include "storage/snapshot.h"

#include <cstring>
#include <string>

#include "storage/checksum.h"
#include "storage/records.h"
#include "tdstore/errors.h"

namespace tdstore::storage {

// The arena's address range: reserved once, the file mapped over all of it. Pages past end of
// file are never touched (every view lies inside committed or staged extents), so the file
// can grow underneath without remapping and views stay valid while the Mapping lives.
// PrivateReserve: in-place writes to a view are copy-on-write and never reach the file, and the
// (mostly untouched) range takes no commit charge.
Mapping::Mapping(Env& env, File& arena, uint64_t reserve) : size_(reserve) {
  try {
    region_ = env.map(arena, reserve, Env::MapMode::PrivateReserve);
  } catch (const IOError& e) {
    throw IOError(std::string(e.what()) +
                  " (arena_reserve); open with a smaller StoreOptions::arena_reserve");
  }
  base_ = region_->data();
}

void Snapshot::adopt(const DirHeader& h) {
  header = h;
  batch_size.assign(h.batch_size, h.batch_size + h.batch_ndim);
  indexed = h.format_version >= kIndexedFormatVersion;
  layout = slot_layout(h.format_version, h.slot_count);
}

// The committed arena copy of an inline version that fails its checksum: the record at
// `offset` when it is valid, sane, has `self == offset` and a generation <= g.
std::optional<SlotRecord> Snapshot::arena_copy(uint64_t offset, uint64_t g) const {
  const uint64_t end = header.arena_end;
  if (offset < kArenaDataOffset || offset > end || end - offset < sizeof(SlotRecord))
    return std::nullopt;
  SlotRecord r;
  std::memcpy(&r, mapping->base() + offset, sizeof r);
  if (!record_valid(r) || !record_sane(r) || r.self != offset || r.generation > g)
    return std::nullopt;
  return r;
}

std::optional<SlotRecord> Snapshot::resolve(uint64_t slot, bool alone, bool* damaged) const {
  const uint64_t g = header.generation;
  // A writer may be rewriting either version while we read. Copy the pair twice until both
  // copies agree (a double collect): the two versions then coexisted at one instant, so the
  // newer is current and the older is its predecessor. Reading them at different times could
  // pair a version with a much newer one and skip the version in between.
  // The writer's own process is the only one writing the directory, and not while it reads.
  SlotRecord r[2], again[2];
  const uint8_t* at[2] = {dir_map + slot_at(slot, 0), dir_map + slot_at(slot, 1)};
  std::memcpy(&r[0], at[0], sizeof r[0]);
  std::memcpy(&r[1], at[1], sizeof r[1]);
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
      // Damage only when the torn version claims a committed generation of this snapshot: a
      // newer one is a commit in progress (it may still name, by `self`, the version it
      // overwrites), which a reader that has fallen behind reads without loss.
      restored[v] = r[v].generation <= g;
      r[v] = *copy;
      valid[v] = true;
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
  const uint64_t limit = arena->size();
  while (cur.prev != 0) {
    if (cur.prev < kArenaDataOffset || cur.prev > limit || limit - cur.prev < sizeof(SlotRecord))
      corrupt("slot " + std::to_string(slot) + " history points outside the arena");
    const uint64_t later = cur.generation;
    // Copies of versions newer than this generation may lie past a reader's mapping.
    if (cur.prev + sizeof cur <= mapping->size())
      std::memcpy(&cur, mapping->base() + cur.prev, sizeof cur);
    else
      arena->read_at(cur.prev, &cur, sizeof cur);
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
uint64_t Snapshot::load_index_entry(uint64_t position) const {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(dir_map + index_entry_offset(position)),
                         __ATOMIC_ACQUIRE);
}

std::optional<uint64_t> Snapshot::index_slot(uint64_t position) const {
  const uint64_t e = load_index_entry(position);
  if (e == 0) return std::nullopt;
  if (e > header.slot_count)
    corrupt("key index position " + std::to_string(position) + " names slot " +
            std::to_string(e - 1) + ", past the " + std::to_string(header.slot_count) + " slots");
  return e - 1;
}

std::string Snapshot::fmt_slot(uint64_t slot, int version) const {
  return "slot " + std::to_string(slot) + " version " + std::to_string(version);
}

void Snapshot::corrupt(const std::string& what) const {
  throw CorruptionError((dir / kDirectoryFile).string() + ": " + what);
}

}  // namespace tdstore::storage
