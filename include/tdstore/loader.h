// Loader: shuffled batches of a TensorDict for training loops.
//
//   tdstore::Loader loader(td, {.batch_size = 256, .seed = 1});
//   for (int64_t epoch = 0; epoch < 10; ++epoch) {
//     loader.set_epoch(epoch);
//     for (tdstore::TensorDict batch : loader) { ... }
//   }
//
// Rows are those of batch dim 0. Each epoch visits a permutation drawn from (seed, epoch)
// (identical in every process), or rows in order without shuffle; rank r of world_size takes
// the permutation's positions r, r + world_size, ..., so across ranks every row is seen exactly
// once per epoch (ranks may differ by one batch). Worker threads gather batches in parallel, up
// to `prefetch` ahead of the consumer; batches come out in order, so an epoch is reproducible
// whatever the thread timing. Batches are in-memory TensorDicts holding copies (gathered rows);
// the source's tensors are read zero-copy. A batch's memory is reused for a later batch only
// once every tensor and view over it is released (the loader keeps at most
// prefetch + num_workers + 2 released batches for that, and frees them when it is destroyed).
//
// Thread safety: one thread iterates a Loader. An epoch reads the source's tensors as they were
// at set_epoch(): keys set, erased or appended to and commits during the epoch change none of
// its batches and are seen from the next set_epoch(). Changing a key's tensor in place (add_(),
// copy_() into it) during an epoch races with the worker threads that read it. Storing row
// features writes into the source (LoaderOptions::serialize_writes says how those writes are
// kept apart from another thread's writes to it).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tdstore/dataset.h"
#include "tdstore/export.h"
#include "tdstore/loader_position.h"
#include "tdstore/tensordict.h"

namespace tdstore {

// How an epoch visits the rows (LoaderOptions::order). Every order visits each row exactly once
// per epoch, is the same in every process for (seed, epoch) and resumes from a position.
enum class LoaderOrder : uint8_t {
  // A permutation of all rows: each batch is a uniform sample. Reads pages at random, which is
  // what data larger than memory cannot afford: for such data (the loaded bytes exceed
  // memory_budget) readahead is turned off and each batch's rows are read at once, so an epoch
  // reads at about the disk's random-read rate.
  Random,
  // Rows in order (also what shuffle = false asks for).
  Sequential,
  // For data larger than memory (docs/DESIGN.md, "The loader"): rows cut into blocks of the
  // largest power of two of rows within block_bytes of the loaded keys (consecutive rows, at
  // least one, at most all), the blocks in a random
  // order, and the rows of each window of consecutive blocks of that order (half of
  // memory_budget, at least one block) shuffled together; batches are drawn from one window
  // (one at its end may span two). Each window's blocks are read ahead while the one before it
  // is consumed. Over data larger than memory_budget, with every loaded key dense, the windows
  // are copied into memory of the loader's own: two windows (about memory_budget), or as many
  // as one batch spans when a window holds fewer rows than a batch, plus up to two pages per
  // block of 256 KiB or more of a key (its area is aligned as its bytes are in the file) and
  // an 8 MiB buffer per reading thread for smaller blocks and blocks across two shards of a
  // Dataset; a store's bytes are
  // read past the page cache straight into that memory (File::read_once_into_pages), so an
  // epoch evicts nothing else from it. A rank takes a
  // deterministic share of every window (positions rank, rank + world_size, ... of the epoch's
  // order, as for Random). A compressed key's rows are decompressed into the windows on the
  // same threads, from only the compressed blocks holding each block's rows: once per epoch
  // each, where the key's compressed blocks hold at most a block's rows (both are powers of two
  // from row 0: a compressed block then lies in one block), else once per block it spans.
  QuasiRandom,
};

struct LoaderOptions {
  int64_t batch_size = 256;
  bool shuffle = true;  // false: Sequential, whatever `order` says
  LoaderOrder order = LoaderOrder::Random;
  int64_t block_bytes = int64_t{8} << 20;    // QuasiRandom: bytes of a block (> 0)
  int64_t memory_budget = int64_t{1} << 30;  // memory the order may keep busy (> 0)
  uint64_t seed = 0;
  bool drop_last = false;  // drop this rank's last batch when smaller than batch_size
  int64_t rank = 0;
  int64_t world_size = 1;
  int num_workers = 2;                // gathering threads; 0 gathers on the iterating thread
  int prefetch = 4;                   // batches gathered ahead of the consumer
  std::optional<c10::Device> device;  // move batches there (pinned host memory for CUDA)
  std::vector<std::string> keys;      // keys to load (default: all)
  // The loader writes into its source when it stores row features (at the end of an epoch, in
  // flush_features() and when destroyed, on the thread doing that): it runs those writes
  // through this function, which must call `write` once, serialized with every other write to
  // the source. A caller whose writes to the source hold a lock of its own passes a function
  // taking that lock around `write` (the Python binding does). Empty: `write` runs directly,
  // and the source must not be written by another thread meanwhile (tensordict.h).
  std::function<void(const std::function<void()>& write)> serialize_writes;
};

// A feature computed for the rows of each batch the first time a batch visits them, kept and
// stored beside the source so later epochs and runs read it (Loader::add_feature).
struct RowFeature {
  std::string key;                // stored under this key of the source
  std::vector<std::string> deps;  // source keys fn reads; changing them invalidates the feature
  std::function<at::Tensor(const TensorDict& rows)> fn;  // rows: the deps of some rows
  std::string version;
};

class TDSTORE_API Loader {
 public:
  // Over a dict's rows (batch dim 0). A sub-dict (td.sub("obs")) loads the keys under its
  // prefix, named relative to it. A batch holds each key under its name and, for a ragged key,
  // the rows padded plus "<key>.lengths": KeyError when a loaded key has that name too.
  // A compressed key (TensorDict::set with a Compression) is decompressed once, over the
  // cores, and kept until the Loader ends (its raw bytes) for epochs that read it whole (every
  // order within memory_budget, Random and Sequential past it, any epoch with a ragged key);
  // later epochs reuse it while the key's stored bytes are unchanged. A QuasiRandom epoch past
  // memory_budget decompresses window by window instead and keeps none of it.
  Loader(TensorDict source, LoaderOptions options = {});
  // Over a dataset's published rows (tdstore/dataset.h), with the same options and guarantees:
  // the permutation is over global rows, so the same rows in 1 shard or in 4 give the same
  // batches for a seed. set_epoch() takes the rows the Dataset handle sees (after its
  // refresh()). Ragged keys are padded per batch as over a TensorDict. Row features are
  // stored in the dataset's features store (docs/DESIGN.md, "Datasets"); their deps must be
  // dense keys of the published rows.
  Loader(Dataset source, LoaderOptions options = {});
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The permutation scheme: (seed, epoch) -> order. Changes with any change of the scheme, so
  // a position saved by an older scheme is refused instead of replaying other rows.
  static constexpr int64_t kOrderVersion = 1;
  // 4: QuasiRandom blocks of a power of two of rows (2: block_bytes / row bytes rows).
  static constexpr int64_t kQuasiRandomOrderVersion = 4;
  // LoaderOrder::Sequential with shuffle left true: rows in order (scheme 1 drew a permutation).
  static constexpr int64_t kSequentialOrderVersion = 3;

