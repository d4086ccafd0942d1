// Loader: permutation per (seed, epoch), rank sharding, worker threads gathering rows with
// memcpy into fresh batches, in-order delivery, row-wise lazy features.
#include "tdstore/loader.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randperm.h>
#include <ATen/ops/zeros.h>
#include <cxxabi.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "src/batch_buffers.h"
#include "src/dataset_impl.h"
#include "src/lazy_internal.h"
#include "src/loader_order.h"
#include "src/loader_windows.h"
#include "src/tensordict_impl.h"
#include "storage/records.h"
#include "tdstore/env.h"

namespace tdstore {
namespace {

using json = nlohmann::json;

// Mixed into the quasi-random order's seed, so it is not a function of Random's stream.
constexpr uint64_t kQuasiRandomSalt = 0x5155415349524e44ull;  // "QUASIRND"

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A key as the batches of an epoch read it: its rows split in parts (one part for a dict; a
// dataset's shards), each CPU contiguous. Global row r lies in the last part whose start is <= r.
// A ragged key's parts are its values, with each part's offsets (rows + 1) beside them.
struct Column {
  std::string key;
  std::vector<at::Tensor> parts;
  std::vector<at::Tensor> offsets;  // empty: dense
  std::vector<int64_t> starts;      // global row of each part's first row
  // Where each part's bytes lie in its store's arena file, when known (arena_bytes).
  std::vector<std::optional<storage::Store::FileBytes>> files;
  bool ragged() const { return !offsets.empty(); }
};

// Where a dense part read from `owner` lies in its arena file: nullopt for an in-memory dict
// or a tensor outside the store's mapping. Taken with the part, while `owner` is open.
std::optional<storage::Store::FileBytes> arena_bytes(const TensorDict& owner,
                                                     const at::Tensor& part) {
  const storage::Store* store = detail::Access::impl(owner).store.get();
  if (!store) return std::nullopt;
  return store->arena_bytes(part.data_ptr(),
                            static_cast<size_t>(part.numel()) * part.element_size());
}

Column one_part(std::string key, at::Tensor t) {
  return Column{std::move(key), {std::move(t)}, {}, {0}, {}};
}

size_t part_of(const Column& c, int64_t row) {
  if (c.starts.size() == 1) return 0;
  return static_cast<size_t>(std::upper_bound(c.starts.begin(), c.starts.end(), row) -
                             c.starts.begin()) -
         1;
}

// Rows `idx` (int64, CPU) of a dense column, one memcpy per row, into a new tensor: pinned
// when `pin`, otherwise from `buffers` when given.
at::Tensor gather_dense(const Column& c, const at::Tensor& idx, bool pin,
                        detail::BatchBuffers* buffers) {
  const at::Tensor& first = c.parts[0];
  std::vector<int64_t> shape(first.sizes().begin(), first.sizes().end());
  shape[0] = idx.numel();
  at::Tensor out =
      !pin && buffers
          ? buffers->empty(shape, first.scalar_type())
          : at::empty(shape, at::TensorOptions().dtype(first.scalar_type()).pinned_memory(pin));
  const size_t row =
      static_cast<size_t>(out.numel() / std::max<int64_t>(idx.numel(), 1)) * out.element_size();
  auto* to = static_cast<uint8_t*>(out.data_ptr());
  const int64_t* ix = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const size_t p = part_of(c, ix[i]);
    const auto* from = static_cast<const uint8_t*>(c.parts[p].data_ptr());
    std::memcpy(to + static_cast<size_t>(i) * row,
                from + static_cast<size_t>(ix[i] - c.starts[p]) * row, row);
  }
  return out;
}

at::Tensor gather_rows(const at::Tensor& src, const at::Tensor& idx, bool pin,
                       detail::BatchBuffers* buffers) {
  return gather_dense(one_part({}, src), idx, pin, buffers);
}

// Rows `idx` of a ragged column padded with zeros to the longest of them, and their lengths
// (as pad_ragged over the whole key: the same batch whatever the shard layout).
std::pair<at::Tensor, at::Tensor> gather_ragged(const Column& c, const at::Tensor& idx) {
  const int64_t* ix = idx.data_ptr<int64_t>();
  std::vector<size_t> part(static_cast<size_t>(idx.numel()));
  at::Tensor lengths = at::empty({idx.numel()}, at::kLong);
  int64_t* len = lengths.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t i = 0; i < idx.numel(); ++i) {
    part[i] = part_of(c, ix[i]);
    const int64_t* off = c.offsets[part[i]].data_ptr<int64_t>();
    const int64_t r = ix[i] - c.starts[part[i]];
    len[i] = off[r + 1] - off[r];
    longest = std::max(longest, len[i]);
  }
  const at::Tensor& first = c.parts[0];
  std::vector<int64_t> shape{idx.numel(), longest};
  shape.insert(shape.end(), first.sizes().begin() + 1, first.sizes().end());
  at::Tensor padded = at::zeros(shape, first.scalar_type());
  int64_t per_item = 1;
  for (size_t d = 2; d < shape.size(); ++d) per_item *= shape[d];
  const size_t item = static_cast<size_t>(per_item) * padded.element_size();
  auto* dst = static_cast<uint8_t*>(padded.data_ptr());
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const int64_t* off = c.offsets[part[i]].data_ptr<int64_t>();
    const auto* src = static_cast<const uint8_t*>(c.parts[part[i]].data_ptr());
    std::memcpy(dst + static_cast<size_t>(i * longest) * item,
                src + static_cast<size_t>(off[ix[i] - c.starts[part[i]]]) * item,
                static_cast<size_t>(len[i]) * item);
  }
  return {padded, lengths};
}

