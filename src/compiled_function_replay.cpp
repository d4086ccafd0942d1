// CompiledFunction: replaying a cached graph, checking a graph's first calls against eager
// code, admitting other sizes of a dynamic dim 0, and the miss that records and traces.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/graph_fuser.h>
#include <torch/csrc/jit/passes/shape_analysis.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/version.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_set>

#include "src/code_identity.h"
#include "src/compiled_function_state.h"
#include "src/fork_safe_mutex.h"
#include "src/guard.h"
#include "src/lazy_internal.h"
#include "src/observer.h"
#include "src/recording.h"
#include "src/tensordict_impl.h"
#include "storage/graph_record.h"
#include "tdstore/compile.h"

namespace tdstore {

std::vector<at::Tensor> CompiledFunction::State::run_graph(Entry& e,
                                                           const std::vector<at::Tensor>& reads,
                                                           const std::vector<at::Tensor>& extra) {
  torch::jit::Stack stack;
  stack.reserve(1 + reads.size() + extra.size());
  stack.emplace_back(e.module->_ivalue());
  for (const auto& t : reads) stack.emplace_back(t);
  for (const auto& t : extra) stack.emplace_back(t);
  {
    // Unoptimized: the interpreter runs the traced ops and autograd records them one by one,
    // as in eager. The executor's differentiable subgraphs cost about a quarter more per
    // training step here. The flag is thread-local.
    torch::jit::GraphOptimizerEnabledGuard plain(false);
    e.forward->run(stack);
  }
  c10::IValue result = std::move(stack.back());
  const auto& elements = result.toTupleRef().elements();
  size_t expected =
      static_cast<size_t>(e.effects.returns) + e.effects.writes.size() + e.effects.lazy.size();
  if (elements.size() != expected)
    throw CorruptionError(fmt::format("{}: graph returned {} values, its entry expects {}", name,
                                      elements.size(), expected));
  std::vector<at::Tensor> outs;
  outs.reserve(elements.size());
  for (const auto& v : elements) outs.push_back(v.toTensor());
  return outs;
}

// Applies what the recorded call did: erases, then sets, then lazy properties with provenance.
void CompiledFunction::State::apply(const Entry& e, TensorDict& root,
                                    const std::vector<at::Tensor>& outs) {
  auto i = static_cast<size_t>(e.effects.returns);
  for (const auto& k : e.effects.erases)
    if (root.contains(k)) root.erase(k);
  for (const auto& k : e.effects.writes) root.set(k, outs[i++]);
  auto& impl = Access::impl(root);
  for (const auto& l : e.effects.lazy) {
    std::vector<std::string> deps;
    for (const auto& [d, h] : l.deps) deps.push_back(d);
    detail::lazy_store(root, detail::lazy_request(impl, l.key, deps, l.version), outs[i++]);
  }
  impl.lazy_stats.reused += e.effects.lazy_reuses;
}

CallResult CompiledFunction::State::replay(Entry& e, TensorDict& td, TensorDict& root,
                                           const std::vector<at::Tensor>& reads) {
  std::vector<at::Tensor> outs;
  try {
    outs = run_graph(e, reads, *inputs);
  } catch (const std::exception& ex) {
    // The graph threw (an index out of range, a failed factorization): the call runs eagerly,
    // which throws its own error (of its own type) or takes the path the body takes on it
    // (a try/catch the trace cannot hold). Nothing was applied to the dict.
    ++stats.fallbacks;
    std::string what = ex.what();
    what = what.substr(0, what.find('\n'));
    if (eager_reasons_reported.insert("graph threw: " + what).second)
      event(fmt::format("the graph threw ({}): such calls run eagerly", what), true);
    return fn(td);
  }
  ++stats.hits;
  apply(e, root, outs);
  outs.resize(static_cast<size_t>(e.effects.returns));
  return {std::move(outs), e.effects.structure};
}

namespace {

bool same_tensor(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  at::Tensor x = a.detach(), y = b.detach();
  if (at::isFloatingType(x.scalar_type()) || at::isComplexType(x.scalar_type()))
    return at::allclose(x, y, rtol, atol, /*equal_nan=*/true);
  return at::equal(x, y);
}

}  // namespace

// Why the graph's run (outs, and copies of its inputs after it ran) differs from the eager
// call recorded in rec; "" when they agree.
std::string CompiledFunction::State::differs(const Entry& e, const Recording& rec,
                                             const CallResult& ret, const TensorDict& root,
                                             const std::vector<at::Tensor>& outs,
                                             const std::vector<at::Tensor>& copies) const {
  if (!rec.unsupported.empty()) return "the eager call " + rec.unsupported;
  if (!e.guard.covers(rec.guard))
    return fmt::format("the eager call observed other things ({})", rec.guard.describe());
  if (!(rec.effects == e.effects)) return "the eager call wrote or erased other keys";
  const auto& impl = Access::impl(root);
  size_t i = 0;
  for (; i < static_cast<size_t>(e.effects.returns); ++i)
    if (!same_tensor(ret.tensors[i], outs[i], options.rtol, options.atol))
      return e.effects.returns == 1 ? std::string("the returned tensor differs")
                                    : fmt::format("returned tensor {} differs", i);
  for (const auto& k : e.effects.writes)
    if (!same_tensor(impl.get(k), outs[i++], options.rtol, options.atol))
      return fmt::format("the value written to \"{}\" differs", k);
  for (const auto& l : e.effects.lazy)
    if (!same_tensor(impl.get(l.key), outs[i++], options.rtol, options.atol))
      return fmt::format("lazy property \"{}\" differs", l.key);
  for (size_t j = 0; j < copies.size() && j < rec.originals.size(); ++j)
    if (!same_tensor(rec.originals[j], copies[j], options.rtol, options.atol))
      return fmt::format("the in-place update of read {} differs", j);
  return "";
}

// The first call of an entry that must be checked: the graph runs on copies of its inputs,
// then the call runs eagerly for real (its effects happen once) and the two are compared.
// An eager run that throws marks nothing: the next call is checked again.
CallResult CompiledFunction::State::check(Entry& e, TensorDict& td, TensorDict& root,
                                          const std::vector<at::Tensor>& reads) {
  std::vector<at::Tensor> copies, extra;
  for (const auto& t : reads) copies.push_back(trace_copy(t));
  for (const auto& t : *inputs) extra.push_back(trace_copy(t));  // updated in place once: eager
  std::vector<at::Tensor> outs;
  std::string why;
  try {
    detail::RngRestore rng;  // the eager run below draws the call's random numbers
    outs = run_graph(e, copies, extra);
  } catch (const std::exception& ex) {
    std::string msg = ex.what();
    why = "the graph threw: " + msg.substr(0, msg.find('\n'));
  }
  Recording rec;
  CallResult ret = record(td, root, &rec);  // throws: e stays unchecked
  e.checked = true;
  if (why.empty()) why = differs(e, rec, ret, root, outs, copies);
  if (why.empty()) {
    ++stats.hits;
    return ret;
  }
  ++stats.fallbacks;
  const bool was_loaded = e.loaded;
  e.loaded = false;
  if (was_loaded) {
    unpersist(root, e);
    if (rec.unsupported.empty()) {
      Entry fresh;
      fresh.guard = rec.guard;
      fresh.effects = rec.effects;
      std::string bytes;
      if (std::string err = trace(rec, td, root, fresh, &bytes); err.empty()) {
        event(fmt::format("stored graph differs from eager on its first call ({}): retraced", why),
              true);
        ++stats.compiles;
        persist(root, fresh, bytes);
        fresh.checked = !options.check_first_run;
        e = std::move(fresh);
        count_entries();
        return ret;
      }
    }
  }
  e.module.reset();
  e.forward = nullptr;
  e.eager_reason = fmt::format("graph differs from eager on its first run: {}", why);
  event("entry dropped to eager: " + e.eager_reason, true);
  count_entries();
  return ret;
}

// A size a dynamic entry has not served yet: the call runs eagerly for real while recorded,
// and is traced at this size. The size joins the entry only when that trace is the entry's
// graph but for sizes and its guard is the entry's with this size bound; an output comparison
// could not prove that (a branch on the size agrees on benign data). Otherwise the size is
// refused for good: its calls match other entries (an exact one is traced on the next call).
// An eager run that throws admits nothing.
CallResult CompiledFunction::State::admit_size(Entry& e, TensorDict& td, TensorDict& root,
                                               int64_t dim0) {
  Recording rec;
  CallResult ret = record(td, root, &rec);
  std::string why;
  Entry fresh;
  fresh.guard = rec.guard;
  fresh.effects = rec.effects;
  std::string bytes;
  if (!rec.unsupported.empty()) {
    why = rec.unsupported;
  } else if (std::any_of(rec.tape.begin(), rec.tape.end(), [](const detail::Event& ev) {
               return ev.op == detail::Event::Op::BatchSize;
             })) {
    why = "the call read batch_size()";
  } else if (!(fresh.effects == e.effects) || !e.guard.covers(fresh.guard)) {
    why = "it reads, asks or writes other things: " + fresh.guard.describe();
  } else if (std::string err = trace(rec, td, root, fresh, &bytes); !err.empty()) {
    why = "untraceable: " + err;
  } else if (!same_graph_but_sizes(*fresh.module, *e.module)) {
    why = "its trace differs beyond sizes (a branch on the size, or a size baked in)";
  }
  e.checked = true;
  if (why.empty()) {
    e.sizes_run.insert(dim0);
    ++stats.hits;
    return ret;
  }
  e.sizes_refused.insert(dim0);
  ++stats.fallbacks;
  event(fmt::format("dim 0 size {} refused by the dynamic entry ({}): calls of that size match "
                    "other entries",
                    dim0, why),
        true);
  if (fresh.module && static_cast<int64_t>(entries.size()) < options.cache_limit) {
    ++stats.compiles;  // the size's own trace serves it as an exact entry
    fresh.size_read = false;
    persist(root, fresh, bytes);
    entries.insert(entries.begin(), std::move(fresh));  // e is not used after this
    count_entries();
  }
  return ret;
}

CallResult CompiledFunction::State::miss(TensorDict& td, TensorDict& root) {
  std::string why;
  for (size_t i = 0; i < entries.size() && i < 2; ++i)
    why += fmt::format("{}entry {}: {}", i ? "; " : "", i,
                       entries[i].guard.mismatch(root, td.prefix(), call_inputs()));
  if (static_cast<int64_t>(entries.size()) >= options.cache_limit) {
    ++stats.fallbacks;
    if (!limit_reported) {
      limit_reported = true;
      event(fmt::format("cache_limit {} reached: calls matching no entry run eagerly ({})",
                        options.cache_limit, why),
            true);
    }
    return fn(td);
  }
  Recording rec;
  CallResult ret = record(td, root, &rec);
  Entry e;
  e.guard = rec.guard;
  e.effects = rec.effects;
  event(why.empty() ? fmt::format("compiling ({}; first call)", e.guard.describe())
                    : fmt::format("recompiling ({})", why),
        true);
  if (!rec.unsupported.empty()) {
    e.eager_reason = rec.unsupported;
    event(e.eager_reason + " (this guard runs eagerly)", true);
  } else {
    std::string bytes;
    if (std::string err = trace(rec, td, root, e, &bytes); !err.empty()) {
      e.eager_reason = "untraceable: " + err;
      event(e.eager_reason + " (this guard runs eagerly)", true);
    } else {
      ++stats.compiles;
      e.size_read = std::any_of(rec.tape.begin(), rec.tape.end(), [](const detail::Event& ev) {
        return ev.op == detail::Event::Op::BatchSize;
      });
      persist(root, e, bytes);
    }
  }
  entries.insert(entries.begin(), std::move(e));
  if (entries.front().module && options.dynamic_batch) make_dynamic(root, 0);
  count_entries();
  return ret;
}

// Automatic dynamic dim 0: when the fresh entry and an exact one differ only in dim 0 of their
// reads and traced the same graph but for sizes, both are replaced by one entry whose guard
// accepts any size there. A graph with a size baked in differs, and both stay.
void CompiledFunction::State::make_dynamic(const TensorDict& root, size_t fresh) {
  Entry& b = entries[fresh];
  if (b.size_read || b.guard.dynamic_dim0) return;
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& a = entries[i];
    if (i == fresh || !a.module || a.size_read || a.guard.dynamic_dim0 || !(a.effects == b.effects))
      continue;
    int64_t from = 0, to = 0;
    auto guard = detail::generalize_dim0(a.guard, b.guard, &from, &to);
    if (!guard) continue;
    if (!same_graph_but_sizes(*a.module, *b.module)) {
      event(
          fmt::format(
              "dim 0 of the reads changed ({} -> {}) but the traces differ beyond sizes (a size is "
              "baked in): both sizes keep exact entries",
              from, to),
          true);
      return;
    }
    Entry d;
    d.guard = std::move(*guard);
    d.effects = b.effects;
    d.module = make_module(shapeless(*b.module));
    d.forward = prepare(*d.module);
    d.size_read = false;
    d.sizes_run = {from, to};
    d.checked = true;
    unpersist(root, a);
    unpersist(root, b);
    persist(root, d, module_bytes(*d.module, d.guard, d.effects));
    event(fmt::format("entry became dynamic in dim 0 (sizes {} and {} traced one graph): {}", from,
                      to, d.guard.describe()),
          true);
    entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(std::max(i, fresh)));
    entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(std::min(i, fresh)));
    entries.insert(entries.begin(), std::move(d));
    return;
  }
}

}  // namespace tdstore
