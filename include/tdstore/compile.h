// A compile cache for functions over TensorDicts, keyed by what the function observes.
//
// compile("step", fn) returns a CompiledFunction. A call whose observations match no cached
// entry runs fn eagerly while recording what it observes of the dict, traces it into a
// TorchScript graph (libtorch's tracer), caches the graph and returns the eager result.
// Later calls whose observations match run the graph instead.
//
// The guard of an entry is exactly what fn observed, with the answers it got (docs/DESIGN.md,
// "The compile cache"): every key it read with its spec (dtype, exact sizes, strides, device,
// requires_grad); every question with its answer: contains, has_prefix, keys()/size()/iteration
// (the exact key set under the prefix, also through operations built on them such as index()
// or apply()), batch_size(), attr(), attr_names(), is_ragged(), is_persistent(), is_writable(),
// path(), generation(); every get_or_compute with the property's validity; every error a read
// or question threw (a function catching KeyError keeps its branch only while the key stays
// absent); the preconditions of its own writes; the specs of CompileOptions::inputs; the grad
// mode. Keys fn never observed never cause a recompilation: adding keys to a dict costs
// nothing. Checking a guard costs one lookup per observation, independent of the dict's size,
// except for key-set observations (keys(), size(), iteration, and has_prefix after the call's
// own writes), which cost O(keys under their prefix).
// Members the cache does not model (commit, refresh, verify, set_attr, append, set_ragged,
// invalidate, lazy_info, ...) make the entry run eagerly, and explain() names them.
//
// The trace replays the eager call: every question fn asks under the tracer is answered as
// the eager call was answered, so both take the same path.
//
// Writes fn makes (set, erase, get_or_compute) are applied to the caller's dict on every call,
// graph or eager, persistent stores included, and fail as eager would (an erase of an absent
// key throws KeyError); in-place updates of read tensors happen once.
//
// Limits a user must know (what a trace bakes in):
//  - C++ control flow is not recorded by the tracer, so what it would bake in is watched in the
//    eager run of a miss and makes the entry run eagerly (explain() says why): a tensor's value
//    read into C++ (item(), a bool of a tensor, at::equal, at::allclose), an operation whose
//    result's size depends on values (nonzero, masked_select, unique, a boolean-mask index,
//    TensorDict::index with a mask), a NoGradGuard, InferenceMode or autocast switch inside the
//    body, a tensor captured from outside and not listed in CompileOptions::inputs (its value
//    would be a constant of the graph), memory the graph does not own (from_blob, another
//    dict's tensors) and memory filled outside the tracer (at::tensor({...})). Sizes of the
//    dict's tensors are in the guard, so size-dependent code is safe. What stays unseen: raw
//    element access (data_ptr(), accessor()) and state outside libtorch (a C++ global the body
//    reads, a captured integer): put it in CompileOptions::code_identity or keep it out of the
//    body. CompileOptions::check_first_run compares the first graph run with eager. A dim 0
//    that became dynamic (CompileOptions::dynamic_batch) is free in the guard only after two
//    sizes traced one graph, and each new size is traced first (served only when that trace is
//    the same graph; docs/DESIGN.md, "Automatic dynamic dim 0").
//  - Captured tensors (model parameters, constants) must be listed in CompileOptions::inputs:
//    they become graph inputs, so gradients flow into them and in-place updates between calls
//    (an optimizer step) are seen (an unlisted one makes the entry eager). The list holds the
//    tensors themselves: a captured variable rebound to another tensor (w = w - lr * g) is not
//    seen; update in place or compile anew. Call backward() outside the function.
//  - Also eager: a body that catches an exception an operator threw under the tracer, a
//    returned tensor whose requires_grad the body set (the graph's would differ), and a call
//    whose graph throws (an index out of range, a failed factorization): eager then throws its
//    own error, or takes the path the body takes on it.
//  - fn runs twice on a miss (once eagerly, once under the tracer on a private copy of its
//    inputs): side effects outside the dict happen twice then.
//  - A function that throws under the tracer, or returns something the tracer rejects, runs
//    eagerly for that guard from then on (counted in fallbacks, bounded by cache_limit);
//    explain() says why. A compiled function called by another one runs eagerly inside it.
//
// Persistence: graphs are saved zstd-compressed in the LMDB catalog of the dict's store (or of
// CompileOptions::store) under the function's name, its code identity, the libtorch version
// and the guard's hash. The code identity covers the build id of the executable or shared
// library holding fn's code, fn's type (a plain function: its address in that object) and
// CompileOptions::code_identity; rebuilding that object or changing the option keeps old
// graphs from being used. Records are sealed with this user's key, and a record is loaded
// only when its seal verifies under a key this user holds (tdstore/trust.h): another user's,
// an unsigned or an altered record is never deserialized, and explain() says why the function
// traced anew. A loaded graph is used only when its guard hashes to its key, and its first call
// in each process also runs eagerly and is compared: on a mismatch (a captured value changed)
// it is retraced. Damaged records are skipped and reported (explain(), verify()). Graphs are
// cache entries written outside commits, also through read-only handles when the catalog's
// files are writable; where the store cannot hold a graph (its catalog is not writable by this
// user, or another signer's record holds the key) it goes to this user's graph cache, and is
// loaded from there next run. Set persist = false to keep every store untouched.
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
#include <typeinfo>
#include <utility>
#include <vector>

