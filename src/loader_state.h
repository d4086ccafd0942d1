// What the Loader's files share (src/loader.cpp: epochs, positions and the worker pipeline;
// src/loader_gather.cpp: gathering batches and reading ahead; src/loader_features.cpp:
// row-wise lazy features): the state of a Loader and its columns. Internal to src/.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "src/batch_buffers.h"
#include "src/batch_pipeline.h"
#include "src/epoch_plan.h"
#include "src/loader_order.h"
#include "src/loader_windows.h"
#include "storage/records.h"
#include "storage/store.h"
#include "tdstore/dataset.h"
#include "tdstore/env.h"
#include "tdstore/loader.h"
#include "tdstore/tensordict.h"

namespace tdstore::detail {

// A key as the batches of an epoch read it: its rows split in parts (one part for a dict; a
// dataset's shards), each CPU contiguous. Global row r lies in the last part whose start is <= r.
// A ragged key's parts are its values, with each part's offsets (rows + 1) beside them. A dense
// part stored compressed may be taken packed (QuasiRandom epochs: packed[p] set), its rows then
// decompressed by the windows (src/loader_windows.h); parts[p] is then a stand-in of its shape
// and dtype on the meta device, which holds no data.
struct Column {
  std::string key;
  std::vector<at::Tensor> parts;
  std::vector<at::Tensor> offsets;  // empty: dense
  std::vector<int64_t> starts;      // global row of each part's first row
  // Where each part's bytes lie in its store's arena file, when known (arena_bytes).
  std::vector<std::optional<storage::Store::FileBytes>> files;
  std::vector<std::shared_ptr<const PackedPart>> packed;  // empty, or one per part
  bool ragged() const { return !offsets.empty(); }
  const PackedPart* packed_at(size_t p) const {
    return p < packed.size() ? packed[p].get() : nullptr;
  }
};

// Where a dense part read from `owner` lies in its arena file: nullopt for an in-memory dict
// or a tensor outside the store's mapping. Taken with the part, while `owner` is open.
std::optional<storage::Store::FileBytes> arena_bytes(const TensorDict& owner,
                                                     const at::Tensor& part);
Column one_part(std::string key, at::Tensor t);
// Dense key `key` of owner (a full key) as one part of rows [0, rows) (-1: all): packed when
// `pack` and the key is stored compressed (TensorDict::Impl::packed), else read with get().
void add_part(Column& c, const TensorDict& owner, const std::string& key, bool pack,
              int64_t rows = -1);
// A packed part's rows [0, rows) decompressed (its blocks split over the cores).
at::Tensor unpack(const PackedPart& p, int64_t rows);
// The part of c holding global row `row`.
size_t part_of(const Column& c, int64_t row);
// Rows `idx` (int64, CPU) of a dense column, one memcpy per row, into a new tensor: pinned
// when `pin`, otherwise from `buffers` when given.
at::Tensor gather_dense(const Column& c, const at::Tensor& idx, bool pin, BatchBuffers* buffers);
at::Tensor gather_rows(const at::Tensor& src, const at::Tensor& idx, bool pin,
                       BatchBuffers* buffers);
// Rows `idx` of a ragged column padded with zeros to the longest of them, and their lengths
// (as pad_ragged over the whole key: the same batch whatever the shard layout).
std::pair<at::Tensor, at::Tensor> gather_ragged(const Column& c, const at::Tensor& idx);
// Asks the kernel to read rows `idx` of a column now, all of them at once (one asynchronous
// read each), so that a gather over data larger than memory waits for one batch of reads
// rather than for one page fault after another.
void read_ahead_rows(const Column& c, const at::Tensor& idx);
// How long a Loader over a Dataset waits for the features store while another loader (another
// rank) writes it.
constexpr int64_t kFeatureLockWaitMs = 60'000;

// A batch holds a ragged key padded and, under this name after the key, each row's length.
constexpr const char* kLengthsSuffix = ".lengths";

at::Tensor cpu_contiguous(at::Tensor t);

}  // namespace tdstore::detail