// Asks the kernel to read rows `idx` of a column now, all of them at once (one asynchronous
// read each), so that a gather over data larger than memory waits for one batch of reads
// rather than for one page fault after another.
void read_ahead_rows(const Column& c, const at::Tensor& idx) {
  const int64_t* ix = idx.data_ptr<int64_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    const size_t p = part_of(c, ix[i]);
    const at::Tensor& part = c.parts[p];
    if (part.size(0) == 0) continue;
    int64_t lo = ix[i] - c.starts[p], hi = lo + 1;
    if (c.ragged()) {  // rows to values
      const int64_t* off = c.offsets[p].data_ptr<int64_t>();
      lo = off[lo], hi = off[hi];
    }
    const int64_t per = part.numel() / part.size(0) * part.element_size();
    Env::posix()->advise(static_cast<const uint8_t*>(part.data_ptr()) + lo * per,
                         static_cast<size_t>((hi - lo) * per), Env::Advice::WillNeed);
  }
}

// How long a Loader over a Dataset waits for the features store while another loader (another
// rank) writes it.
constexpr int64_t kFeatureLockWaitMs = 60'000;

// A batch holds a ragged key padded and, under this name after the key, each row's length.
constexpr const char* kLengthsSuffix = ".lengths";

at::Tensor cpu_contiguous(at::Tensor t) {
  return t.device().is_cpu() && t.is_contiguous() ? t : t.cpu().contiguous();
}

}  // namespace

struct TDSTORE_HIDDEN Loader::State {
  TensorDict source;               // for a dataset: an empty stand-in of its batch dims
  std::optional<Dataset> dataset;  // set: the rows are the dataset's published rows
  LoaderOptions options;
  std::vector<std::string> keys;
  // What every batch of the epoch reads, fixed when the epoch is set (take_source).
  std::vector<Column> columns;
  int64_t source_rows = 0;  // rows of the source when the epoch was set (features span these)
  int64_t n = 0;            // rows this epoch is planned over (<= source_rows)
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t start_step = 0;  // where the next begin() starts (restore)
  int64_t step = 0;        // batches handed out this epoch
  at::Tensor indices;      // this rank's rows, in visiting order
  // QuasiRandom: the plan, the epoch's block order, and the first global position of each
  // window (plus n at the end); read_ahead: the next window whose blocks are to be advised.
  detail::QuasiRandomPlan plan;
  std::vector<int64_t> block_order, window_starts;
  // A dataset's shards (number, published rows) now, and those the epoch was planned over when
  // a restored position names others (empty: the same): its rows are numbered by `planned` and
  // handed out by their place in `layout`.
  std::vector<std::pair<int64_t, int64_t>> layout, planned;
  bool pin = false;
  // The memory of released batches, reused by the next ones (bounded in start()).
  detail::BatchBuffers buffers{0};

  // Row-wise features.
  struct Feature {
    RowFeature spec;
    bool stored = false;  // complete and valid in the source: read like any key
    at::Tensor values;    // [n, ...] once the first rows are computed
    at::Tensor done;      // uint8 [n]
    int64_t done_rows = 0;
    std::vector<Column> deps;          // the inputs of fn (take_source)
    storage::RowFeatureRecord record;  // a dataset's feature: its provenance now
    bool dirty = false;                // a dataset's feature: rows computed since the last flush
    int64_t rows = 0;                  // source rows it was built for
    std::mutex mu;
  };
  std::vector<std::unique_ptr<Feature>> features;
  // A feature's state for the current source rows: stored and valid, resumed from an earlier
  // run's progress, or nothing computed yet. `complete` tells the first case.
  std::unique_ptr<Feature> make_feature(RowFeature spec, bool* complete);
  std::unique_ptr<Feature> make_dataset_feature(RowFeature spec, bool* complete);
  void flush_dataset_features();
  std::optional<TensorDict>
      feature_store;  // a dataset's stored features (read handle), once they exist

  // Worker pipeline of the current epoch.
  std::mutex mu;
  std::condition_variable cv;
  std::map<int64_t, TensorDict> ready;
  std::exception_ptr error;
  int64_t next_claim = 0;
  int64_t consumed = 0;
  int64_t total = 0;
  bool stop = false;
  std::vector<std::thread> workers;
  TensorDict current;
  bool iterating = false;  // begin() handed out a batch and the epoch's last is not yet past

  int64_t rows_for_rank() const {
    int64_t r = options.rank, w = options.world_size;
    return n > r ? (n - r + w - 1) / w : 0;
  }
  int64_t batches() const {
    int64_t rows = rows_for_rank(), b = options.batch_size;
    return options.drop_last || rows % b == 0 ? rows / b : rows / b + 1;  // no rows + b overflow
  }
  LoaderOrder order() const { return options.shuffle ? options.order : LoaderOrder::Sequential; }
  // Bytes one row of the loaded keys takes (a ragged key: its mean).
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
  int64_t window_of(int64_t b) const;
  int64_t last_window_of(int64_t b) const;  // the window holding batch b's last row
  int64_t window_of_position(int64_t pos) const;
  void read_ahead_loop(int64_t from);
  // Windowed: QuasiRandom over data larger than the budget, every column dense. The read-ahead
  // thread copies the windows into window_buffers (src/loader_windows.h) and gathers read
  // them there: window w is copied once the consumer is in window w - slots + 1 (every batch
  // reading the slot's previous window taken), and a batch is gathered once the windows it
  // reads are copied. slots: windows held at once, enough for the windows one batch spans
  // (two, unless a window holds fewer rows than a batch). filled: the last window copied.
  bool windowed = false;
  int64_t slots = 2;
  int64_t filled = -1;  // guarded by mu
  detail::WindowBuffers window_buffers;
  void plan_windows(int64_t from);
  std::thread reader;  // the read-ahead thread of the epoch in progress (QuasiRandom)
  bool over_budget() const { return row_bytes() * n > options.memory_budget; }
  void advise_window(int64_t w, Env::Advice advice) const;  // each block's rows, every column
  void advise_block(int64_t block, Env::Advice advice) const;
  void plan_epoch() {
    at::Tensor order;
    if (this->order() == LoaderOrder::QuasiRandom) {
      plan = detail::quasi_random_plan(row_bytes(), options.block_bytes, options.memory_budget);
      auto global = detail::quasi_random_order(
          n, plan, splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch)) ^ kQuasiRandomSalt),
          &block_order);
      window_starts.clear();
      int64_t at = 0;  // global positions: the blocks before, the short last one wherever it is
      for (size_t i = 0; i < block_order.size(); ++i) {
        if (static_cast<int64_t>(i) % plan.window_blocks == 0) window_starts.push_back(at);
        const int64_t first = block_order[i] * plan.block_rows;
        at += std::min(n, first + plan.block_rows) - first;
      }
      window_starts.push_back(n);
      order = at::empty({n}, at::kLong);
      std::copy(global.begin(), global.end(), order.data_ptr<int64_t>());
    } else if (options.shuffle) {
      auto gen = at::detail::createCPUGenerator(
          splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch))));
      order = at::randperm(n, gen, at::kLong);
    } else {
      order = at::arange(n, at::kLong);
    }
    indices = order.slice(0, options.rank, n, options.world_size).contiguous();
    if (!planned.empty()) renumber();
    advise_columns();
  }
  // Global rows numbered by `planned` to the same shard rows numbered by `layout`.
  void renumber() {
    std::map<int64_t, int64_t> now;
    int64_t at = 0;
    for (const auto& [id, rows] : layout) now[id] = at, at += rows;
    std::vector<int64_t> starts, ids;
    at = 0;
    for (const auto& [id, rows] : planned) {
      if (rows == 0) continue;
      starts.push_back(at), ids.push_back(id);
      at += rows;
    }
    int64_t* ix = indices.data_ptr<int64_t>();
    for (int64_t i = 0; i < indices.numel(); ++i) {
      const size_t p = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), ix[i]) -
                                           starts.begin()) -
                       1;
      ix[i] = now.at(ids[p]) + ix[i] - starts[p];
    }
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
  Column dataset_column(const std::string& key) const;
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

