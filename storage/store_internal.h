// What the files implementing storage::Store share (store_*.cpp, space.cpp):
// small helpers. Invariants of the whole:
//  - Committed bytes a reader may see (arena extents and copies of versions visible at the
//    committed generation or at any registered reader's, the inline slot version visible at
//    the committed generation, the header copy holding it) are never written; other arena
//    bytes below arena_end are free space (storage/space.cpp).
//  - A commit writes only into pages that hold no live bytes of an earlier commit (the tail
//    starts on a fresh page, free space is handed out in whole pages), and a reader maps the
//    arena afresh when it moves, so a page it copied-on-write never hides newer bytes.
//  - Within a commit, an extent never shares a page with an extent already handed out
//    through view() (ArenaAllocator::note_view), for the same reason in the writer's own
//    process.
// Which file holds what: snapshot.cpp (the generation a handle reads: lookups of committed
// slot versions, the arena mapping), store_open.cpp (create, open, the header copies),
// store_recover.cpp (recovery of a torn commit), store_read.cpp (lookup, views, info),
// store_verify.cpp (digests and checks), store_write.cpp (put, append, erase and rollback, staged
// in the WriteTxn of write_txn.cpp, its extents from arena_allocator.cpp), store_catalog.cpp (the
// catalog's records), store_commit.cpp (commit, refresh, the key index).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "storage/catalog.h"
#include "storage/records.h"
#include "storage/store.h"
#include "tdstore/errors.h"

namespace tdstore::storage {

// DirHeader::catalog_digest as `snapshot` shows generation `gen` (store_verify.cpp).
uint64_t digest_at(const Catalog::Snapshot& snapshot, uint64_t gen);

inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// Throws ShapeError naming dir unless b is a batch size a store can hold.
inline void validate_batch(const std::filesystem::path& dir, const std::vector<int64_t>& b) {
  if (b.size() > kMaxBatchDims)
    throw ShapeError(dir.string() + ": batch size has " + std::to_string(b.size()) +
                     " dims; at most " + std::to_string(kMaxBatchDims) + " are supported");
  for (int64_t d : b)
    if (d < 0) throw ShapeError(dir.string() + ": negative batch dimension " + std::to_string(d));
}

}  // namespace tdstore::storage
