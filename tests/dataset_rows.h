// Reference rows for the dataset tests: every row's values name its global id.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>

#include <filesystem>
#include <vector>

#include "tdstore/tdstore.h"

namespace tdstore::testing {

// Rows [from, from + n): "id" (int64) and "x" (float32 [3], id * (1, 2, 3)).
inline TensorDict rows(int64_t from, int64_t n) {
  TensorDict r({n});
  at::Tensor id = at::arange(from, from + n, at::kLong);
  r.set("id", id);
  r.set("x", (id.to(at::kFloat).unsqueeze(1) * at::arange(1, 4, at::kFloat)).contiguous());
  return r;
}

inline void append_rows(TensorDict& shard, int64_t from, int64_t n) {
  shard.append(rows(from, n));
  shard.commit();
}

// A dataset whose shard s holds split[s] consecutive rows, published.
inline Dataset dataset_of(const std::filesystem::path& dir, const std::vector<int64_t>& split) {
  Dataset ds = Dataset::create(dir);
  int64_t at = 0;
  for (size_t s = 0; s < split.size(); ++s) {
    TensorDict shard = ds.shard(static_cast<int64_t>(s));
    if (split[s]) append_rows(shard, at, split[s]);
    at += split[s];
  }
  ds.publish();
  return ds;
}

}  // namespace tdstore::testing