int64_t Loader::State::row_bytes() const {
  int64_t bytes = 0;
  for (const auto& c : columns) {
    int64_t rows = 0, total = 0;
    for (size_t p = 0; p < c.parts.size(); ++p) {
      total += c.parts[p].numel() * c.parts[p].element_size();
      rows += c.ragged() ? c.offsets[p].numel() - 1 : c.parts[p].size(0);
    }
    bytes += rows > 0 ? total / rows : 0;
  }
  return bytes;
}

void Loader::State::advise_block(int64_t block, Env::Advice advice) const {
  const int64_t first = block * plan.block_rows, last = std::min(n, first + plan.block_rows);
  for (const auto& c : columns)
    for (size_t p = 0; p < c.parts.size(); ++p) {
      const at::Tensor& part = c.parts[p];
      const int64_t rows = c.ragged() ? c.offsets[p].numel() - 1 : part.size(0);
      int64_t lo = std::max(first, c.starts[p]) - c.starts[p];
      int64_t hi = std::min(last, c.starts[p] + rows) - c.starts[p];
      if (lo >= hi || part.size(0) == 0) continue;
      if (c.ragged()) {  // rows to values
        const int64_t* off = c.offsets[p].data_ptr<int64_t>();
        lo = off[lo], hi = off[hi];
      }
      const int64_t per = part.numel() / part.size(0) * part.element_size();
      Env::posix()->advise(static_cast<const uint8_t*>(part.data_ptr()) + lo * per,
                           static_cast<size_t>((hi - lo) * per), advice);
    }
}

void Loader::State::advise_columns() const {
  const bool random = order() == LoaderOrder::Random && over_budget();
  for (const auto& c : columns)
    for (const auto& p : c.parts)
      Env::posix()->advise(p.data_ptr(), static_cast<size_t>(p.numel() * p.element_size()),
                           random ? Env::Advice::Random : Env::Advice::Normal);
}

int64_t Loader::State::window_of_position(int64_t pos) const {
  return static_cast<int64_t>(std::upper_bound(window_starts.begin(), window_starts.end(), pos) -
                              window_starts.begin()) -
         1;
}

int64_t Loader::State::window_of(int64_t b) const {
  return window_of_position(options.rank + b * options.batch_size * options.world_size);
}

int64_t Loader::State::last_window_of(int64_t b) const {
  const int64_t last = std::min((b + 1) * options.batch_size, indices.numel()) - 1;
  return window_of_position(options.rank + last * options.world_size);
}

void Loader::State::plan_windows(int64_t from) {
  windowed = false;
  slots = 2;
  if (!over_budget() || columns.empty()) return;
  std::vector<detail::WindowSource> sources;
  for (const auto& c : columns) {
    if (c.ragged()) return;
    detail::WindowSource s;
    const at::Tensor& first = c.parts[0];
    s.row_bytes = first.element_size();
    for (int64_t d = 1; d < first.dim(); ++d) s.row_bytes *= first.size(d);
    for (size_t p = 0; p < c.parts.size(); ++p) {
      const at::Tensor& part = c.parts[p];
      s.parts.push_back(static_cast<const uint8_t*>(part.data_ptr()));
      s.rows.push_back(part.size(0));
      const bool known = p < c.files.size() && c.files[p];
      s.files.push_back(known ? c.files[p]->file : nullptr);
      s.offsets.push_back(known ? c.files[p]->offset : 0);
    }
    s.starts = c.starts;
    sources.push_back(std::move(s));
  }
  for (int64_t b = from; b < total; ++b)
    slots = std::max(slots, last_window_of(b) - window_of(b) + 1);
  window_buffers.plan(n, plan.block_rows, plan.window_blocks, block_order, std::move(sources),
                      slots);
  windowed = true;
  filled = window_of(from) - 1;
}

void Loader::State::advise_window(int64_t w, Env::Advice advice) const {
  const auto first = static_cast<size_t>(w * plan.window_blocks);
  const auto last = std::min(block_order.size(), first + static_cast<size_t>(plan.window_blocks));
  for (size_t i = first; i < last; ++i) advise_block(block_order[i], advice);
}

