// cache_in_parallel: the only translation unit of tdstore that includes c10d.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "tdstore/dataset.h"

namespace tdstore {

void cache_in_parallel(
    Dataset& dataset, c10d::ProcessGroup& group,
    const std::function<void(TensorDict& shard, int64_t rank, int64_t world_size)>& job) {
  const int64_t rank = group.getRank(), world = group.getSize();
  {
    TensorDict shard = dataset.shard(rank);  // this rank's writer lock, released before the barrier
    job(shard, rank, world);
    shard.commit();
  }
  group.barrier()->wait();
  if (rank == 0) dataset.publish();
  group.barrier()->wait();
  dataset.refresh();
}

}  // namespace tdstore
