// LoaderPosition: where a Loader is in its stream of batches (tdstore/loader.h). Torch-free:
// the engine stores it (Loader::save, the "loader/<name>" attribute of docs/FORMAT.md) and the
// CLI reads it.
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>
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
                                 // kQuasiRandomOrderVersion for LoaderOrder::QuasiRandom,
                                 // kSequentialOrderVersion for Sequential with shuffle true)
  // QuasiRandom: the rows per block and blocks per window the epoch was planned with.
  std::optional<int64_t> block_rows, window_blocks;
  // Over a Dataset: the shards (number, published rows) the epoch was planned over, in shard
  // order; global row numbers depend on them.
  std::optional<std::vector<std::pair<int64_t, int64_t>>> shards;
};

// Every field of a position with its name, the one list of them: calls f(name, field) for each,
// in declaration order. The saved record (storage/records.h) and the Python binding's
// state_dict() both walk it, so a field added above and here reaches both.
template <class Position, class F>
requires std::is_same_v<std::remove_const_t<Position>, LoaderPosition>
void for_each_field(Position& p, F&& f) {
  f("seed", p.seed);
  f("epoch", p.epoch);
  f("step", p.step);
  f("batch_size", p.batch_size);
  f("rank", p.rank);
  f("world_size", p.world_size);
  f("shuffle", p.shuffle);
  f("drop_last", p.drop_last);
  f("rows", p.rows);
  f("order", p.order);
  f("block_rows", p.block_rows);
  f("window_blocks", p.window_blocks);
  f("shards", p.shards);
}

}  // namespace tdstore
