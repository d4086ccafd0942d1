// What a traced graph may hold: the checks that make an entry eager when its trace would not
// replay what the eager run computed. Internal to src/ (JIT headers in graph_checks.cpp only).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

namespace torch::jit {
struct Graph;
}

namespace tdstore::detail {

// Why `graph` (a fresh trace) cannot replay its eager run, or "" when it can:
//  - a tensor constant over memory it does not own (from_blob, a mapping): its bytes may be
//    gone or changed by the next call;
//  - a tensor constant whose storage is none of `made` (CallResult::made, when the caller
//    reports what its traced run's operations made) nor a number the tracer wrapped: a read
//    no guard covers, baked in; without `made` (a C++ body), any tensor constant but a wrapped
//    number: a tensor the body captured;
//  - memory an uninitialized factory (empty, empty_like, new_empty...) allocated that the
//    graph reads before any operation of the graph wrote it: a tensor whose values were filled
//    outside the tracer (at::tensor({...}) in C++), so a replay would read garbage.
// (Random draws are compared by running the graph: CompiledFunction::State::draws_otherwise.)
std::string unreplayable(const torch::jit::Graph& graph,
                         const std::optional<std::vector<at::Tensor>>& made);

}  // namespace tdstore::detail