void Loader::State::read_ahead_loop(int64_t from) {
  const auto windows = static_cast<int64_t>(window_starts.size()) - 1;
  // A store's pages are released; memory of an in-memory dict is left alone.
  const bool release = !windowed && over_budget() && (dataset || source.is_persistent());
  int64_t released = window_of(from);  // windows before it are no concern of this run
  // Releases the windows before `until`, which the consumer has left.
  auto release_before = [&](int64_t until) {
    for (; release && released < until; ++released) advise_window(released, Env::Advice::Release);
  };
  for (int64_t w = window_of(from); w < windows; ++w) {
    int64_t at = 0;  // the window of the next batch to be taken
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] {
        at = window_of(std::min(consumed, total - 1));
        return stop || w <= at + slots - 1;
      });
      if (stop) return;
    }
    if (windowed) {
      try {
        window_buffers.fill(w);
      } catch (...) {  // the batches reading it fail: the consumer sees the error
        std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
        cv.notify_all();
        return;
      }
      {
        std::lock_guard lock(mu);
        filled = w;
      }
      cv.notify_all();
      continue;
    }
    release_before(at);
    advise_window(w, Env::Advice::WillNeed);  // every block's reads submitted at once
    advise_window(w, Env::Advice::Populate);  // mapped as they arrive: gathers take no fault
  }
  if (windowed) return;
  {  // the epoch's last windows, once every batch is taken
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return stop || consumed >= total; });
    if (consumed < total) return;  // halted mid-epoch: the next run's windows are unknown
  }
  release_before(windows);
}

TensorDict Loader::State::gather(int64_t b) {
  int64_t bs = options.batch_size;
  at::Tensor idx = indices.slice(0, b * bs, std::min<int64_t>((b + 1) * bs, indices.numel()));
  std::vector<int64_t> batch_size = source.batch_size();  // a dataset's stand-in has its dims
  batch_size[0] = idx.numel();
  TensorDict batch(batch_size);
  auto& impl = detail::Access::impl(batch);
  // Moved once, as built: a batch for another device is not rebuilt.
  const bool move = options.device && !options.device->is_cpu();
  auto put = [&](std::string k, at::Tensor t) {
    if (move) t = t.to(*options.device, /*non_blocking=*/pin);
    impl.insert_unchecked(std::move(k), std::move(t));
  };
  if (order() == LoaderOrder::Random && over_budget()) {
    // This batch's rows, and those of the batch this thread is likely to gather next, so
    // that a batch of reads is always queued while one is copied.
    const int64_t next = b + std::max(1, options.num_workers);
    at::Tensor ahead =
        next * bs < indices.numel()
            ? indices.slice(0, next * bs, std::min<int64_t>((next + 1) * bs, indices.numel()))
            : at::Tensor();
    for (const auto& c : columns) {
      read_ahead_rows(c, idx);
      if (ahead.defined()) read_ahead_rows(c, ahead);
    }
  }
  if (windowed) {
    const int64_t need = last_window_of(b);
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return stop || error || filled >= need; });
    if (error) std::rethrow_exception(error);  // a window could not be read
    if (filled < need) return batch;           // halted: nobody takes this batch
  }
  for (size_t ci = 0; ci < columns.size(); ++ci) {
    const Column& c = columns[ci];
    if (windowed) {
      std::vector<int64_t> shape(c.parts[0].sizes().begin(), c.parts[0].sizes().end());
      shape[0] = idx.numel();
      at::Tensor out =
          pin ? at::empty(shape,
                          at::TensorOptions().dtype(c.parts[0].scalar_type()).pinned_memory(true))
              : buffers.empty(shape, c.parts[0].scalar_type());
      window_buffers.gather(ci, idx.data_ptr<int64_t>(), idx.numel(),
                            static_cast<uint8_t*>(out.data_ptr()));
      put(c.key, out);
    } else if (c.ragged()) {  // padded rows plus their lengths
      auto [padded, lengths] = gather_ragged(c, idx);
      put(c.key, padded);
      put(c.key + kLengthsSuffix, lengths);
    } else {
      put(c.key, gather_dense(c, idx, pin, &buffers));
    }
  }
  if (!features.empty()) compute_features(idx, put);
  return batch;
}

void Loader::State::compute_features(const at::Tensor& idx,
                                     const std::function<void(std::string, at::Tensor)>& put) {
  for (auto& fp : features) {
    Feature& f = *fp;
    if (f.stored) continue;  // loaded as a key
    std::vector<int64_t> todo;
    {
      std::lock_guard lock(f.mu);
      const int64_t* ix = idx.data_ptr<int64_t>();
      const uint8_t* done = f.done.data_ptr<uint8_t>();
      for (int64_t i = 0; i < idx.numel(); ++i)
        if (!done[ix[i]]) todo.push_back(ix[i]);
    }
    if (!todo.empty()) {
      at::Tensor rows = at::empty({static_cast<int64_t>(todo.size())}, at::kLong);
      std::memcpy(rows.data_ptr(), todo.data(), todo.size() * sizeof(int64_t));
      std::vector<int64_t> bsz = source.batch_size();
      bsz[0] = rows.numel();
      TensorDict deps(bsz);
      for (const auto& d : f.deps) deps.set(d.key, gather_dense(d, rows, false, &buffers));
      at::Tensor value = f.spec.fn(deps).detach().cpu().contiguous();
      if (value.dim() == 0 || value.size(0) != rows.numel())
        throw ShapeError(fmt::format("row feature '{}': fn returned shape [{}] for {} rows",
                                     f.spec.key, fmt::join(value.sizes(), ", "), rows.numel()));
      std::lock_guard lock(f.mu);
      if (!f.values.defined()) {
        std::vector<int64_t> shape(value.sizes().begin(), value.sizes().end());
        shape[0] = source_rows;
        f.values = at::zeros(shape, value.scalar_type());
      }
      f.values.index_copy_(0, rows, value.to(f.values.scalar_type()));
      uint8_t* done = f.done.data_ptr<uint8_t>();
      for (int64_t r : todo) done[r] = 1;
      f.done_rows += static_cast<int64_t>(todo.size());
      f.dirty = true;
    }
    std::lock_guard lock(f.mu);
    put(f.spec.key, gather_rows(f.values, idx, pin, &buffers));
  }
}

