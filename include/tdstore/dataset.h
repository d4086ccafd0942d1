// Datasets larger than one writer: a directory of shard stores, each an ordinary persistent
// TensorDict written (appended and committed) by one writer, plus a manifest listing the rows
// of each shard published so far (docs/FORMAT.md, "Datasets"):
//
//   <dir>/manifest/         a store whose attribute "dataset" holds the manifest
//   <dir>/shards/<NNNNN>/   shard NNNNN (five digits or more), batch dim 0 = rows
//
// Writers never coordinate: each appends to its own shard and commits as it goes, so a writer
// killed midway leaves its shard at its last commit and resumes from there. publish() commits
// the manifest in one store commit: readers see every shard's rows as of the previous publish
// or the new one, never a partial shard, and never rows no publish named.
//
// Thread safety: a Dataset handle is used by one thread at a time, const calls included (they
// open shard readers lazily), unlike a TensorDict's. Separate handles of one dataset may be used
// on separate threads and in separate processes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tdstore/export.h"
#include "tdstore/options.h"
#include "tdstore/tensordict.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace tdstore {
namespace detail {
struct DatasetAccess;
}  // namespace detail

class TDSTORE_API Dataset {
 public:
  // Creates the dataset directory (a manifest with no shards), or opens it when it exists
  // (the row shape hint must then match). row_shape_hint: batch dims after the row dim that
  // every shard has ({} : shards of batch size [rows]). IOError when dir holds something else.
  static Dataset create(const std::filesystem::path& dir, std::vector<int64_t> row_shape_hint = {});
  // An existing dataset: read it, write shards, publish. FormatError when dir is not one. A
  // published shard that cannot be opened or fails its publish seal (a truncated keys.tdd, a
  // missing directory) does not fail open(): the handle still lists the manifest, writes
  // shards and publishes, and its first read of rows (index, keys' data, a Loader over it)
  // throws that shard's error, naming the shard. refresh() opens the shards again: it throws
  // that error while it persists and clears it once the shard opens.
  static Dataset open(const std::filesystem::path& dir);

  const std::filesystem::path& path() const;
  // The store of shard `shard` (>= 0), created on first use with batch size [0] + hint,
  // reopened for writing to resume; its rows are batch dim 0. LockError while another writer
  // holds it.
  TensorDict shard(int64_t shard, StoreOptions options = {});

  // Publishes every shard's committed rows in the manifest, atomically. Key sets, dtypes,
  // trailing shapes and raggedness must agree across shards and with what was published
  // before; a shard that disagrees is refused (KeyError, DTypeError or ShapeError naming the
  // shard, the key and both specs) and nothing is published. Shards with no rows yet are
  // listed with 0 rows. CorruptionError when a shard holds fewer rows than were published.
  // LockError while another process publishes. Then refresh()es this handle.
  void publish();

  int64_t rows() const;                     // published rows over all shards
  std::vector<int64_t> shard_rows() const;  // published rows per shard, in shard order
  // Keys of the published rows, sorted (empty before the first publish of any row).
  std::vector<std::string> keys() const;
  // Global rows (int64 [m], in [0, rows())) gathered across shards in the order given, as
  // one in-memory TensorDict of batch size [m] + hint. Global row r of shard s is row
  // r - (rows of shards before s) of that shard; no rows give every key with 0 rows.
  // ShapeError for a row out of range.
  TensorDict index(const at::Tensor& rows) const;
  // Sees the newest publish (and the shards it names).
  void refresh();

  // Closes the dataset for every handle on it: its manifest store and the shard stores it
  // reads are closed now (TensorDict::close); shard handles returned by shard() are separate
  // dicts and stay open. Every later call throws ClosedError, except close() and closed().
  void close();
  bool closed() const;  // never throws

  // A handle that refers to no dataset, as a moved-from one: every call but close() and
  // closed() throws ClosedError. (What a Python handle whose unpickling failed holds.)
  Dataset() = default;

  struct Impl;

 private:
  friend struct detail::DatasetAccess;
  explicit Dataset(std::shared_ptr<Impl> impl);
  detail::HandleState<std::shared_ptr<Impl>, detail::DatasetTag> impl_;
};

// Runs a caching job on every rank of a c10d process group (torch.distributed's; Gloo works
// over loopback or a network): each rank writes shard `rank` of `dataset` through
// job(shard, rank, world_size), which appends rows it computes and commits as it goes,
// resuming from the rows the shard already holds (shard.batch_size()[0]) so that a rerun after
// a crash loses and repeats nothing. Then a barrier, rank 0 publishes, a second barrier, and
// every rank refresh()es. Which rows a rank caches is the job's choice (by input file, by row
// range); it must be the same on every run. A rank that dies leaves its shard at its last
// commit; the others fail in the barrier (c10d's error, after the group's timeout at the
// latest) without publishing. Multi-machine: `dataset` on a file system every rank sees (each
// shard has one writer; readers follow docs/DESIGN.md, "Readers on shared file systems") and
// a c10d rendezvous (TCPStore, FileStore) the user provides.
TDSTORE_API void cache_in_parallel(
    Dataset& dataset, c10d::ProcessGroup& group,
    const std::function<void(TensorDict& shard, int64_t rank, int64_t world_size)>& job);
// The same protocol with the group's barrier given as a function that returns once every rank
// has called it (the Python tdstore.cache_in_parallel passes torch.distributed.barrier). The
// one implementation of the protocol; the overload above runs it.
TDSTORE_API void cache_in_parallel(
    Dataset& dataset, int64_t rank, int64_t world_size, const std::function<void()>& barrier,
    const std::function<void(TensorDict& shard, int64_t rank, int64_t world_size)>& job);

}  // namespace tdstore
