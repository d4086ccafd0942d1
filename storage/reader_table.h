// The reader table (docs/FORMAT.md, "Reader table"): readers.tdr, a small file every
// non-shared handle maps MAP_SHARED and registers in, like LMDB's lock.mdb. A slot holds the
// pid of a process, its start time (so a reused pid is not taken for the dead reader) and the
// oldest generation that handle may still read. A writer reuses an arena extent freed by the
// commit of generation F only when oldest() >= F, so no registered reader ever sees its bytes
// change.
//
// Protocol: a handle claims a slot (compare-and-swap of the pid from 0) with generation 0,
// "anything", before it reads the header, then lowers its protection to the generation it
// reads; it never raises a slot's generation above a generation it has stopped reading.
// Releasing stores generation 0, then pid 0. Slots of processes that no longer exist are
// cleared by whoever scans (LMDB's mdb_reader_check). All slot fields are accessed atomically
// through the shared mapping, so the table is safe across threads and processes.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

namespace tdstore::storage {

inline constexpr char kReaderTableFile[] = "readers.tdr";

class ReaderTable {
 public:
  static constexpr uint32_t kSlots = 255;  // after a 64-byte header; the file is 16 KiB
  struct Slot {
    uint64_t pid;         // 0: free
    uint64_t start_time;  // the process's start time (clock ticks after boot, /proc/<pid>/stat)
    uint64_t generation;  // oldest generation the handle may read; 0: any
    uint64_t reserved[5];
  };
  static_assert(sizeof(Slot) == 64);

  // Opens (creating when missing) dir/readers.tdr. Throws IOError naming the file; for a
  // `reader` on files it may not write (EACCES, EROFS) returns nullptr instead: such a reader
  // cannot register and reads under the shared-readonly rule (no writer commits meanwhile),
  // as its catalog does (MDB_NOLOCK).
  static std::shared_ptr<ReaderTable> open(const std::filesystem::path& dir, bool reader);
  ~ReaderTable();

  // Claims a free slot for this process at generation 0. Clears dead readers' slots when the
  // table is full; Error naming the file when every slot belongs to a live process.
  Slot* claim();
  void set_generation(Slot* slot, uint64_t generation);
  void release(Slot* slot);
  // The lowest generation any live registered handle may read (0 while one is registering),
  // or `current` when it is lower or no handle is registered. Clears dead readers' slots.
  // O(kSlots) plus one /proc read per occupied slot of another process.
  uint64_t oldest(uint64_t current);
  // Registered handles of other live processes (after clearing dead ones).
  uint32_t readers();
  const std::filesystem::path& path() const { return path_; }

 private:
  ReaderTable() = default;
  bool alive(uint64_t pid, uint64_t start_time) const;
  void clear_dead();
  Slot* slots() const;

  std::filesystem::path path_;
  uint8_t* map_ = nullptr;
  size_t size_ = 0;
};

// The generations one handle's views may still read, registered in one reader-table slot:
// the slot holds the oldest generation with a live Pin. Thread-safe: Pins die on any thread.
class ReaderPins : public std::enable_shared_from_this<ReaderPins> {
 public:
  // slot may be nullptr (shared_readonly and in-memory handles: nothing to publish).
  ReaderPins(std::shared_ptr<ReaderTable> table, ReaderTable::Slot* slot);
  ~ReaderPins();  // releases the slot

  // Keeps `generation` (and `keep`, typically the arena mapping) alive while the result is.
  std::shared_ptr<const void> pin(uint64_t generation, std::shared_ptr<const void> keep);
  // The oldest pinned generation, or UINT64_MAX when nothing is pinned.
  uint64_t oldest() const;

 private:
  struct Pin;
  void add(uint64_t generation);
  void remove(uint64_t generation);
  void publish();  // REQUIRES: mu_ held

  std::shared_ptr<ReaderTable> table_;
  ReaderTable::Slot* slot_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> counts_;  // generation -> live pins
};

}  // namespace tdstore::storage
