// What CompiledFunction's files share (src/compiled_function.cpp: calls, recording, tracing,
// persistence; src/compiled_function_replay.cpp: replaying, checking against eager, dynamic
// sizes): its state and cache entries. Internal to src/; JIT headers.
#pragma once

#include <fmt/format.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/version.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "src/draw_watch.h"
#include "src/fork_safe_mutex.h"
#include "src/guard.h"
#include "src/recording.h"
#include "src/tensordict_impl.h"
#include "storage/store.h"
#include "tdstore/compile.h"

namespace tdstore {
namespace detail {

// TDSTORE_LOGS holds "recompiles": each recompilation is also written to stderr.
bool log_recompiles();

// Debian's libtorch is built without LLVM: NNC CPU fusion would throw or crawl. Off, once.
void configure_jit();
// Creates the graph's executor now, as the simple (non-profiling) executor: on small graphs it
// costs about a third of the profiling executor's per-call overhead, and it differentiates
// graphs the same way. The mode is process-wide, so it is switched only around the creation.
torch::jit::Function* prepare(torch::jit::Module& module);
// A module whose forward is `graph` (its first input is self, retyped to the new module).
torch::jit::Module make_module(std::shared_ptr<torch::jit::Graph> graph);
std::shared_ptr<torch::jit::Graph> forward_graph(const torch::jit::Module& m);
// A copy of m's graph without the sizes and strides the trace recorded in its types.
std::shared_ptr<torch::jit::Graph> shapeless(const torch::jit::Module& m);
// m's forward as its serialized form reads back: a traced graph and the same graph loaded from
// a store print alike only after both went through the serializer (it hoists constants and
// renames values).
std::shared_ptr<torch::jit::Graph> as_serialized(const torch::jit::Module& m);
// Whether two traces are one graph but for the sizes in their types: the same nodes, the same
// non-tensor constants (a size read into C++ becomes one), equal tensor constants.
bool same_graph_but_sizes(const torch::jit::Module& a, const torch::jit::Module& b);
// The module's archive as a store keeps it, guard and effects inside.
std::string module_bytes(const torch::jit::Module& m, const Guard& g, const Effects& e);

}  // namespace detail

// The compiled function's files (and only they include this header) name these unqualified.
using detail::Access;
using detail::configure_jit;
using detail::Effects;
using detail::Guard;
using detail::make_module;
using detail::prepare;
using detail::Recording;
using detail::same_graph_but_sizes;
using detail::shapeless;
using detail::TensorSpec;
using detail::trace_copy;

struct TDSTORE_HIDDEN CompiledFunction::State {
  struct Entry {
    detail::Guard guard;
    detail::Effects effects;
    std::optional<torch::jit::Module> module;  // nullopt: this guard runs eagerly
    torch::jit::Function* forward = nullptr;   // module's forward, executor prepared
    std::string eager_reason;
    bool loaded = false;   // from a store: its first call is compared with eager
    bool checked = false;  // its first graph call was compared with eager
    // Dynamic dim 0: the sizes its graph serves in this process, each admitted by a trace at
    // that size that is its graph but for sizes (admit_size). `sizes_refused`: sizes whose
    // trace differed (a branch on the size, another key read): they never match this entry.
    std::set<int64_t> sizes_run, sizes_refused;
    // The recorded call read batch_size() itself (or, for a loaded entry, it is not known): its
    // sizes may be baked in, it never becomes dynamic.
    bool size_read = true;
  };

  std::string name;
  StructuredFn fn;
  CompileOptions options;
  // The call in progress (set by call() under mu): its inputs, ambient state and context.
  const std::vector<at::Tensor>* inputs GUARDED_BY(mu) = nullptr;
  std::string ambient GUARDED_BY(mu);
  const std::string* context GUARDED_BY(mu) = nullptr;
  detail::CallInputs call_inputs() const REQUIRES(mu) { return {*inputs, ambient, *context}; }
  std::set<std::string> eager_reasons_reported GUARDED_BY(mu);
  std::string code_id;
  // A function may call itself (the nested call runs eagerly); a child forked while another
  // thread holds it gets a fresh one.
  detail::ForkSafeRecursiveMutex mu;
  std::vector<Entry> entries GUARDED_BY(mu);  // most recently used first
  CompileStats stats GUARDED_BY(mu);
  std::vector<std::string> events GUARDED_BY(mu);
  bool limit_reported GUARDED_BY(mu) = false;
  bool nested_reported GUARDED_BY(mu) = false;
  bool loaded GUARDED_BY(mu) = false;
  std::optional<TensorDict> graph_store
      GUARDED_BY(mu);  // CompileOptions::store, opened on first use

  storage::Store* store_for(const TensorDict& root) REQUIRES(mu);
  std::string catalog_prefix() const {
    return std::string(storage::kCachePrefix) +
           fmt::format("{}/{}/{}/", name, code_id, TORCH_VERSION);
  }
  std::string catalog_key(const Entry& e) const {
    return catalog_prefix() + fmt::format("{:016x}", detail::guard_hash(e.guard));
  }
  void load_persisted(const TensorDict& root) REQUIRES(mu);
  // Seals and stores e's graph (storage/graph_cache.h chooses the store or the user's cache).
  void persist(const TensorDict& root, const Entry& e, const std::string& module_bytes)
      REQUIRES(mu);
  // Removes this user's stored record of e, wherever it is.
  void unpersist(const TensorDict& root, const Entry& e) REQUIRES(mu);
  CallResult record(TensorDict& td, const TensorDict& root, detail::Recording* rec) REQUIRES(mu);
  std::string trace(const detail::Recording& rec, const TensorDict& td, const TensorDict& root,
                    Entry& e, std::string* module_bytes) REQUIRES(mu);
  std::string replays_otherwise(const detail::Recording& rec, Entry& e) REQUIRES(mu);
  std::vector<at::Tensor> run_graph(Entry& e, const std::vector<at::Tensor>& reads,
                                    const std::vector<at::Tensor>& extra) REQUIRES(mu);
  void apply(const Entry& e, TensorDict& root, const std::vector<at::Tensor>& outs) REQUIRES(mu);
  std::string differs(const Entry& e, const detail::Recording& rec, const CallResult& ret,
                      const TensorDict& root, const std::vector<at::Tensor>& outs,
                      const std::vector<at::Tensor>& copies) const REQUIRES(mu);
  CallResult replay(Entry& e, TensorDict& td, TensorDict& root,
                    const std::vector<at::Tensor>& reads) REQUIRES(mu);
  CallResult check(Entry& e, TensorDict& td, TensorDict& root, const std::vector<at::Tensor>& reads)
      REQUIRES(mu);
  CallResult admit_size(Entry& e, TensorDict& td, TensorDict& root, int64_t dim0) REQUIRES(mu);
  CallResult miss(TensorDict& td, TensorDict& root) REQUIRES(mu);
  CallResult call(TensorDict& td, const CallState& state, const std::vector<at::Tensor>* extra)
      REQUIRES(mu);
  void make_dynamic(const TensorDict& root, size_t fresh) REQUIRES(mu);
  void count_entries() REQUIRES(mu) {
    stats.entries = std::count_if(entries.begin(), entries.end(),
                                  [](const Entry& e) { return e.module.has_value(); });
  }
  void event(std::string text, bool log) REQUIRES(mu) {
    if (log && detail::log_recompiles()) std::cerr << name << ": " << text << "\n";
    events.push_back(std::move(text));
  }
};

}  // namespace tdstore