  // Reshuffles deterministically from (seed, epoch) and restarts at step 0. Takes the source's
  // row count (and, without LoaderOptions::keys, its keys) anew: rows appended and committed,
  // or made visible by refresh(), since the last epoch are handed out from this epoch on.
  // The epoch's batches read the source's tensors as they were then (a non-contiguous or
  // non-CPU key is made contiguous on the CPU once per epoch, not per batch): writes to the
  // source during an epoch are seen from the next set_epoch on.
  void set_epoch(int64_t epoch);
  // Batches per epoch for this rank.
  int64_t size() const;
  // Rows per epoch for this rank.
  int64_t rows() const;

  LoaderPosition position() const;
  // Continues from a saved position: the next iteration hands out the remaining batches of
  // that epoch, exactly those an uninterrupted run would have. Error naming the field when the
  // position was saved with another seed, batch_size, rank, world_size, shuffle, drop_last or
  // permutation scheme. A position inside an epoch planned over `rows` rows finishes that epoch
  // over the first `rows` rows when the source has grown since (rows appended later join at the
  // next set_epoch), and is refused when the source now has fewer rows. Over a Dataset, it
  // finishes the epoch over the shard rows named by `shards`, wherever later publishes have
  // moved their global numbers; Error naming the shard when one has fewer published rows now.
  void restore(const LoaderPosition& p);
  // Saves position() as attribute "loader/<name>" of `store` and commits it
  // (REQUIRES: a writable persistent dict).
  void save(TensorDict& store, const std::string& name) const;
  // Restores a position saved by save() (checked as restore() does); false when there is none.
  // CorruptionError naming the attribute when its value is not a saved position.
  bool load(const TensorDict& store, const std::string& name);

  // Adds a row-wise lazy feature. When the source already holds it, valid (same deps checksums
  // and version) and complete, batches read it; otherwise each batch computes it for its rows
  // not yet done, and the feature with its done-rows mask is written to the source (when
  // writable) at the end of every epoch and when the loader is destroyed, with provenance once
  // complete. Every set_epoch() checks the rows, the deps' fingerprints and the version again;
  // any change starts the feature over. Over a Dataset, the feature lives in <dir>/features
  // and a write merges the rows other loaders (other ranks) stored under the same provenance;
  // the write waits up to a minute for another loader's (LockError after), and throws the
  // store's Error when the dataset directory cannot be written. That writer lock coordinates
  // the loaders of one machine: loaders on several machines sharing a dataset over a network
  // file system must not compute the same feature at once (compute it first with one loader,
  // then every machine reads it complete). Returns whether
  // the feature was found complete. KeyError for a dep that is not a key. Error during an
  // epoch (after begin() and before its last batch is passed) and on a Loader over a sub-dict.
  bool add_feature(RowFeature feature);
  // Rows whose feature values are computed (stored or in this run).
  int64_t feature_rows_done(const std::string& key) const;
  // Writes the features computed so far to the source (see add_feature).
  void flush_features();

  class Iterator {
   public:
    TensorDict operator*() const;
    Iterator& operator++();
    bool operator!=(const Iterator& o) const { return step_ != o.step_; }

   private:
    friend class Loader;
    Iterator(Loader* l, int64_t step) : loader_(l), step_(step) {}
    Loader* loader_;
    int64_t step_;
  };
  Iterator begin();
  Iterator end();

  struct State;

 private:
  void store_features();  // flush_features' writes, run through serialize_writes

  std::unique_ptr<State> state_;
};

}  // namespace tdstore