void Loader::State::start(int64_t from) {
  halt();
  ready.clear();
  error = nullptr;
  stop = false;
  next_claim = consumed = from;
  total = batches();
  windowed = false;
  slots = 2;
  if (order() == LoaderOrder::QuasiRandom && planned.empty() && from < total) {
    plan_windows(from);
    reader = std::thread([this, from] { read_ahead_loop(from); });
  }
  int nw = std::max(0, options.num_workers);
  // Batches in flight: prefetched, being gathered, and the consumer's current and previous one.
  buffers.set_max_free(static_cast<size_t>(std::max(1, options.prefetch) + nw + 2) *
                       (columns.size() + features.size()));
  for (int w = 0; w < nw; ++w) {
    workers.emplace_back([this] {
      for (;;) {
        int64_t b;
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] {
            return stop || next_claim >= total ||
                   next_claim < consumed + std::max(1, options.prefetch);
          });
          if (stop || next_claim >= total) return;
          b = next_claim++;
        }
        try {
          TensorDict batch = gather(b);
          std::lock_guard lock(mu);
          ready.emplace(b, std::move(batch));
        } catch (const abi::__forced_unwind&) {
          throw;  // the thread is being ended (pthread_exit, cancellation): let it unwind
        } catch (...) {
          std::lock_guard lock(mu);
          if (!error) error = std::current_exception();
        }
        cv.notify_all();
      }
    });
  }
}

void Loader::State::halt() {
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  cv.notify_all();
  for (auto& t : workers) t.join();
  workers.clear();
  if (reader.joinable()) reader.join();
}

TensorDict Loader::State::take(int64_t b) {
  if (workers.empty()) {  // gathered here; the read-ahead thread follows `consumed`
    TensorDict batch = gather(b);
    {
      std::lock_guard lock(mu);
      consumed = b + 1;
    }
    cv.notify_all();
    return batch;
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return error || ready.count(b); });
  if (error) std::rethrow_exception(error);
  TensorDict batch = std::move(ready.at(b));
  ready.erase(b);
  consumed = b + 1;
  lock.unlock();
  cv.notify_all();
  return batch;
}

Loader::Loader(TensorDict source, LoaderOptions options) : state_(std::make_unique<State>()) {
  if (source.batch_dims() == 0)
    throw ShapeError(
        (source.is_persistent() ? source.path().string() : std::string("in-memory TensorDict")) +
        ": a Loader needs a dict with batch dims");
  state_->source = std::move(source);  // a sub-dict: its keys, named relative to it
  state_->start_with(std::move(options));
}

Loader::Loader(Dataset source, LoaderOptions options) : state_(std::make_unique<State>()) {
  std::vector<int64_t> batch{0};
  const auto& row_shape = detail::DatasetAccess::impl(source).manifest.row_shape;
  batch.insert(batch.end(), row_shape.begin(), row_shape.end());
  state_->source = TensorDict(batch);  // the batch dims the dataset's rows have
  state_->dataset = std::move(source);
  state_->start_with(std::move(options));
}

void Loader::State::start_with(LoaderOptions o) {
  options = std::move(o);
  if (options.batch_size <= 0) throw Error(where() + ": Loader batch_size must be positive");
  if (options.block_bytes <= 0 || options.memory_budget <= 0)
    throw Error(fmt::format("{}: Loader block_bytes ({}) and memory_budget ({}) must be positive",
                            where(), options.block_bytes, options.memory_budget));
  if (options.world_size <= 0 || options.rank < 0 || options.rank >= options.world_size)
    throw Error(fmt::format("{}: Loader rank {} is outside world_size {}", where(), options.rank,
                            options.world_size));
  seed = options.seed;
  pin = options.device && options.device->is_cuda() && at::globalContext().hasCUDA();
  take_source();
  plan_epoch();
}

// The source as it is now: its rows, its keys (unless given), and features rebuilt when the
// rows or the feature's provenance changed (progress over other rows or other inputs says
// nothing about these).
void Loader::State::take_source() {
  source_rows = dataset ? dataset->rows() : source.batch_size()[0];
  n = source_rows;
  planned.clear();
  if (dataset) layout = detail::DatasetAccess::impl(*dataset).manifest.shards;
  for (auto& f : features) {
    if (f->rows == source_rows) {
      storage::RowFeatureRecord now = provenance(f->spec);
      // A feature stored in a dict is read from it: it must still be there and valid (not
      // erased, invalidated or overwritten since). A dataset's is held by this loader.
      const bool kept = !f->stored || dataset || stored_valid(f->spec);
      if (kept && now.deps == f->record.deps && now.version == f->record.version) continue;
    }
    f = rebuild(f->spec);
  }
  take_keys();
}

bool Loader::State::stored_valid(const RowFeature& spec) const {
  const auto& impl = detail::Access::impl(source);
  return source.contains(spec.key) &&
         detail::lazy_valid(impl, detail::lazy_request(impl, spec.key, spec.deps, spec.version));
}

storage::RowFeatureRecord Loader::State::provenance(const RowFeature& spec) const {
  if (dataset)
    return detail::DatasetAccess::impl(*dataset).feature_record(spec.key, spec.deps, spec.version);
  auto request =
      detail::lazy_request(detail::Access::impl(source), spec.key, spec.deps, spec.version);
  return {request.deps, request.version};
}

void Loader::State::drop_feature_keys() {
  std::erase_if(keys, [&](const std::string& k) {
    for (const auto& f : features)
      if (k == f->spec.key || k == f->spec.key + std::string(detail::kRowsDoneSuffix)) return true;
    return false;
  });
}

void Loader::State::take_keys() {
  if (dataset) return take_dataset_keys();
  keys = options.keys.empty() ? source.keys() : options.keys;
  drop_feature_keys();
  for (const auto& k : keys)
    if (!source.contains(k))
      throw KeyError(where() + ": Loader key " + in_quotes(k) + " not found");
  for (const auto& f : features)
    if (f->stored) keys.push_back(f->spec.key);
  columns.clear();
  for (const auto& k : keys) {
    if (source.is_ragged(k)) {
      auto r = source.get_ragged(k);
      Column c = one_part(k, cpu_contiguous(r.values));
      c.offsets.push_back(cpu_contiguous(r.offsets));
      columns.push_back(std::move(c));
    } else {
      columns.push_back(one_part(k, cpu_contiguous(source.get(k))));
      columns.back().files = {arena_bytes(source, columns.back().parts[0])};
    }
  }
  for (auto& f : features) {
    f->deps.clear();
    if (!f->stored)
      for (const auto& d : f->spec.deps)
        f->deps.push_back(one_part(d, cpu_contiguous(source.get(d))));
  }
  check_batch_names();
}

