// The plan of one Loader epoch (include/tdstore/loader.h): the rows this rank visits in their
// visiting order, and, for LoaderOrder::QuasiRandom, the blocks and windows those rows lie in.
// A value with one writer: make() runs on the consumer's thread while no worker or read-ahead
// thread of the Loader runs (Loader::State halts them first); every thread of the epoch then
// reads it without a lock until the next make(). Internal to src/.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "src/loader_order.h"
#include "tdstore/loader.h"

namespace tdstore::detail {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct EpochPlan {
  // What the plan is made from, set before make().
  int64_t n = 0;  // rows the epoch is planned over
  uint64_t seed = 0;
  int64_t epoch = 0;
  // A dataset's shards (number, published rows) now, and those the epoch was planned over when
  // a restored position names others (empty: the same): its rows are numbered by `planned` and
  // handed out by their place in `layout`.
  std::vector<std::pair<int64_t, int64_t>> layout, planned;

  // What make() makes. indices: this rank's rows, in visiting order. QuasiRandom: the plan,
  // the epoch's block order, and the first global position of each window (plus n at the end).
  at::Tensor indices;
  QuasiRandomPlan plan;
  std::vector<int64_t> block_order, window_starts;

  // The order of (seed, epoch) over rows [0, n) (`order`: Sequential, Random or QuasiRandom,
  // whose blocks are planned from row_bytes, o.block_bytes and o.memory_budget), every
  // o.world_size-th position from o.rank, renumbered from `planned` to `layout`.
  void make(LoaderOrder order, const LoaderOptions& o, int64_t row_bytes);

  // Rows and batches of rank o.rank (a short last batch unless o.drop_last).
  int64_t rows_for_rank(const LoaderOptions& o) const;
  int64_t batches(const LoaderOptions& o) const;
  // QuasiRandom: the window holding global position `pos`; the windows of batch b's first and
  // last rows.
  int64_t window_of_position(int64_t pos) const;
  int64_t window_of(const LoaderOptions& o, int64_t b) const;
  int64_t last_window_of(const LoaderOptions& o, int64_t b) const;

 private:
  void renumber();  // global rows numbered by `planned` to the same shard rows by `layout`
};

}  // namespace tdstore::detail
