// Store: recovery of a torn commit when a writer opens the store (docs/DESIGN.md, "Commit
// protocol").
#include <string>

#include "storage/catalog.h"
#include "storage/checksum.h"
#include "storage/directory.h"
#include "storage/store.h"
#include "storage/store_internal.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore::storage {

// Undoes what a writer that died mid-commit left past the committed generation: slot
// versions newer than it (or torn), arena bytes past arena_end, catalog versions. A committed
// version that fails its checksum is rewritten from its intact arena copy (resolve() finds it)
// or the open fails with CorruptionError; then the directory must match the header (live keys,
// live bytes and, from format version 2, the digest of every slot), so that a lost slot is
// reported instead of silently inviting a second copy of its key.
void Store::recover() {
  const uint64_t g = snap_->header.generation;
  bool dirty = false;
  static const SlotRecord zero{};
  for (uint64_t s = 0; s < snap_->header.slot_count; ++s) {
    for (int v = 0; v < 2; ++v) {
      const SlotRecord& r = snap_->inline_record(s, v);
      if (record_zero(r)) continue;
      const bool valid = record_valid(r);
      if (valid && r.generation <= g) continue;
      if (valid || r.generation > g) {
        // Uncommitted (newer than g, whole or torn by a crash): zeroed, generation field last,
        // so that a concurrent reader sees a newer generation until the record is all zero.
        dir_file_->write_at(snap_->slot_at(s, v) + 8, reinterpret_cast<const char*>(&zero) + 8,
                            sizeof zero - 8);
        dir_file_->write_at(snap_->slot_at(s, v), &zero, 8);
        dirty = true;
        continue;
      }
      // Fails its checksum and claims a committed generation: restore it.
      SlotRecord pair[2] = {snap_->inline_record(s, 0), snap_->inline_record(s, 1)};
      std::optional<SlotRecord> copy = snap_->arena_copy(r.self, g);
      const SlotRecord& other = pair[1 - v];
      if (!copy && record_valid(other) && other.prev != 0)
        if (auto c = snap_->arena_copy(other.prev, g); c && c->generation < other.generation)
          copy = c;
      if (!copy)
        corrupt(snap_->fmt_slot(s, v) + " fails its checksum and claims committed generation " +
                std::to_string(r.generation) +
                "; no intact copy of it is left (tdstore verify lists the damage)");
      dir_file_->write_at(snap_->slot_at(s, v), &*copy, sizeof *copy);
      dirty = true;
    }
  }
  // Format 4: index entries naming a slot a commit in progress was handing out, at or past
  // slots_used (the slots' versions are zeroed above). An entry past slot_count is damage,
  // left for check_directory() to report.
  for (uint64_t p = 0; snap_->indexed && p < snap_->header.slot_count; ++p) {
    const uint64_t e = snap_->load_index_entry(p);
    if (e > snap_->header.slots_used && e <= snap_->header.slot_count) {
      const uint64_t zero_entry = 0;
      dir_file_->write_at(index_entry_offset(p), &zero_entry, sizeof zero_entry);
      dirty = true;
    }
  }
  if (dirty) dir_file_->sync();
  if (std::string why = check_directory(); !why.empty()) corrupt(why);
  if (arena_file_->size() > align_up(snap_->header.arena_end, kPageSize)) {
    arena_file_->truncate(align_up(snap_->header.arena_end, kPageSize));
    arena_file_->sync();
  }
  catalog_->recover(g, kCachePrefix);
  if (snap_->header.format_version >= 2 && catalog_content_digest() != snap_->header.catalog_digest)
    throw CorruptionError((dir_ / kCatalogDir).string() +
                          ": the catalog's records do not match generation " + std::to_string(g) +
                          "'s digest (records lost, altered or rolled back)");
}

}  // namespace tdstore::storage
