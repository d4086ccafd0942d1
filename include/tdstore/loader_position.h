// LoaderPosition: where a Loader is in its stream of batches (tdstore/loader.h). Torch-free:
// the engine stores it (Loader::save, the "loader/<name>" attribute of docs/FORMAT.md) and the
// CLI reads it.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace tdstore {

// A loader's place in its stream of batches, with everything that stream depends on. The
// optional fields are filled by position(); restore() checks each one that is set.
struct LoaderPosition {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t step = 0;  // batches of this epoch handed out, the one being used included
  std::optional<int64_t> batch_size, rank, world_size;
  std::optional<bool> shuffle, drop_last;
  std::optional<int64_t> rows;   // rows of the source this epoch was planned over
  std::optional<int64_t> order;  // version of the permutation scheme (Loader::kOrderVersion,
                                 // kQuasiRandomOrderVersion for LoaderOrder::QuasiRandom)
  // QuasiRandom: the rows per block and blocks per window the epoch was planned with.
  std::optional<int64_t> block_rows, window_blocks;
  // Over a Dataset: the shards (number, published rows) the epoch was planned over, in shard
  // order; global row numbers depend on them.
  std::optional<std::vector<std::pair<int64_t, int64_t>>> shards;
};

}  // namespace tdstore
