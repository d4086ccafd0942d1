// A Loader epoch's plan on its own (src/epoch_plan.h): every rank's rows partition the epoch's,
// each order is a function of (seed, epoch) alone, the quasi-random windows are whole blocks in
// the plan's block order, batches map to the windows holding their rows, a restored position's
// rows are renumbered to the shards where they lie now, and batch counts follow drop_last.
#include "src/epoch_plan.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

namespace tdstore::detail {
namespace {

std::vector<int64_t> rows_of(const at::Tensor& t) {
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

EpochPlan made(LoaderOrder order, int64_t n, uint64_t seed, int64_t epoch, LoaderOptions o,
               int64_t row_bytes = 8) {
  EpochPlan p;
  p.n = n, p.seed = seed, p.epoch = epoch;
  p.make(order, o, row_bytes);
  return p;
}

TEST(EpochPlan, TheRanksRowsPartitionTheEpochInEveryOrder) {
  for (LoaderOrder order : {LoaderOrder::Sequential, LoaderOrder::Random, LoaderOrder::QuasiRandom})
    for (int64_t n : {0, 1, 7, 1000}) {
      std::vector<int64_t> all;
      for (int64_t rank = 0; rank < 3; ++rank) {
        LoaderOptions o;
        o.rank = rank, o.world_size = 3, o.block_bytes = 64, o.memory_budget = 512;
        EpochPlan p = made(order, n, 42, 5, o);
        EXPECT_EQ(p.indices.numel(), p.rows_for_rank(o)) << "n " << n << " rank " << rank;
        for (int64_t r : rows_of(p.indices)) all.push_back(r);
      }
      std::sort(all.begin(), all.end());
      std::vector<int64_t> expected(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) expected[static_cast<size_t>(i)] = i;
      EXPECT_EQ(all, expected) << "order " << static_cast<int>(order) << ", n " << n;
    }
}

TEST(EpochPlan, AnOrderIsAFunctionOfSeedAndEpochOnly) {
  LoaderOptions o;
  for (LoaderOrder order : {LoaderOrder::Random, LoaderOrder::QuasiRandom}) {
    o.block_bytes = 80, o.memory_budget = 800;
    const EpochPlan a = made(order, 500, 7, 3, o), b = made(order, 500, 7, 3, o);
    EXPECT_TRUE(at::equal(a.indices, b.indices));
    EXPECT_FALSE(at::equal(a.indices, made(order, 500, 7, 4, o).indices)) << "another epoch";
    EXPECT_FALSE(at::equal(a.indices, made(order, 500, 8, 3, o).indices)) << "another seed";
  }
  // The quasi-random order is not Random's stream under another name.
  EXPECT_FALSE(at::equal(made(LoaderOrder::Random, 500, 7, 3, o).indices,
                         made(LoaderOrder::QuasiRandom, 500, 7, 3, o).indices));
  EXPECT_EQ(rows_of(made(LoaderOrder::Sequential, 5, 7, 3, o).indices),
            (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

// The orders are part of a saved position's meaning (Loader::kOrderVersion): the same (seed,
// epoch, rank) must visit the same rows in every build. Random's taken from the Loader before
// EpochPlan held the plan; the quasi-random one from scheme 4 (kQuasiRandomOrderVersion) when
// it was made (50 rows of 8 bytes; block_bytes of 6 rows: blocks of 4, windows of 3 blocks).
TEST(EpochPlan, OrdersAreTheSavedPositionsOrders) {
  LoaderOptions o;
  o.block_bytes = 8 * 6, o.memory_budget = 8 * 6 * 2 * 2;
  o.rank = 1, o.world_size = 3;
  EXPECT_EQ(
      rows_of(made(LoaderOrder::Random, 50, 7, 3, o).indices),
      (std::vector<int64_t>{28, 8, 43, 0, 36, 26, 17, 2, 46, 42, 29, 13, 30, 48, 23, 34, 49}));
  o.rank = 0, o.world_size = 1;
  EXPECT_EQ(
      rows_of(made(LoaderOrder::QuasiRandom, 50, 0, 0, o).indices),
      (std::vector<int64_t>{28, 34, 29, 48, 35, 49, 33, 32, 30, 31, 46, 1,  13, 47, 3,  44, 45,
                            0,  14, 2,  12, 15, 22, 23, 41, 9,  40, 10, 11, 20, 8,  43, 21, 42,
                            16, 38, 39, 7,  37, 18, 19, 36, 4,  6,  17, 5,  25, 26, 27, 24}));
}

TEST(EpochPlan, QuasiRandomWindowsAreWholeBlocksInTheBlockOrder) {
  LoaderOptions o;
  // block_bytes of 10 rows: blocks of 8 (a power of two), windows of 3
  o.block_bytes = 8 * 10, o.memory_budget = 8 * 8 * 3 * 2;
  const int64_t n = 95;
  const EpochPlan p = made(LoaderOrder::QuasiRandom, n, 1, 0, o);
  ASSERT_EQ(p.plan.block_rows, 8);
  ASSERT_EQ(p.plan.window_blocks, 3);
  ASSERT_EQ(p.block_order.size(), 12u);
  ASSERT_EQ(p.window_starts.front(), 0);
  ASSERT_EQ(p.window_starts.back(), n);
  const std::vector<int64_t> order = rows_of(p.indices);  // one rank: the global order
  for (size_t w = 0; w + 1 < p.window_starts.size(); ++w) {
    std::set<int64_t> rows(order.begin() + p.window_starts[w],
                           order.begin() + p.window_starts[w + 1]);
    std::set<int64_t> blocks_rows;
    for (size_t i = w * 3; i < std::min<size_t>((w + 1) * 3, p.block_order.size()); ++i)
      for (int64_t r = p.block_order[i] * 8; r < std::min<int64_t>(n, (p.block_order[i] + 1) * 8);
           ++r)
        blocks_rows.insert(r);
    EXPECT_EQ(rows, blocks_rows) << "window " << w;
  }
  // A batch's windows are those of its first and last positions.
  o.batch_size = 7;
  for (int64_t b = 0; b < p.batches(o); ++b) {
    const int64_t first = b * 7, last = std::min<int64_t>(n, (b + 1) * 7) - 1;
    EXPECT_EQ(p.window_of(o, b), p.window_of_position(first));
    EXPECT_EQ(p.last_window_of(o, b), p.window_of_position(last));
    EXPECT_GE(first, p.window_starts[static_cast<size_t>(p.window_of(o, b))]);
    EXPECT_LT(last, p.window_starts[static_cast<size_t>(p.last_window_of(o, b)) + 1]);
  }
}

TEST(EpochPlan, RowsPlannedOverOldShardsAreHandedOutWhereTheyLieNow) {
  EpochPlan p;
  p.n = 7;
  p.planned = {{1, 4}, {2, 3}};         // the epoch was planned over shard 1 then shard 2
  p.layout = {{2, 3}, {1, 4}, {3, 5}};  // now shard 2 comes first and shard 3 was added
  LoaderOptions o;
  p.make(LoaderOrder::Sequential, o, 8);
  EXPECT_EQ(rows_of(p.indices), (std::vector<int64_t>{3, 4, 5, 6, 0, 1, 2}));
}

TEST(EpochPlan, BatchesFollowDropLastAndTheRank) {
  EpochPlan p;
  p.n = 10;
  LoaderOptions o;
  o.batch_size = 4;
  EXPECT_EQ(p.batches(o), 3);
  o.drop_last = true;
  EXPECT_EQ(p.batches(o), 2);
  o.world_size = 3, o.rank = 2;  // rows 2, 5, 8
  EXPECT_EQ(p.rows_for_rank(o), 3);
  EXPECT_EQ(p.batches(o), 0);
  o.rank = 0, o.batch_size = 1, o.drop_last = false;
  p.n = 2;
  o.world_size = 3, o.rank = 2;  // no row for rank 2
  EXPECT_EQ(p.rows_for_rank(o), 0);
  EXPECT_EQ(p.batches(o), 0);
}

}  // namespace
}  // namespace tdstore::detail
