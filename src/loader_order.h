// The visiting order of a Loader epoch for LoaderOrder::QuasiRandom (include/tdstore/loader.h):
// rows cut into blocks, blocks in a random order, rows shuffled within windows of consecutive
// blocks of that order. Internal to src/; no libtorch.
#pragma once

#include <cstdint>
#include <vector>

namespace tdstore::detail {

struct QuasiRandomPlan {
  int64_t block_rows = 1;     // rows per block (the last block may hold fewer)
  int64_t window_blocks = 1;  // blocks whose rows are shuffled together
};

// Blocks of the largest power of two of rows within block_bytes (at least one row, at most all
// `rows`), so that they hold whole compressed blocks, and windows of half the
// memory budget (at least one block, at most every block): row_bytes is the bytes one row of
// the loaded keys takes. Clamped to the data, so a huge block_bytes or memory_budget never
// sizes a buffer past the rows there are.
QuasiRandomPlan quasi_random_plan(int64_t row_bytes, int64_t block_bytes, int64_t memory_budget,
                                  int64_t rows);

// One epoch's order over rows [0, n): `blocks` receives the block order (block i holds rows
// [i * block_rows, min(n, (i + 1) * block_rows))). Every row appears exactly once. The result
// depends only on (n, plan, seed): its own generator (splitmix64, Fisher-Yates with
// Lemire's bounded draws), not libtorch's, so it is the same on every build.
std::vector<int64_t> quasi_random_order(int64_t n, const QuasiRandomPlan& plan, uint64_t seed,
                                        std::vector<int64_t>* blocks);

}  // namespace tdstore::detail
