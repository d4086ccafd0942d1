// EpochPlan (src/epoch_plan.h): the visiting order of a Loader epoch and its windows.
#include "src/epoch_plan.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randperm.h>

#include <algorithm>
#include <map>

namespace tdstore::detail {

namespace {

// Mixed into the quasi-random order's seed, so it is not a function of Random's stream.
constexpr uint64_t kQuasiRandomSalt = 0x5155415349524e44ull;  // "QUASIRND"

}  // namespace

void EpochPlan::make(LoaderOrder order, const LoaderOptions& o, int64_t row_bytes) {
  at::Tensor global;
  const uint64_t mixed = seed ^ splitmix64(static_cast<uint64_t>(epoch));
  if (order == LoaderOrder::QuasiRandom) {
    plan = quasi_random_plan(row_bytes, o.block_bytes, o.memory_budget, n);
    auto rows = quasi_random_order(n, plan, splitmix64(mixed ^ kQuasiRandomSalt), &block_order);
    window_starts.clear();
    int64_t at = 0;  // global positions: the blocks before, the short last one wherever it is
    for (size_t i = 0; i < block_order.size(); ++i) {
      if (static_cast<int64_t>(i) % plan.window_blocks == 0) window_starts.push_back(at);
      const int64_t first = block_order[i] * plan.block_rows;
      at += std::min(n, first + plan.block_rows) - first;
    }
    window_starts.push_back(n);
    global = at::empty({n}, at::kLong);
    std::copy(rows.begin(), rows.end(), global.data_ptr<int64_t>());
  } else if (order == LoaderOrder::Random) {
    global = at::randperm(n, at::detail::createCPUGenerator(splitmix64(mixed)), at::kLong);
  } else {
    global = at::arange(n, at::kLong);
  }
  indices = global.slice(0, o.rank, n, o.world_size).contiguous();
  if (!planned.empty()) renumber();
}

void EpochPlan::renumber() {
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

int64_t EpochPlan::rows_for_rank(const LoaderOptions& o) const {
  const int64_t r = o.rank, w = o.world_size;
  return n > r ? (n - r + w - 1) / w : 0;
}

int64_t EpochPlan::batches(const LoaderOptions& o) const {
  const int64_t rows = rows_for_rank(o), b = o.batch_size;
  return o.drop_last || rows % b == 0 ? rows / b : rows / b + 1;  // no rows + b overflow
}

int64_t EpochPlan::window_of_position(int64_t pos) const {
  return static_cast<int64_t>(std::upper_bound(window_starts.begin(), window_starts.end(), pos) -
                              window_starts.begin()) -
         1;
}

int64_t EpochPlan::window_of(const LoaderOptions& o, int64_t b) const {
  return window_of_position(o.rank + b * o.batch_size * o.world_size);
}

int64_t EpochPlan::last_window_of(const LoaderOptions& o, int64_t b) const {
  const int64_t last = std::min((b + 1) * o.batch_size, indices.numel()) - 1;
  return window_of_position(o.rank + last * o.world_size);
}

}  // namespace tdstore::detail