#include "tdstore/export.h"
#include "tdstore/tensordict.h"

namespace tdstore {

struct CompileOptions {
  // Entries cached per function (graphs, and guards whose trace failed and that run eagerly).
  // A call matching no entry when the function already holds this many runs eagerly (counted
  // in fallbacks, explained); entries are kept most recently used first.
  int64_t cache_limit = 8;
  // Captured tensors that must be graph inputs (e.g. model parameters requiring grad).
  std::vector<at::Tensor> inputs;
  // Store graphs in the catalog of a persistent dict (or of `store`) and reuse them next run.
  bool persist = true;
  // A store whose catalog holds the graphs, for functions called on in-memory dicts.
  std::optional<std::filesystem::path> store;
  // Runs the first graph call of every entry eagerly as well and compares the results; on a
  // mismatch the entry is dropped to eager and explain() says so. A first call whose eager run
  // throws checks nothing: the next call is compared again.
  bool check_first_run = false;
  // Tolerances of that comparison (at::allclose).
  double rtol = 1e-5, atol = 1e-6;
  // Automatic dynamic dim 0: when a call misses only because dim 0 of its reads changed (one
  // size to another everywhere, as batch sizes do), and the new trace is the old graph but for
  // sizes, the two entries become one that accepts any size of dim 0 (same dtypes, trailing
  // sizes and strides; the dynamic reads agree on one size). Each size such an entry has not
  // served in this process runs eagerly and is traced first; it joins the entry only when that
  // trace is the entry's graph but for sizes, and otherwise gets an exact entry (a branch on
  // the size is caught whatever the data). A size whose eager run throws is not admitted. A
  // trace with a size baked in (a size read into C++, batch_size() read by fn) keeps exact
  // entries. false: sizes always stay in the guard.
  bool dynamic_batch = true;
  // Mixed into the identity under which graphs are persisted, beside the build id of the
  // object holding fn's code and fn's type: set it to anything fn's result depends on that its
  // code does not show, such as captured constants or a model configuration.
  std::string code_identity;
};

// A call's result through CompiledFunction::call: the returned tensors and how the caller
// arranges them (e.g. a Python tuple or dict, encoded by the caller). An entry keeps the
// structure its eager call returned and hands it back on every hit; a later eager run returning
// another structure is a mismatch (check_first_run, loaded graphs, new sizes).
struct CallResult {
  std::vector<at::Tensor> tensors;
  std::string structure;
  // Set by a caller that watches its function's runs itself (the Python binding). Under the
  // tracer: the tensors that run's operations made (literals such as torch.tensor([...])
  // included); a tensor constant of the trace that is none of them (by storage) was read from
  // somewhere no guard covers (a gradient, a tensor in a container the caller cannot summarize,
  // a cast autocast cached during the eager run): the entry runs eagerly. In the eager run of a
  // miss, set (its contents unused) when the caller judged that run itself: the engine then
  // does not judge it as a C++ body (see "Limits" above). Unset: every tensor constant of the
  // trace is a captured tensor, and the entry runs eagerly.
  std::optional<std::vector<at::Tensor>> made = std::nullopt;
};

// What a call depends on besides the dict, for callers that find it out per call (the Python
// binding: the parameters and buffers of captured modules, configuration values, flags).
struct CallState {
  // Graph inputs in place of CompileOptions::inputs: an entry serves calls whose inputs have
  // the specs it was traced with, in order. In-place updates of them (a running mean) happen
  // once per call, also on a miss (the trace runs on restored values).
  std::vector<at::Tensor> inputs;
  // Everything else the result depends on, as the caller summarizes it: an entry serves only
  // calls with its context. Persisted in the guard.
  std::string context;
  // Non-empty: the call runs eagerly (counted in fallbacks); explain() says why, once per reason.
  std::string eager_reason;
};

struct CompileStats {
  int64_t compiles = 0;   // graphs traced in this process
  int64_t loads = 0;      // graphs loaded from a store's catalog instead of traced
  int64_t hits = 0;       // calls served by a cached graph
  int64_t fallbacks = 0;  // calls run eagerly (limit reached, untraceable function)
  int64_t entries = 0;    // graphs cached now
};

class TDSTORE_API CompiledFunction {
 public:
  using Fn = std::function<at::Tensor(TensorDict&)>;
  // ArgumentError when name is empty or holds '/' or NUL, or fn is empty. A second function
  // compiled under a name already used in this process with other code is warned about in
  // explain(): their graphs are kept apart.
  CompiledFunction(std::string name, Fn fn, CompileOptions options = {});
  // A function returning several tensors, called through call(). Its code identity is fn's
  // type and CompileOptions::code_identity.
  using StructuredFn = std::function<CallResult(TensorDict&)>;
  static CompiledFunction structured(std::string name, StructuredFn fn,
                                     CompileOptions options = {});

