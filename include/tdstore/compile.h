// A compile cache for functions over TensorDicts, keyed by what the function observes.
//
// compile("step", fn) returns a CompiledFunction. A call whose observations match no cached
// entry runs fn eagerly while recording what it observes of the dict, traces it into a
// TorchScript graph (libtorch's tracer), caches the graph and returns the eager result.
// Later calls whose observations match run the graph instead.
//
// The guard of an entry is exactly what fn observed: every key it read with its spec (dtype,
// exact sizes, strides, device, requires_grad), every presence probe (contains, has_prefix)
// with its answer, every observation of a whole key set (keys(), size(), iteration, and
// operations built on them such as index() or apply()) with the exact key set, each lazy
// property with its validity, the specs of CompileOptions::inputs, and the grad mode. Keys fn
// never observed never cause a recompilation: adding keys to a dict costs nothing. Checking a
// guard costs O(number of observations), independent of the dict's size.
//
// Writes fn makes (set, erase, get_or_compute) are applied to the caller's dict on every call,
// graph or eager, persistent stores included; in-place updates of read tensors happen too.
//
// Limits a user must know (what a trace bakes in):
//  - C++ control flow is not recorded: branches on tensor values, item(), sizes
//    read into C++ integers, and tensors of other dicts or captured from outside are constants
//    of the graph. Sizes are in the guard, so size-dependent code is safe; value-dependent
//    code is not. CompileOptions::check_first_run compares the first graph run with eager.
//  - Captured tensors that require grad (model parameters) must be listed in
//    CompileOptions::inputs: they become graph inputs, so gradients flow into them and
//    optimizer updates between calls are seen. Call backward() outside the function.
//  - fn runs twice on a miss (once eagerly, once under the tracer on a private copy of its
//    inputs): side effects outside the dict happen twice then.
//  - A function that throws under the tracer, or returns something the tracer rejects, runs
//    eagerly for that guard from then on; explain() says why.
//
// Persistence: graphs are saved zstd-compressed in the LMDB catalog of the dict's store (or of
// CompileOptions::store), keyed by function name, the executable's build id, the libtorch
// version and the guard. A new process loads them instead of tracing. Rebuilding the
// executable changes its build id, so its old entries are never used. Graphs are cache
// entries written outside commits, also through read-only handles when the catalog's files are
// writable; set persist = false to keep a store untouched.
//
// TDSTORE_LOGS=recompiles prints every (re)compilation and its reason to stderr.
//
// Thread safety: calls to one CompiledFunction are serialized by an internal mutex.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tdstore/tensordict.h"

namespace tdstore {

struct CompileOptions {
  // Graphs cached per function. A call matching no entry when the function has already traced
  // or loaded this many graphs runs eagerly (counted in fallbacks, explained); entries are kept
  // most recently used first.
  int64_t cache_limit = 8;
  // Captured tensors that must be graph inputs (e.g. model parameters requiring grad).
  std::vector<at::Tensor> inputs;
  // Store graphs in the catalog of a persistent dict (or of `store`) and reuse them next run.
  bool persist = true;
  // A store whose catalog holds the graphs, for functions called on in-memory dicts.
  std::optional<std::filesystem::path> store;
  // Runs the first graph call of every entry eagerly as well and compares the results; on a
  // mismatch the entry is dropped to eager and explain() says so.
  bool check_first_run = false;
  // Tolerances of that comparison (at::allclose).
  double rtol = 1e-5, atol = 1e-6;
  // Mixed into the identity under which graphs are persisted, beside the build id of the
  // object defining fn's type and that type's name: set it to anything fn's result depends on
  // that its code does not show, such as captured constants or a model configuration.
  std::string code_identity;
};

struct CompileStats {
  int64_t compiles = 0;   // graphs traced in this process
  int64_t loads = 0;      // graphs loaded from a store's catalog instead of traced
  int64_t hits = 0;       // calls served by a cached graph
  int64_t fallbacks = 0;  // calls run eagerly (limit reached, untraceable function)
  int64_t entries = 0;    // graphs cached now
};

class CompiledFunction {
 public:
  using Fn = std::function<at::Tensor(TensorDict&)>;
  CompiledFunction(std::string name, Fn fn, CompileOptions options = {});

  // Runs the function on td (graph or eager, see above). Returns what fn returns; an undefined
  // tensor for a function returning void.
  at::Tensor operator()(TensorDict& td);
  CompileStats stats() const;
  // Why each graph was (re)compiled, loaded, or why calls ran eagerly, one event per line.
  std::string explain() const;
  const std::string& name() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// fn: any callable taking TensorDict& and returning at::Tensor or void.
template <class F>
CompiledFunction compile(std::string name, F&& fn, CompileOptions options = {}) {
  using R = std::invoke_result_t<F&, TensorDict&>;
  CompiledFunction::Fn f;
  if constexpr (std::is_void_v<R>) {
    f = [g = std::forward<F>(fn)](TensorDict& td) mutable {
      g(td);
      return at::Tensor();
    };
  } else if constexpr (std::is_convertible_v<F, at::Tensor (*)(TensorDict&)>) {
    f = static_cast<at::Tensor (*)(TensorDict&)>(fn);  // its address is part of its identity
  } else {
    static_assert(std::is_convertible_v<R, at::Tensor>, "fn must return at::Tensor or void");
    f = [g = std::forward<F>(fn)](TensorDict& td) mutable { return at::Tensor(g(td)); };
  }
  return CompiledFunction(std::move(name), std::move(f), std::move(options));
}

}  // namespace tdstore
