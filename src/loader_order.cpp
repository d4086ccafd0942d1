#include "src/loader_order.h"

#include <algorithm>
#include <bit>

namespace tdstore::detail {
namespace {

// splitmix64 as a stream: the generator of the quasi-random order (docs/DESIGN.md).
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound), bound > 0 (Lemire's multiply-shift with rejection).
  uint64_t below(uint64_t bound) {
    for (;;) {
      const unsigned __int128 m = static_cast<unsigned __int128>(next()) * bound;
      const auto low = static_cast<uint64_t>(m);
      if (low >= bound || low >= (-bound) % bound) return static_cast<uint64_t>(m >> 64);
    }
  }

 private:
  uint64_t state_;
};

template <class It>
void shuffle(It first, It last, SplitMix& gen) {
  for (auto n = last - first; n > 1; --n)
    std::iter_swap(first + (n - 1), first + static_cast<std::ptrdiff_t>(gen.below(n)));
}

}  // namespace

QuasiRandomPlan quasi_random_plan(int64_t row_bytes, int64_t block_bytes, int64_t memory_budget,
                                  int64_t rows) {
  QuasiRandomPlan p;
  row_bytes = std::max<int64_t>(row_bytes, 1);
  rows = std::max<int64_t>(rows, 1);
  // A power of two (then at most all rows): a compressed key's blocks are powers of two of
  // rows too (storage/compressed.h), so a block of the plan at least as large as them holds
  // each whole, from row 0 on, and an epoch past the budget decompresses each once.
  p.block_rows = std::min<int64_t>(static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(
                                       std::max<int64_t>(1, block_bytes / row_bytes)))),
                                   rows);
  const int64_t block = p.block_rows * row_bytes;
  const int64_t blocks = (rows - 1) / p.block_rows + 1;
  p.window_blocks = std::clamp<int64_t>(memory_budget / 2 / block, 1, blocks);
  return p;
}

std::vector<int64_t> quasi_random_order(int64_t n, const QuasiRandomPlan& plan, uint64_t seed,
                                        std::vector<int64_t>* blocks) {
  SplitMix gen(seed);
  const int64_t nblocks = n == 0 ? 0 : (n - 1) / plan.block_rows + 1;
  blocks->resize(static_cast<size_t>(nblocks));
  for (int64_t b = 0; b < nblocks; ++b) (*blocks)[static_cast<size_t>(b)] = b;
  shuffle(blocks->begin(), blocks->end(), gen);
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n));
  for (int64_t w = 0; w < nblocks; w += plan.window_blocks) {
    const auto window_start = order.size();
    for (int64_t i = w; i < std::min(nblocks, w + plan.window_blocks); ++i) {
      const int64_t first = (*blocks)[static_cast<size_t>(i)] * plan.block_rows;
      for (int64_t r = first; r < std::min(n, first + plan.block_rows); ++r) order.push_back(r);
    }
    shuffle(order.begin() + static_cast<std::ptrdiff_t>(window_start), order.end(), gen);
  }
  return order;
}

}  // namespace tdstore::detail
