// Loader: the epoch's plan (a permutation per (seed, epoch), rank sharding, the quasi-random
// order's windows), the source's keys and columns, the worker pipeline with in-order
// delivery, and positions saved and restored. Gathering: src/loader_gather.cpp; row-wise
// lazy features: src/loader_features.cpp.
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
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "src/dataset_impl.h"
#include "src/lazy_internal.h"
#include "src/loader_state.h"
#include "src/tensordict_impl.h"
#include "storage/records.h"
#include "tdstore/env.h"

namespace tdstore {

void Loader::State::start(int64_t from) {
  halt();
  const int64_t total = batches();
  pipeline.reset(from, total, options.prefetch);
  windowed = false;
  slots = 2;
  const bool quasi = order() == LoaderOrder::QuasiRandom && planned.empty() && from < total;
  if (quasi) plan_windows(from);
  // Packed columns without windows (another order, within the budget, a ragged key, a restored
  // position planned over other shards): read whole, before any thread of the epoch reads the
  // columns. Windows keep nothing decompressed.
  if (!windowed && from < total) unpack_columns();
  if (windowed) unpacked.clear();
  if (quasi) reader = std::thread([this, from] { read_ahead_loop(from); });
  int nw = std::max(0, options.num_workers);
  // Batches in flight: prefetched, being gathered, and the consumer's current and previous one.
  buffers.set_max_free(static_cast<size_t>(std::max(1, options.prefetch) + nw + 2) *
                       (columns.size() + features.size()));
  for (int w = 0; w < nw; ++w) {
    workers.emplace_back([this] {
      while (const std::optional<int64_t> b = pipeline.claim()) {
        try {
          pipeline.put(*b, gather(*b));
        } catch (const abi::__forced_unwind&) {
          throw;  // the thread is being ended (pthread_exit, cancellation): let it unwind
        } catch (...) {
          pipeline.fail(std::current_exception());
        }
      }
    });
  }
}

void Loader::State::halt() {
  pipeline.stop();
  for (auto& t : workers) t.join();
  workers.clear();
  if (reader.joinable()) reader.join();
}

TensorDict Loader::State::take(int64_t b) {
  if (workers.empty()) {  // gathered here; the read-ahead thread follows the batches taken
    TensorDict batch = gather(b);
    pipeline.took(b);
    return batch;
  }
  return pipeline.take(b);
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
  if (options.batch_size <= 0)
    throw ArgumentError(where() + ": Loader batch_size must be positive");
  if (options.block_bytes <= 0 || options.memory_budget <= 0)
    throw ArgumentError(
        fmt::format("{}: Loader block_bytes ({}) and memory_budget ({}) must be positive", where(),
                    options.block_bytes, options.memory_budget));
  if (options.world_size <= 0 || options.rank < 0 || options.rank >= options.world_size)
    throw ArgumentError(fmt::format("{}: Loader rank {} is outside world_size {}", where(),
                                    options.rank, options.world_size));
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
  // Compressed keys are taken packed: the windows of a quasi-random epoch decompress them block
  // by block; other epochs read them whole (start()).
  for (const auto& k : keys) {
    if (source.is_ragged(k)) {
      auto r = source.get_ragged(k);
      Column c = one_part(k, cpu_contiguous(r.values));
      c.offsets.push_back(cpu_contiguous(r.offsets));
      columns.push_back(std::move(c));
    } else {
      Column c{k, {}, {}, {0}, {}, {}};
      add_part(c, source, k, /*pack=*/true);
      columns.push_back(std::move(c));
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
      storage::MutexLock lock(&f->mu);
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
  Column c{k, {}, {}, {}, {}, {}};
  int64_t at = 0;
  for (const auto& [id, rows] : d.manifest.shards) {
    if (rows == 0) continue;
    const TensorDict& shard = d.reader(id);
    if (spec->second.ragged) {
      auto r = shard.get_ragged(k);
      c.parts.push_back(cpu_contiguous(r.values));
      c.offsets.push_back(cpu_contiguous(r.offsets.slice(0, 0, rows + 1)));
    } else {
      add_part(c, shard, k, /*pack=*/true, rows);
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
  p.order = s.order_version();
  if (s.order() == LoaderOrder::QuasiRandom) {
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
    throw ArgumentError(fmt::format(
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
  check_same(where, "permutation scheme", p.order, s.order_version());
  set_epoch(p.epoch);
  if (s.dataset && p.shards && p.step > 0 && *p.shards != s.layout) {
    // Finish that epoch over the shard rows it was planned over, wherever they are numbered now.
    std::map<int64_t, int64_t> now(s.layout.begin(), s.layout.end());
    int64_t total = 0;
    for (const auto& [id, rows] : *p.shards) {
      auto it = now.find(id);
      const int64_t have = it == now.end() ? 0 : it->second;
      if (rows < 0 || rows > have)
        throw ArgumentError(fmt::format(
            "{}: Loader position: shard {} now has {} published rows, the position's epoch "
            "was planned over {}",
            where, id, have, rows));
      total += rows;
    }
    if (p.rows && *p.rows != total)
      throw ArgumentError(fmt::format(
          "{}: Loader position: rows {} disagree with its shards' {} rows", where, *p.rows, total));
    s.planned = *p.shards;
    s.n = total;
    s.plan_epoch();
  } else if (p.rows && p.step > 0 && *p.rows != s.n) {
    if (*p.rows > s.n)
      throw ArgumentError(
          fmt::format("{}: Loader position is inside an epoch over {} rows; the source now has {}",
                      where, *p.rows, s.n));
    s.n = *p.rows;  // finish that epoch over the rows it was planned over
    s.plan_epoch();
  }
  if (quasi &&
      p.step > 0) {  // the plan follows from the epoch's rows: the same rows, the same plan
    // A block of every row or more is one block, a window of every block or more is one
    // window: positions saved before plans were clamped to the data mean the same order.
    std::optional<int64_t> block_rows = p.block_rows;
    if (block_rows) block_rows = std::min(*block_rows, std::max<int64_t>(s.n, 1));
    check_same(where, "block_rows", block_rows, s.plan.block_rows);
    const int64_t blocks = s.n == 0 ? 1 : (s.n - 1) / s.plan.block_rows + 1;
    std::optional<int64_t> window_blocks = p.window_blocks;
    if (window_blocks) window_blocks = std::min(*window_blocks, blocks);
    check_same(where, "window_blocks", window_blocks, s.plan.window_blocks);
  }
  if (p.step < 0 || p.step > size())
    throw ArgumentError(fmt::format("{}: Loader position step {} is outside the epoch's {} batches",
                                    where, p.step, size()));
  s.start_step = s.step = p.step;
  s.iterating = false;
}

void Loader::save(TensorDict& store, const std::string& name) const {
  store.set_attr("loader/" + name, storage::loader_record_json(position()));
  store.commit();
}

bool Loader::load(const TensorDict& store, const std::string& name) {
  const std::string attr = "loader/" + name;
  auto v = store.attr(attr);
  if (!v) return false;
  restore(storage::parse_loader_record(
      *v, (store.is_persistent() ? store.path().string() : "in-memory TensorDict") +
              ": attribute " + in_quotes(attr)));
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

}  // namespace tdstore