void Loader::State::check_batch_names() const {
  std::set<std::string_view> names(keys.begin(), keys.end());
  for (const auto& c : columns)
    if (c.ragged() && names.count(c.key + kLengthsSuffix))
      throw KeyError(where() + ": Loader: key '" + c.key + kLengthsSuffix +
                     "' has the name batches give the lengths of ragged key '" + c.key +
                     "'; rename it or leave one of them out with LoaderOptions::keys");
}

void Loader::State::take_dataset_keys() {
  keys = options.keys.empty() ? dataset->keys() : options.keys;
  drop_feature_keys();
  columns.clear();
  for (const auto& k : keys) columns.push_back(dataset_column(k));
  for (auto& f : features) {
    f->deps.clear();
    if (f->stored) {
      keys.push_back(f->spec.key);
      columns.push_back(one_part(f->spec.key, f->values));
    } else {
      for (const auto& d : f->spec.deps) f->deps.push_back(dataset_column(d));
    }
  }
  check_batch_names();
}

// A key of the published rows: each shard's published rows, read zero-copy from its store.
Column Loader::State::dataset_column(const std::string& k) const {
  const Dataset::Impl& d = detail::DatasetAccess::impl(*dataset);
  auto spec = d.manifest.keys.find(k);
  if (spec == d.manifest.keys.end() || n == 0)
    throw KeyError(where() + ": Loader key " + in_quotes(k) + " not found in the published rows");
  Column c{k, {}, {}, {}, {}};
  int64_t at = 0;
  for (const auto& [id, rows] : d.manifest.shards) {
    if (rows == 0) continue;
    const TensorDict& shard = d.reader(id);
    if (spec->second.ragged) {
      auto r = shard.get_ragged(k);
      c.parts.push_back(cpu_contiguous(r.values));
      c.offsets.push_back(cpu_contiguous(r.offsets.slice(0, 0, rows + 1)));
    } else {
      c.parts.push_back(cpu_contiguous(shard.get(k).slice(0, 0, rows)));
      c.files.push_back(arena_bytes(shard, c.parts.back()));
    }
    c.starts.push_back(at);
    at += rows;
  }
  return c;
}

Loader::~Loader() {
  state_->halt();
  try {
    flush_features();
  } catch (const std::exception& e) {
    fmt::print(stderr, "tdstore: Loader could not store its row features: {}\n", e.what());
  }
}

void Loader::set_epoch(int64_t epoch) {
  state_->halt();
  state_->take_source();
  state_->epoch = epoch;
  state_->start_step = state_->step = 0;
  state_->iterating = false;
  state_->plan_epoch();
}

int64_t Loader::size() const { return state_->batches(); }
int64_t Loader::rows() const { return state_->rows_for_rank(); }

LoaderPosition Loader::position() const {
  const State& s = *state_;
  const auto& o = s.options;
  LoaderPosition p;
  p.seed = s.seed;
  p.epoch = s.epoch;
  p.step = s.step;
  p.batch_size = o.batch_size;
  p.rank = o.rank;
  p.world_size = o.world_size;
  p.shuffle = o.shuffle;
  p.drop_last = o.drop_last;
  p.rows = s.n;
  p.order = kOrderVersion;
  if (s.order() == LoaderOrder::QuasiRandom) {
    p.order = kQuasiRandomOrderVersion;
    p.block_rows = s.plan.block_rows;
    p.window_blocks = s.plan.window_blocks;
  }
  if (s.dataset) p.shards = s.planned.empty() ? s.layout : s.planned;
  return p;
}

namespace {

template <class T>
void check_same(const std::string& where, const char* field, const std::optional<T>& saved,
                const T& mine) {
  if (saved && *saved != mine)
    throw Error(fmt::format(
        "{}: Loader position saved with {} {}, this loader has {} {}: it would hand out "
        "other rows than the saved run",
        where, field, *saved, field, mine));
}

}  // namespace

void Loader::restore(const LoaderPosition& p) {
  State& s = *state_;
  const auto& o = s.options;
  const std::string where = s.where();
  check_same(where, "seed", std::optional<uint64_t>(p.seed), s.seed);
  check_same(where, "batch_size", p.batch_size, o.batch_size);
  check_same(where, "rank", p.rank, o.rank);
  check_same(where, "world_size", p.world_size, o.world_size);
  check_same(where, "shuffle", p.shuffle, o.shuffle);
  check_same(where, "drop_last", p.drop_last, o.drop_last);
  const bool quasi = s.order() == LoaderOrder::QuasiRandom;
  check_same(where, "permutation scheme", p.order,
             quasi ? kQuasiRandomOrderVersion : kOrderVersion);
  set_epoch(p.epoch);
  if (quasi) {  // the plan follows from the loaded keys' row bytes: the same data, the same plan
    check_same(where, "block_rows", p.block_rows, s.plan.block_rows);
    check_same(where, "window_blocks", p.window_blocks, s.plan.window_blocks);
  }
  if (s.dataset && p.shards && p.step > 0 && *p.shards != s.layout) {
    // Finish that epoch over the shard rows it was planned over, wherever they are numbered now.
    std::map<int64_t, int64_t> now(s.layout.begin(), s.layout.end());
    int64_t total = 0;
    for (const auto& [id, rows] : *p.shards) {
      auto it = now.find(id);
      const int64_t have = it == now.end() ? 0 : it->second;
      if (rows < 0 || rows > have)
        throw Error(fmt::format(
            "{}: Loader position: shard {} now has {} published rows, the position's epoch "
            "was planned over {}",
            where, id, have, rows));
      total += rows;
    }
    if (p.rows && *p.rows != total)
      throw Error(fmt::format("{}: Loader position: rows {} disagree with its shards' {} rows",
                              where, *p.rows, total));
    s.planned = *p.shards;
    s.n = total;
    s.plan_epoch();
  } else if (p.rows && p.step > 0 && *p.rows != s.n) {
    if (*p.rows > s.n)
      throw Error(
          fmt::format("{}: Loader position is inside an epoch over {} rows; the source now has {}",
                      where, *p.rows, s.n));
    s.n = *p.rows;  // finish that epoch over the rows it was planned over
    s.plan_epoch();
  }
  if (p.step < 0 || p.step > size())
    throw Error(fmt::format("{}: Loader position step {} is outside the epoch's {} batches", where,
                            p.step, size()));
  s.start_step = s.step = p.step;
  s.iterating = false;
}