namespace tdstore {

// The loader's files (and only they include this header) name these unqualified.
using detail::add_part;
using detail::arena_bytes;
using detail::Column;
using detail::cpu_contiguous;
using detail::gather_dense;
using detail::gather_ragged;
using detail::gather_rows;
using detail::kFeatureLockWaitMs;
using detail::kLengthsSuffix;
using detail::one_part;
using detail::part_of;
using detail::read_ahead_rows;

// The Loader's state, by lifetime: the epoch's plan (detail::EpochPlan, its base: made while no
// thread of the epoch runs, then read without a lock), the source and the columns the epoch
// reads (set with the plan, read alike), the row features (each under its own mutex), the
// windows of the read-ahead thread, and the epoch's threads with what they share
// (detail::BatchPipeline, one annotated mutex). The consumer's position (step, current,
// iterating) is the consumer thread's alone.
struct TDSTORE_HIDDEN Loader::State : detail::EpochPlan {
  TensorDict source;               // for a dataset: an empty stand-in of its batch dims
  std::optional<Dataset> dataset;  // set: the rows are the dataset's published rows
  LoaderOptions options;
  std::vector<std::string> keys;
  // What every batch of the epoch reads, fixed when the epoch is set (take_source).
  std::vector<detail::Column> columns;
  int64_t source_rows = 0;  // rows of the source when the epoch was set (features span these)
  int64_t start_step = 0;   // where the next begin() starts (restore)
  int64_t step = 0;         // batches handed out this epoch
  bool pin = false;
  // The memory of released batches, reused by the next ones (bounded in start()).
  detail::BatchBuffers buffers{0};

  // Row-wise features.
  struct Feature {
    RowFeature spec;
    bool stored = false;  // complete and valid in the source: read like any key
    // The rows computed, which the epoch's workers fill in: under mu.
    storage::Mutex mu;
    at::Tensor values GUARDED_BY(mu);  // [n, ...] once the first rows are computed
    at::Tensor done GUARDED_BY(mu);    // uint8 [n]
    int64_t done_rows GUARDED_BY(mu) = 0;
    bool dirty GUARDED_BY(mu) = false;  // a dataset's feature: rows computed since the last flush
    std::vector<detail::Column> deps;   // the inputs of fn (take_source)
    storage::RowFeatureRecord record;   // a dataset's feature: its provenance now
    int64_t rows = 0;                   // source rows it was built for
  };
  std::vector<std::unique_ptr<Feature>> features;
  // A feature's state for the current source rows: stored and valid, resumed from an earlier
  // run's progress, or nothing computed yet. `complete` tells the first case.
  std::unique_ptr<Feature> make_feature(RowFeature spec, bool* complete);
  std::unique_ptr<Feature> make_dataset_feature(RowFeature spec, bool* complete);
  void flush_dataset_features();
  std::optional<TensorDict>
      feature_store;  // a dataset's stored features (read handle), once they exist

  // The epoch's threads and what they share (src/batch_pipeline.h: one annotated mutex); the
  // consumer's side of the epoch (the batch handed out) belongs to the consumer's thread.
  detail::BatchPipeline<TensorDict> pipeline;
  std::vector<std::thread> workers;
  TensorDict current;
  bool iterating = false;  // begin() handed out a batch and the epoch's last is not yet past

