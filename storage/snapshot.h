// One committed generation of a store as a handle reads it: the header copy adopted, the key
// directory's shared read-only mapping, the arena's mapping, and the lookups of committed slot
// versions over them. The object is immutable once published: a handle that moves to another
// generation (open, refresh(), its own commit) publishes a new Snapshot, and a view keeps the
// mapping it points into. The files under the mappings do change as a writer commits newer
// generations; resolve() allows for that. The writer's staged versions are not here
// (storage/write_txn.h): the Store looks in its transaction first. Nor is the catalog's read
// transaction, which serves one thread at a time and is reopened in a forked child: the Store
// pins it when it adopts a header (Store::load_header).
//
// Thread safety: const, so any number of threads may read one Snapshot at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "storage/directory.h"
#include "storage/format.h"
#include "tdstore/env.h"

namespace tdstore::storage {

// A reserved address range with the arena file mapped over it (copy-on-write, private).
class Mapping {
 public:
  Mapping(Env& env, File& arena, uint64_t reserve);
  const uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }

 private:
  std::unique_ptr<Region> region_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
};

struct Snapshot {
  std::filesystem::path dir;                // the store, for messages
  std::shared_ptr<const Region> directory;  // keys.tdd, mapped shared and read-only
  const uint8_t* dir_map = nullptr;         // its bytes
  size_t dir_map_size = 0;                  // its size when mapped (the file never shrinks)
  DirHeader header{};                       // the header copy adopted
  int damaged_header = -1;                  // a header copy that failed its checksum
  bool indexed = false;                     // format 4: slots behind the key index
  SlotLayout layout;                        // where the slot versions lie in keys.tdd
  std::vector<int64_t> batch_size;          // header.batch_size as a vector
  std::shared_ptr<Mapping> mapping;         // the arena's reservation for this generation
  std::shared_ptr<File> arena;              // arena.tda, for history past the mapping

  // A store's snapshot before any file is mapped or header adopted.
  static Snapshot empty(std::filesystem::path dir) {
    Snapshot s;
    s.dir = std::move(dir);
    return s;
  }
  // The header's derived fields (indexed, layout, batch_size) set from `h`.
  void adopt(const DirHeader& h);

  uint64_t slot_at(uint64_t slot, int version) const { return layout.offset(slot, version); }
  const SlotRecord& inline_record(uint64_t slot, int version) const {
    return *reinterpret_cast<const SlotRecord*>(dir_map + slot_at(slot, version));
  }
  // Format 4: the entry at a key index position as committed (or being committed: entries go
  // from 0 to their final value in one aligned store), and the slot it names; nullopt when
  // empty, CorruptionError when it names a slot past slot_count.
  uint64_t load_index_entry(uint64_t position) const;
  std::optional<uint64_t> index_slot(uint64_t position) const;
  // The committed arena copy of an inline version that fails its checksum: the record at
  // `offset` when it is valid, sane, has `self == offset` and a generation <= g.
  std::optional<SlotRecord> arena_copy(uint64_t offset, uint64_t g) const;
  // The version of `slot` visible at this generation, nullopt when none is. A writer may be
  // rewriting either inline version meanwhile, unless `alone` (the writer's own process, which
  // never reads while it writes). Sets *damaged when the version had to be restored from its
  // arena copy. CorruptionError for damage no copy repairs.
  std::optional<SlotRecord> resolve(uint64_t slot, bool alone, bool* damaged = nullptr) const;
  std::string fmt_slot(uint64_t slot, int version) const;
  [[noreturn]] void corrupt(const std::string& what) const;  // CorruptionError naming keys.tdd
};

}  // namespace tdstore::storage