void Loader::save(TensorDict& store, const std::string& name) const {
  auto p = position();
  storage::LoaderRecord r{p.seed,       p.epoch,      p.step,         p.batch_size, p.rank,
                          p.world_size, p.rows,       p.order,        p.shuffle,    p.drop_last,
                          p.shards,     p.block_rows, p.window_blocks};
  store.set_attr("loader/" + name, storage::loader_record_json(r));
  store.commit();
}

bool Loader::load(const TensorDict& store, const std::string& name) {
  const std::string attr = "loader/" + name;
  auto v = store.attr(attr);
  if (!v) return false;
  const storage::LoaderRecord r = storage::parse_loader_record(
      *v, (store.is_persistent() ? store.path().string() : "in-memory TensorDict") +
              ": attribute " + in_quotes(attr));
  LoaderPosition p;
  p.seed = r.seed;
  p.epoch = r.epoch;
  p.step = r.step;
  p.batch_size = r.batch_size;
  p.rank = r.rank;
  p.world_size = r.world_size;
  p.shuffle = r.shuffle;
  p.drop_last = r.drop_last;
  p.rows = r.rows;
  p.order = r.order;
  p.shards = r.shards;
  p.block_rows = r.block_rows;
  p.window_blocks = r.window_blocks;
  restore(p);
  return true;
}

Loader::Iterator Loader::begin() {
  State& s = *state_;
  const int64_t first = s.start_step;
  s.start(first);
  s.start_step = 0;
  s.step = first;
  s.iterating = first < s.batches();
  if (first < s.batches()) {
    s.current = s.take(first);
    s.step = first + 1;  // handed out: the current batch counts
  }
  return Iterator(this, first);
}

Loader::Iterator Loader::end() { return Iterator(this, state_->batches()); }

TensorDict Loader::Iterator::operator*() const { return loader_->state_->current; }

Loader::Iterator& Loader::Iterator::operator++() {
  State& s = *loader_->state_;
  ++step_;
  if (step_ < s.batches()) {
    s.current = s.take(step_);
    s.step = step_ + 1;
  } else {
    s.step = step_;
    s.iterating = false;
    s.current = TensorDict();
    loader_->flush_features();  // the end of an epoch
  }
  return *this;
}

// ---- row-wise lazy features

std::unique_ptr<Loader::State::Feature> Loader::State::make_feature(RowFeature spec,
                                                                    bool* complete) {
  auto& impl = detail::Access::impl(source);
  auto f = std::make_unique<Feature>();
  f->spec = std::move(spec);
  f->done = at::zeros({source_rows}, at::kByte);
  auto request = detail::lazy_request(impl, f->spec.key, f->spec.deps, f->spec.version);
  f->record = {request.deps, request.version};
  f->rows = source_rows;
  const std::string mask_key = f->spec.key + std::string(detail::kRowsDoneSuffix);
  const std::string attr = std::string(detail::kRowFeatureAttr) + f->spec.key;
  std::erase_if(keys, [&](const std::string& k) { return k == f->spec.key || k == mask_key; });
  *complete = source.contains(f->spec.key) && detail::lazy_valid(impl, request);
  if (*complete) {
    f->stored = true;
    f->done_rows = source_rows;
    keys.push_back(f->spec.key);
  } else if (auto saved = source.attr(attr);
             saved && source.contains(mask_key) && source.contains(f->spec.key)) {
    // Partial progress of an earlier run, usable when its deps and version still match.
    const storage::RowFeatureRecord r =
        storage::parse_row_feature_record(*saved, where() + ": attribute " + in_quotes(attr));
    if (r.deps == request.deps && r.version == request.version &&
        source.get(mask_key).size(0) == source_rows) {
      f->values = source.get(f->spec.key).clone();
      f->done = source.get(mask_key).clone();
      f->done_rows = f->done.sum().item<int64_t>();
    }
  }
  return f;
}

// A dataset's feature lives in its features store (Dataset::Impl::open_features) as plain
// tensors over the global rows: values, done-rows mask, provenance attribute.
std::unique_ptr<Loader::State::Feature> Loader::State::make_dataset_feature(RowFeature spec,
                                                                            bool* complete) {
  const Dataset::Impl& d = detail::DatasetAccess::impl(*dataset);
  auto f = std::make_unique<Feature>();
  f->spec = std::move(spec);
  f->record = d.feature_record(f->spec.key, f->spec.deps, f->spec.version);
  f->rows = source_rows;
  f->done = at::zeros({source_rows}, at::kByte);
  *complete = false;
  if (feature_store)
    feature_store->refresh();
  else
    feature_store = d.open_features();
  if (!feature_store) return f;
  const std::string mask_key = f->spec.key + std::string(detail::kRowsDoneSuffix);
  const std::string attr = std::string(detail::kRowFeatureAttr) + f->spec.key;
  auto saved = feature_store->attr(attr);
  if (!saved || !feature_store->contains(f->spec.key) || !feature_store->contains(mask_key))
    return f;
  const std::string w = (d.dir / "features").string() + ": attribute " + in_quotes(attr);
  const storage::RowFeatureRecord r = storage::parse_row_feature_record(*saved, w);
  at::Tensor values = feature_store->get(f->spec.key), done = feature_store->get(mask_key);
  if (r.deps != f->record.deps || r.version != f->record.version ||
      done.scalar_type() != at::kByte || done.dim() != 1 || done.size(0) != source_rows ||
      values.dim() == 0 || values.size(0) != source_rows)
    return f;  // stale: computed from other rows or inputs
  f->done_rows = done.sum().item<int64_t>();
  if (f->done_rows == source_rows) {
    f->stored = *complete = true;
    f->values = cpu_contiguous(values);  // read zero-copy like a key
  } else {
    f->values = values.clone();
    f->done = done.clone();
  }
  return f;
}