  int64_t rows_for_rank() const { return EpochPlan::rows_for_rank(options); }
  int64_t batches() const { return EpochPlan::batches(options); }
  LoaderOrder order() const { return options.shuffle ? options.order : LoaderOrder::Sequential; }
  // The scheme a saved position names (Loader::k*OrderVersion): Sequential under shuffle = true
  // has its own, as scheme 1 drew a permutation for it.
  int64_t order_version() const {
    if (order() == LoaderOrder::QuasiRandom) return kQuasiRandomOrderVersion;
    if (order() == LoaderOrder::Sequential && options.shuffle) return kSequentialOrderVersion;
    return kOrderVersion;
  }
  // Bytes one row of the loaded keys takes (a ragged key: its mean).
  // Bytes a row of the loaded keys takes, averaged over the epoch's rows [0, n) (a ragged key's
  // rows differ): an epoch's plan depends only on the rows it covers.
  int64_t row_bytes() const;
  // Advises the kernel how the epoch reads the columns: Random order over data larger than
  // the memory budget without readahead, otherwise as usual.
  void advise_columns() const;
  // QuasiRandom: the window holding batch b's first row; the read-ahead thread's loop, which
  // asks the kernel to read window w's blocks once the consumer is in window w - 1 (from the
  // epoch's start: its first two windows), on a thread of its own (the advice allocates pages
  // and submits reads, which a gathering worker should not wait for). When the windows are
  // not held by the loader (`windowed` below: a ragged key) over a store larger than the
  // memory budget, it also releases the store's pages of the windows the consumer has left
  // (every batch starting in them has been taken, so every gather reading them is done), so
  // that resident pages stay within two windows and the kernel's reclaim never picks pages of
  // the window being read ahead: the old windows' pages were touched more recently.
  int64_t window_of(int64_t b) const { return EpochPlan::window_of(options, b); }
  int64_t last_window_of(int64_t b) const { return EpochPlan::last_window_of(options, b); }
  void read_ahead_loop(int64_t from);
  // Windowed: QuasiRandom over data larger than the budget, every column dense. The read-ahead
  // thread copies the windows into window_buffers (src/loader_windows.h) and gathers read
  // them there: window w is copied once the consumer is in window w - slots + 1 (every batch
  // reading the slot's previous window taken), and a batch is gathered once the windows it
  // reads are copied. slots: windows held at once, enough for the windows one batch spans
  // (two, unless a window holds fewer rows than a batch); the pipeline knows which are copied.
  bool windowed = false;
  int64_t slots = 2;
  detail::WindowBuffers window_buffers;
  void plan_windows(int64_t from);
  // Packed parts read whole (what an epoch without windows gathers from), each decompressed
  // over the cores, or taken from `unpacked` when the last epoch read the same stored bytes.
  // Only while no thread of the epoch runs.
  void unpack_columns();
  // The parts the last unpack_columns() decompressed, with the packed parts they came from.
  // Reused while exact: a part of the same committed stored bytes (the same commit, and the
  // same address in a mapping its pin keeps mapped, so no writer has reused that extent; staged
  // bytes are never reused, as a rollback lets them change) of as many rows. Holds the raw
  // bytes of those keys until the next unpack_columns(), an epoch read through windows, or the
  // loader's end.
  struct Unpacked {
    std::shared_ptr<const detail::PackedPart> from;
    at::Tensor rows;
  };
  std::vector<Unpacked> unpacked;
  bool any_packed() const;
  std::thread reader;  // the read-ahead thread of the epoch in progress (QuasiRandom)
  bool over_budget() const { return row_bytes() * n > options.memory_budget; }
  void advise_window(int64_t w, Env::Advice advice) const;  // each block's rows, every column
  void advise_block(int64_t block, Env::Advice advice) const;
  // The epoch's plan (EpochPlan::make), and the kernel advised how it reads the columns.
  void plan_epoch() {
    make(order(), options, order() == LoaderOrder::QuasiRandom ? row_bytes() : 0);
    advise_columns();
  }
  std::string where() const {
    if (dataset) return dataset->path().string();
    return source.is_persistent() ? source.path().string() : std::string("in-memory TensorDict");
  }
  void start_with(LoaderOptions o);  // checks the options, then the first epoch's plan
  void take_source();
  void take_keys();  // keys, columns and feature inputs of the source as it is now
  void take_dataset_keys();
  void drop_feature_keys();  // a feature's key and mask are not source keys to load
  // KeyError when a batch would hold one name twice: a key named like a ragged key's lengths.
  void check_batch_names() const;
  detail::Column dataset_column(const std::string& key) const;
  // What a feature computed now depends on: its deps' fingerprints and its version.
  storage::RowFeatureRecord provenance(const RowFeature& spec) const;
  bool stored_valid(const RowFeature& spec) const;  // a dict's: present with valid provenance
  std::unique_ptr<Feature> rebuild(RowFeature spec) {
    bool complete = false;
    return dataset ? make_dataset_feature(std::move(spec), &complete)
                   : make_feature(std::move(spec), &complete);
  }
  TensorDict gather(int64_t b);
  void compute_features(const at::Tensor& idx,
                        const std::function<void(std::string, at::Tensor)>& put);
  void start(int64_t from);
  void halt();
  TensorDict take(int64_t b);
};

}  // namespace tdstore
