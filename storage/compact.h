// Compaction: rewrite a store without the holes left by replaced and erased tensors and by
// slot history, and swap the result in atomically (docs/DESIGN.md, "Compaction").
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

#include "tdstore/options.h"

namespace tdstore::storage {

struct CompactResult {
  uint64_t keys = 0;
  uint64_t arena_before = 0;  // arena bytes in use before
  uint64_t arena_after = 0;
  uint64_t generation = 0;  // the compacted store's generation (the old one + 1)
};

// Takes the writer lock of `dir` (LockError when a writer is active), copies every live tensor,
// attribute, lazy provenance and cached graph into a new store beside it, and exchanges the two
// directories with renameat2(RENAME_EXCHANGE). A crash at any instant leaves either the old or
// the new store at `dir`, both complete. progress(done, total) is called as bytes are copied.
// Handles opened before the exchange keep reading the old files; reopen to see the new ones.
// Removes "<dir>.compact.<pid>" (and "<dir>.compact.<pid>.creating.<pid>") and
// "<dir>.creating.<pid>" siblings left by compactions and
// creations whose process no longer exists (a writer's open and compact() call it; the
// exchange is the only step that makes a sibling the store, so a dead one is garbage).
void remove_dead_siblings(const std::filesystem::path& dir);

// key_capacity > 0 rebuilds the key directory with that capacity (Error when below the live
// keys); every record field (flags, spare capacity) is carried through.
// compression: as CompactOptions::compression.
CompactResult compact(const std::filesystem::path& dir, const StoreOptions& options,
                      const std::function<void(uint64_t, uint64_t)>& progress = {},
                      int64_t key_capacity = 0,
                      const std::optional<Compression>& compression = std::nullopt);

}  // namespace tdstore::storage