// Merges each feature's new rows into the features store: rows another loader (another rank)
// stored under the same provenance join this loader's, so ranks that compute disjoint rows
// complete the feature together.
void Loader::State::flush_dataset_features() {
  bool any = false;
  for (auto& f : features) {
    std::lock_guard lock(f->mu);
    any = any || f->dirty;
  }
  if (!any) return;
  const Dataset::Impl& d = detail::DatasetAccess::impl(*dataset);
  TensorDict store = d.features_for_writing(kFeatureLockWaitMs);
  for (auto& fp : features) {
    Feature& f = *fp;
    std::lock_guard lock(f.mu);
    if (!f.dirty) continue;
    const std::string mask_key = f.spec.key + std::string(detail::kRowsDoneSuffix);
    const std::string attr = std::string(detail::kRowFeatureAttr) + f.spec.key;
    if (auto saved = store.attr(attr);
        saved && store.contains(f.spec.key) && store.contains(mask_key)) {
      const storage::RowFeatureRecord r = storage::parse_row_feature_record(
          *saved, (d.dir / "features").string() + ": attribute " + in_quotes(attr));
      at::Tensor values = store.get(f.spec.key), done = store.get(mask_key);
      if (r.deps == f.record.deps && r.version == f.record.version &&
          done.scalar_type() == at::kByte && done.sizes() == f.done.sizes() &&
          values.sizes() == f.values.sizes() && values.scalar_type() == f.values.scalar_type()) {
        at::Tensor theirs_done = done.contiguous();
        const uint8_t* theirs = theirs_done.data_ptr<uint8_t>();
        uint8_t* mine = f.done.data_ptr<uint8_t>();
        std::vector<int64_t> join;
        for (int64_t r = 0; r < f.done.numel(); ++r)
          if (theirs[r] && !mine[r]) join.push_back(r);
        if (!join.empty()) {
          at::Tensor rows = at::empty({static_cast<int64_t>(join.size())}, at::kLong);
          std::memcpy(rows.data_ptr(), join.data(), join.size() * sizeof(int64_t));
          f.values.index_copy_(0, rows, gather_rows(cpu_contiguous(values), rows, false, nullptr));
          for (int64_t r : join) mine[r] = 1;
          f.done_rows += static_cast<int64_t>(join.size());
        }
      }
    }
    store.set(f.spec.key, f.values);
    store.set(mask_key, f.done);
    store.set_attr(attr, storage::row_feature_record_json(f.record));
    f.dirty = false;
  }
  store.commit();
  for (auto& f : features)
    if (!f->stored && f->done_rows == source_rows && f->values.defined()) {
      f->stored = true;  // read like a key from now on
      keys.push_back(f->spec.key);
      columns.push_back(one_part(f->spec.key, f->values));
    }
}

bool Loader::add_feature(RowFeature spec) {
  State& s = *state_;
  if (s.iterating)
    throw Error(s.where() + ": Loader::add_feature for " + in_quotes(spec.key) +
                " during an epoch (" + std::to_string(s.step) + " of " +
                std::to_string(s.batches()) +
                " batches handed out): add features before iterating or after an epoch ends");
  if (!detail::Access::prefix(s.source).empty())
    throw Error(s.where() + ": Loader::add_feature for '" + spec.key +
                "' on a Loader over a sub-dict ('" + detail::Access::prefix(s.source) +
                "'): features are stored by full name; add them on a Loader over the whole dict");
  s.halt();  // the workers of an epoch that ended have exited; none reads the keys below
  bool complete = false;
  s.features.push_back(s.dataset ? s.make_dataset_feature(std::move(spec), &complete)
                                 : s.make_feature(std::move(spec), &complete));
  s.take_keys();  // a stored feature is read like a key, a computed one reads its deps
  return complete;
}

int64_t Loader::feature_rows_done(const std::string& key) const {
  for (const auto& f : state_->features)
    if (f->spec.key == key) return f->done_rows;
  throw KeyError("Loader: no row feature " + in_quotes(key));
}

void Loader::flush_features() {
  State& s = *state_;
  if (s.features.empty()) return;  // nothing to store: the source (maybe closed) is not touched
  if (s.dataset) return s.flush_dataset_features();
  if (!s.source.is_persistent() || !s.source.is_writable()) return;
  auto& impl = detail::Access::impl(s.source);
  bool wrote = false;
  for (auto& fp : s.features) {
    State::Feature& f = *fp;
    std::lock_guard lock(f.mu);
    if (f.stored || !f.values.defined()) continue;
    const std::string mask_key = f.spec.key + std::string(detail::kRowsDoneSuffix);
    const std::string attr = std::string(detail::kRowFeatureAttr) + f.spec.key;
    auto request = detail::lazy_request(impl, f.spec.key, f.spec.deps, f.spec.version);
    if (f.done_rows == s.source_rows) {  // complete: a lazy property with provenance
      if (s.source.contains(mask_key)) s.source.erase(mask_key);
      s.source.erase_attr(attr);
      detail::lazy_store(s.source, request, f.values);
      f.stored = true;
      s.keys.push_back(f.spec.key);  // read like a key from now on
      s.columns.push_back(one_part(f.spec.key, cpu_contiguous(s.source.get(f.spec.key))));
    } else {
      s.source.set(f.spec.key, f.values);
      s.source.set(mask_key, f.done);
      s.source.set_attr(attr, storage::row_feature_record_json({request.deps, request.version}));
      wrote = true;
    }
  }
  if (wrote) s.source.commit();
}

}  // namespace tdstore
