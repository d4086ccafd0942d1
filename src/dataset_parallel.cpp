// cache_in_parallel: the only translation unit of tdstore that includes c10d.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "tdstore/dataset.h"

namespace tdstore {

void cache_in_parallel(
    Dataset& dataset, c10d::ProcessGroup& group,
    const std::function<void(TensorDict& shard, int64_t rank, int64_t world_size)>& job) {
  cache_in_parallel(
      dataset, group.getRank(), group.getSize(), [&group] { group.barrier()->wait(); }, job);
}

}  // namespace tdstore
