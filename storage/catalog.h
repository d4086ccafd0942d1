// The LMDB catalog of a store (directory `catalog/`): small, structured, transactional data
// such as store attributes. Every value is versioned by store generation so that it commits
// atomically with the key directory (docs/FORMAT.md, "Catalog").
//
// LMDB rules kept here: one environment per path per process (a registry hands out the same
// Catalog); an environment is never used in a forked child (the child gets a new one);
// MDB_NOTLS, so read transactions may move between threads; the map grows on MDB_MAP_FULL.
#pragma once

#include <lmdb.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "storage/mutex.h"

namespace tdstore::storage {

// The value a catalog record (as LMDB stores it under `key`) holds at generation `gen`:
// nullopt when absent or deleted there. CorruptionError naming the key when the record is
// damaged (bad checksum, truncated). For the fuzz targets and the CLI.
std::optional<std::string> catalog_value_at(std::string_view key, std::string_view record,
                                            uint64_t gen);

// A data record's contribution to DirHeader::catalog_digest: xxh3 of u64 key length, key, value.
uint64_t content_digest(std::string_view key, std::string_view value);

class Catalog {
 public:
  // Opens (creating when `create`) the environment under `dir`. A created environment's files
  // hold their durable initial state when this returns (the caller syncs `dir` itself).
  // no_lock: read-only without LMDB's lock file (MDB_RDONLY | MDB_NOLOCK).
  static std::shared_ptr<Catalog> open(const std::filesystem::path& dir, bool writable,
                                       bool create = false, bool no_lock = false);
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  // A read transaction pinned until destroyed or renewed: a consistent LMDB snapshot.
  class Snapshot {
   public:
    ~Snapshot();
    void renew();
    // The newest version of `key` with generation <= gen; nullopt when absent or deleted.
    std::optional<std::string> get(std::string_view key, uint64_t gen) const;
    // Every key starting with prefix whose visible version at gen is present. A record that
    // cannot be decoded throws CorruptionError, or goes to `damaged` (key, reason) when given.
    void scan(std::string_view prefix, uint64_t gen,
              const std::function<void(std::string_view key, std::string_view value)>& fn,
              const std::function<void(std::string_view key, const std::string& why)>& damaged = {})
        const;

   private:
    friend class Catalog;
    Snapshot(std::shared_ptr<Catalog> owner, MDB_txn* txn) : owner_(std::move(owner)), txn_(txn) {}
    std::shared_ptr<Catalog> owner_;
    MDB_txn* txn_;
  };
  std::unique_ptr<Snapshot> snapshot();

  // Writes every change (nullopt = delete) as the version of generation `gen`, keeping the
  // version visible at gen - 1 beside it, in one durable LMDB transaction. gen == 0 writes
  // cache entries: a single version visible to every snapshot (a delete removes the entry).
  // Returns the change of the content digest (XOR of content_digest() over the present data
  // records visible at gen, cache entries excluded) that the write makes.
  uint64_t write(const std::map<std::string, std::optional<std::string>>& changes, uint64_t gen);
  // Drops every version newer than `committed` (left by a writer that crashed mid-commit).
  // Records that cannot be decoded throw CorruptionError, except cache records (keys starting
  // with cache_prefix), which are left for their readers to skip and their owners to delete.
  void recover(uint64_t committed, std::string_view cache_prefix);
  // Number of entries (all namespaces).
  uint64_t entries();
  // Bytes of the pages the records take (branch, leaf and overflow pages). O(1).
  uint64_t used_bytes();
  // Whether this process may write it (its files were writable when opened, with a lock file).
  bool writable() const { return writable_; }
  // The id of the last committed LMDB transaction (grows with every write; a catalog that was
  // deleted, truncated or replaced by an older copy has a smaller one).
  uint64_t last_txnid() const;

 private:
  Catalog() = default;
  MDB_txn* begin(unsigned flags);
  void grow() REQUIRES(mu_);  // no write transaction of this process is open
  friend class Snapshot;
  std::filesystem::path dir_;
  MDB_env* env_ = nullptr;
  int pid_ = 0;  // the process that opened env_: another (a forked child) never touches it
  MDB_dbi dbi_ = 0;
  bool writable_ = false;
  Mutex mu_;  // held by each write transaction (write, recover), one at a time
  std::weak_ptr<Catalog> self_;
};

}  // namespace tdstore::storage
