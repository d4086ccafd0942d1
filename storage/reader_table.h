// The reader table (docs/FORMAT.md, "Reader table"): readers.tdr, a file every process reading
// the store maps MAP_SHARED and registers in, like LMDB's lock.mdb. A slot names a process (its
// pid and start time in one atomic word, so a claim is never half done) and the oldest
// generation that process may still read through any handle or view of the store. A writer
// reuses an arena extent freed by the commit of generation F only when oldest() >= F, so no
// registered reader ever sees its bytes change.
//
// One slot per process and store: every read handle of the store in a process shares it
// (ReaderPins). A forked child inherits views, so it claims a slot of its own at the oldest
// generation its inherited pins read, in a pthread_atfork handler, before fork() returns in the
// child.
//
// Every process holding the file open holds a shared flock on it; a process that opens it and
// gets the lock exclusively (nobody else has it open: all earlier users exited, were killed, or
// the machine restarted) rebuilds it empty, so slots of dead processes never outlive them all.
// Slots of processes that died while others still have the file open are cleared by whoever
// scans (LMDB's mdb_reader_check).
//
// Thread safety: every member may be called from any thread; slots are read and written
// atomically through the shared mapping.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>

#include "storage/mutex.h"

namespace tdstore::storage {

inline constexpr char kReaderTableFile[] = "readers.tdr";

class ReaderPins;

class ReaderTable : public std::enable_shared_from_this<ReaderTable> {
 public:
  static constexpr uint32_t kSlots = 4096;  // after a 64-byte header: 262,208 bytes
  struct Slot {
    uint64_t owner;       // 0: free; pid | (low 32 bits of its start time) << 32
    uint64_t generation;  // oldest generation the process may read; 0: any
    uint64_t reserved[6];
  };
  static_assert(sizeof(Slot) == 64);

  // The table of dir/readers.tdr, opened (created when missing) once per process and shared.
  // Throws IOError naming the file; for a `reader` on files it may not write (EACCES, EROFS)
  // returns nullptr instead: such a reader cannot register and reads under the shared-readonly
  // rule (no writer commits meanwhile), as its catalog does (MDB_NOLOCK). CorruptionError when
  // the file is another version's and a process of that version has it open.
  static std::shared_ptr<ReaderTable> open(const std::filesystem::path& dir, bool reader);
  ~ReaderTable();

  // This process's registration, shared by its handles of the store; claims a slot (at
  // generation 0, "any") on first use. Error naming the file when every slot belongs to a
  // live process.
  std::shared_ptr<ReaderPins> pins();
  // The lowest generation any live registered process may read (0 while one is registering),
  // or `current` when it is lower or none is registered. Clears dead processes' slots.
  // O(kSlots) plus one /proc read per occupied slot of another process.
  uint64_t oldest(uint64_t current);
  // Processes other than this one registered in the table (after clearing dead ones).
  uint32_t readers();
  const std::filesystem::path& path() const { return path_; }

 private:
  friend class ReaderPins;
  friend struct ForkHandlers;
  ReaderTable() = default;
  Slot* claim(uint64_t generation);
  void release(Slot* slot);
  void clear_dead();
  Slot* slots() const;
  uint32_t bound() const;  // slots at or past it were never claimed since the table was built

  std::filesystem::path path_;
  int fd_ = -1;  // holds the shared flock while the table is open
  uint8_t* map_ = nullptr;
  size_t size_ = 0;
  Mutex mu_;
  std::weak_ptr<ReaderPins> pins_ GUARDED_BY(mu_);
};

// One process's registration in a table: the generations its handles and views may still
// read; the slot holds the oldest. Thread-safe: Pins die on any thread.
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
  friend struct ForkHandlers;
  struct Pin;
  void add(uint64_t generation);
  void remove(uint64_t generation);
  void publish() REQUIRES(mu_);

  std::shared_ptr<ReaderTable> table_;
  ReaderTable::Slot* slot_;
  mutable Mutex mu_;
  std::map<uint64_t, uint64_t> counts_ GUARDED_BY(mu_);  // generation -> live pins
};

}  // namespace tdstore::storage