  // Runs the function on td (graph or eager, see above). Returns what fn returns; an undefined
  // tensor for a function returning void (or the first tensor of a structured function).
  at::Tensor operator()(TensorDict& td);
  // Runs the function on td with `state`'s inputs and context (see CallState).
  CallResult call(TensorDict& td, const CallState& state);
  CompileStats stats() const;
  // Why each graph was (re)compiled, loaded, or why calls ran eagerly, one event per line.
  std::string explain() const;
  const std::string& name() const;

  struct State;

 private:
  CompiledFunction(std::string name, StructuredFn fn, CompileOptions options,
                   const std::type_info& type, const void* function);

  detail::HandleState<std::shared_ptr<State>, detail::CompiledFunctionTag> state_;
};

// Called from a compiled function's body on `td` (the dict it was called with): the call read
// something a trace would bake in and no guard holds (the Python binding reports a tensor's
// storage_offset() or data_ptr()), so its entry runs eagerly and explain() names `what`. No
// effect outside a compiled function's eager run.
TDSTORE_API void compile_unsupported(const TensorDict& td, std::string_view what);

// What a compiled function's body is running for, asked from inside it on `td` (the dict it was
// called with): Recording, the eager run of a miss whose observations become the entry's guard
// (compile_unsupported() then makes the entry eager); Tracing, the run under the tracer; None,
// a call outside any compiled function, an eager fallback, or a graph's own run.
enum class CompilePhase { None, Recording, Tracing };
TDSTORE_API CompilePhase compile_phase(const TensorDict& td);

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
