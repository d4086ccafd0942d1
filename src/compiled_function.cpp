// CompiledFunction: calls, record, trace, persist, and the JIT helpers of
// compiled_function_state.h. With compiled_function_replay.cpp, the only translation units with
// JIT headers. Contract in include/tdstore/compile.h.
#include <ATen/CPUGeneratorImpl.h>
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
#include "src/graph_checks.h"
#include "src/guard.h"
#include "src/lazy_internal.h"
#include "src/observer.h"
#include "src/recording.h"
#include "src/run_watch.h"
#include "src/tensordict_impl.h"
#include "storage/graph_cache.h"
#include "storage/graph_record.h"
#include "tdstore/compile.h"

namespace tdstore {

std::string detail::ambient_state() {
  std::string out;
  auto add = [&out](std::string_view part) {
    if (!out.empty()) out += ';';
    out += part;
  };
  if (at::autocast::is_cpu_enabled())
    add(fmt::format("autocast_cpu={}", c10::toString(at::autocast::get_autocast_cpu_dtype())));
  if (at::autocast::is_enabled())
    add(fmt::format("autocast_cuda={}", c10::toString(at::autocast::get_autocast_gpu_dtype())));
  if (auto d = c10::get_default_dtype_as_scalartype(); d != c10::ScalarType::Float)
    add(fmt::format("default_dtype={}", c10::toString(d)));
  if (at::globalContext().deterministicAlgorithms()) add("deterministic");
  if (c10::InferenceMode::is_enabled()) add("inference_mode");
  return out;
}

namespace detail {

bool log_recompiles() {
  static const bool on = [] {
    const char* v = std::getenv("TDSTORE_LOGS");
    return v && std::string_view(v).find("recompiles") != std::string_view::npos;
  }();
  return on;
}

void configure_jit() {
  static std::once_flag once;
  std::call_once(once, [] {
    torch::jit::overrideCanFuseOnCPULegacy(false);
    torch::jit::setTensorExprFuserEnabled(false);
  });
}

torch::jit::Function* prepare(torch::jit::Module& module) {
  static storage::Mutex mu;  // the executor mode is process-wide
  auto& fn = torch::jit::toGraphFunction(module.get_method("forward").function());
  storage::MutexLock lock(&mu);
  bool saved = torch::jit::getExecutorMode();
  torch::jit::getExecutorMode() = false;
  fn.get_executor();
  torch::jit::getExecutorMode() = saved;
  return &fn;
}

torch::jit::Module make_module(std::shared_ptr<torch::jit::Graph> graph) {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  auto cls = c10::ClassType::create("__torch__.tdstore.Graph", cu, /*is_module=*/true);
  torch::jit::Module module(cu, cls);
  graph->inputs()[0]->setType(cls);
  cls->addMethod(cu->create_function("__torch__.tdstore.Graph.forward", graph));
  return module;
}

std::shared_ptr<torch::jit::Graph> forward_graph(const torch::jit::Module& m) {
  return torch::jit::toGraphFunction(m.get_method("forward").function()).graph();
}

std::shared_ptr<torch::jit::Graph> shapeless(const torch::jit::Module& m) {
  auto g = forward_graph(m)->copy();
  torch::jit::EraseShapeInformation(g);
  return g;
}

std::shared_ptr<torch::jit::Graph> as_serialized(const torch::jit::Module& m) {
  std::stringstream bytes;
  m.save(bytes);
  torch::jit::Module back = torch::jit::load(bytes);
  auto g = forward_graph(back)->copy();
  torch::jit::EraseShapeInformation(g);
  return g;
}

bool same_graph_but_sizes(const torch::jit::Module& a, const torch::jit::Module& b) {
  auto ga = as_serialized(a), gb = as_serialized(b);
  if (ga->toString(false) != gb->toString(false)) return false;
  auto tensors = [](const torch::jit::Graph& g) {
    std::vector<at::Tensor> out;
    for (const torch::jit::Node* n : g.nodes())
      if (n->kind() == c10::prim::Constant && n->output()->type()->cast<c10::TensorType>())
        out.push_back(torch::jit::toIValue(n->output())->toTensor());
    return out;
  };
  auto ta = tensors(*ga), tb = tensors(*gb);
  if (ta.size() != tb.size()) return false;
  for (size_t i = 0; i < ta.size(); ++i)
    if (ta[i].sizes() != tb[i].sizes() || ta[i].scalar_type() != tb[i].scalar_type() ||
        !at::equal(ta[i], tb[i]))
      return false;
  return true;
}

std::string module_bytes(const torch::jit::Module& m, const Guard& g, const Effects& e) {
  std::ostringstream os;
  m.save(os, {{"tdstore.json", detail::to_json(g, e).dump()}, {"torch_version", TORCH_VERSION}});
  return os.str();
}

}  // namespace detail

storage::Store* CompiledFunction::State::store_for(const TensorDict& root) {
  if (!options.persist) return nullptr;
  if (auto& impl = Access::impl(root); impl.persistent() && !options.store) return impl.store.get();
  if (!options.store) return nullptr;
  if (!graph_store) graph_store = TensorDict::open(*options.store);
  return Access::impl(*graph_store).store.get();
}

void CompiledFunction::State::load_persisted(const TensorDict& root) {
  loaded = true;
  storage::Store* store = store_for(root);
  if (!store) return;
  const std::string mine = catalog_prefix();
  std::set<std::string> others;
  std::vector<storage::TrustedRecord> records;
  std::vector<std::string> skipped;  // reported as events below, under mu
  try {
    records = storage::load_trusted_graphs(
        *store, std::string(storage::kCachePrefix) + name + "/",
        [&](const std::string& key, const std::filesystem::path& where, const std::string& why) {
          if (key.compare(0, mine.size(), mine) == 0 || why.rfind("a damaged", 0) == 0)
            skipped.push_back(fmt::format("skipped stored graph {} in {}: {} (never loaded)", key,
                                          where.string(), why));
        });
  } catch (const std::exception& ex) {
    skipped.push_back(fmt::format("stored graphs not read: {}", ex.what()));
  }
  for (auto& text : skipped) event(std::move(text), true);
  std::set<std::string> sources;
  for (auto& [key, value, source] : records) {
    if (key.compare(0, mine.size(), mine) != 0) {
      others.insert(key.substr(0, key.rfind('/')));
      continue;
    }
    if (static_cast<int64_t>(entries.size()) >= options.cache_limit) break;
    try {
      auto record = storage::decode_graph_record(value, key);
      Entry e;
      detail::from_json(record.meta, &e.guard, &e.effects);
      if (catalog_key(e) != key) throw CorruptionError("its guard does not hash to its key");
      std::istringstream in(std::move(record.module));
      e.module = torch::jit::load(in);
      e.forward = prepare(*e.module);
      e.loaded = true;
      entries.push_back(std::move(e));
      ++stats.loads;
      sources.insert(source.string());
    } catch (const std::exception& ex) {
      event(fmt::format("skipped stored graph {}: {}", key, ex.what()), true);
    }
  }
  if (stats.loads > 0)
    event(fmt::format("loaded {} graph(s) from {}", stats.loads, fmt::join(sources, " and ")),
          true);
  if (!others.empty())
    event(fmt::format(
              "{} stored graph group(s) named \"{}\" belong to other code or another libtorch "
              "(not used): {}",
              others.size(), name, fmt::join(others, ", ")),
          true);
}

void CompiledFunction::State::persist(const TensorDict& root, const Entry& e,
                                      const std::string& module_bytes) {
  storage::Store* store = store_for(root);
  if (!store) return;
  try {
    auto where = storage::put_trusted_graph(
        *store, catalog_key(e),
        storage::encode_graph_record(detail::to_json(e.guard, e.effects), module_bytes));
    if (where != store->path())
      event(fmt::format("graph stored in this user's graph cache {} ({} cannot hold it)",
                        where.string(), store->path().string()),
            true);
  } catch (const std::exception& ex) {
    event(fmt::format("graph not persisted: {}", ex.what()), true);
  }
}

void CompiledFunction::State::unpersist(const TensorDict& root, const Entry& e) {
  if (storage::Store* store = store_for(root)) {
    try {
      storage::erase_own_graph(*store, catalog_key(e));
    } catch (const std::exception& ex) {  // the result is eager's either way
      event(fmt::format("stored graph not removed: {}", ex.what()), true);
    }
  }
}

CallResult CompiledFunction::State::record(TensorDict& td, const TensorDict& root, Recording* rec) {
  detail::Recorder recorder(root, td.prefix(), *inputs);
  CallResult ret;
  at::Tensor rng_before = detail::default_rng_state();
  bool drew = false;
  std::string untraceable;  // what the run did that a trace of a C++ body cannot replay
  {
    detail::DrawWatch draws;
    detail::RunWatch watch;
    detail::ObserverScope scope(&recorder);
    ret = fn(td);
    drew = draws.drew();
    untraceable = watch.why();
  }
  for (const auto& t : ret.tensors)
    if (!t.defined()) throw ArgumentError(fmt::format("{}: returned an undefined tensor", name));
  *rec = recorder.finish(static_cast<int64_t>(ret.tensors.size()));
  // A caller that watched its own run (ret.made: the Python binding, which sees Python's reads
  // and context managers itself) is not judged by what C++ control flow would bake in.
  if (!ret.made && rec->unsupported.empty() && !untraceable.empty())
    rec->unsupported = std::move(untraceable);
  if (drew) {
    rec->rng_before = std::move(rng_before);
    rec->rng_after = detail::default_rng_state();
  }
  rec->effects.structure = ret.structure;
  for (const auto& t : ret.tensors) rec->returns_grad.push_back(t.requires_grad());
  rec->guard.ambient = ambient;
  rec->guard.context = *context;
  return ret;
}

// Why e's graph, run once on copies of the recorded call's inputs, does not replay the call
// (a trace records operators only), or "": it must leave the default generator where the call
// did when the call drew (a draw whose result is unused is dropped by the tracer; the caller
// restores the generator), and its returns must require grad exactly where the call's did
// (requires_grad set on a tensor the body made is not in the graph). (Another thread drawing
// during a drawing call moves the generator too: the entry then runs eagerly.)
std::string CompiledFunction::State::replays_otherwise(const Recording& rec, Entry& e) {
  std::vector<at::Tensor> reads, extra;
  for (const auto& t : rec.inputs) reads.push_back(trace_copy(t));
  for (const auto& t : *inputs) extra.push_back(trace_copy(t));
  if (rec.rng_before.defined()) detail::set_default_rng_state(rec.rng_before);
  std::vector<at::Tensor> outs = run_graph(e, reads, extra);
  if (rec.rng_before.defined() && !at::equal(detail::default_rng_state(), rec.rng_after))
    return "the graph draws other random numbers than the eager run (a draw whose result is "
           "unused is dropped by the tracer)";
  for (size_t i = 0; i < rec.returns_grad.size() && i < outs.size(); ++i)
    if (outs[i].requires_grad() != rec.returns_grad[i])
      return fmt::format(
          "returned tensor {} {} grad in the eager run and {} in the graph (requires_grad set "
          "on a tensor the body made is not traced)",
          i, rec.returns_grad[i] ? "requires" : "does not require",
          outs[i].requires_grad() ? "does" : "does not");
  return "";
}

// Traces fn replaying `rec` into e.module; returns why it failed, or "".
std::string CompiledFunction::State::trace(const Recording& rec, const TensorDict& td,
                                           const TensorDict& root, Entry& e,
                                           std::string* module_bytes) {
  configure_jit();
  // The eager call already updated some inputs in place (a running mean; kernels need not bump
  // version counters for it): the trace updates them again, so each input that changed gets
  // back the value the eager call left. Unchanged ones are not written: the eager result may
  // hold them for backward. (The tracer needs the tensors themselves: it maps them to graph
  // inputs by identity.)
  std::vector<at::Tensor> saved;
  for (const auto& t : *inputs) saved.push_back(t.detach().clone(at::MemoryFormat::Preserve));
  // The trace's in-place updates of inputs, and their undoing below, are no writes to autograd:
  // the eager result may have saved these tensors for backward, which checks their version
  // counters. The trace runs them with fresh counters; they get theirs back after the undo
  // (declared first: destroyed last).
  struct Versions {
    const std::vector<at::Tensor>& inputs;
    std::vector<c10::VariableVersion> saved;
    explicit Versions(const std::vector<at::Tensor>& in) : inputs(in) {
      for (const auto& t : inputs) {
        saved.push_back(t.unsafeGetTensorImpl()->version_counter());
        if (!t.is_inference())
          t.unsafeGetTensorImpl()->set_version_counter(c10::VariableVersion(uint32_t{0}));
      }
    }
    ~Versions() {
      for (size_t i = 0; i < inputs.size(); ++i)
        if (!inputs[i].is_inference())
          inputs[i].unsafeGetTensorImpl()->set_version_counter(saved[i]);
    }
  } versions{*inputs};
  struct Restore {
    const std::vector<at::Tensor>& inputs;
    const std::vector<at::Tensor>& saved;
    ~Restore() {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < saved.size(); ++i)
        if (!at::equal(inputs[i], saved[i])) inputs[i].detach().copy_(saved[i]);
    }
  } restore_after{*inputs, saved};
  detail::RngRestore rng;  // the trace draws what the eager run drew already
  try {
    torch::jit::Stack stack;
    for (const auto& t : rec.inputs) stack.emplace_back(trace_copy(t));
    for (const auto& t : *inputs) stack.emplace_back(t);
    const size_t n_reads = rec.inputs.size();
    std::optional<std::vector<at::Tensor>> made;  // what the traced run's operations made
    auto traced = [&](torch::jit::Stack in) -> torch::jit::Stack {
      std::vector<at::Tensor> reads;
      for (size_t i = 0; i < n_reads; ++i) reads.push_back(in[i].toTensor());
      detail::Replayer replayer(root, rec, std::move(reads));
      CallResult ret;
      const auto tracing = torch::jit::tracer::getTracingState();
      {
        detail::ObserverScope scope(&replayer);
        TensorDict view = td;
        ret = fn(view);
      }
      // An operator that throws under the tracer leaves it off (libtorch's traced kernels
      // restore the state only on return): the body caught an exception, and operators after
      // it were not traced.
      if (torch::jit::tracer::getTracingState() != tracing) {
        torch::jit::tracer::setTracingState(tracing);
        throw Error(
            "an operator threw under the tracer and the body caught it: a trace cannot replay a "
            "caught exception");
      }
      made = std::move(ret.made);
      if (ret.structure != rec.effects.structure)
        throw Error("under the tracer the function returned another structure");
      auto outs = replayer.outputs(ret.tensors);
      for (const auto& v : outs)
        if (!v.defined()) throw Error("a written or returned tensor is undefined");
      std::vector<c10::IValue> values(outs.begin(), outs.end());
      return {c10::ivalue::Tuple::create(std::move(values))};
    };
    auto [state, outs] = torch::jit::tracer::trace(
        std::move(stack), traced, [](const torch::autograd::Variable&) { return std::string(); },
        /*strict=*/true, /*force_outplace=*/false);
    auto graph = state->graph->copy();
    if (std::string why = detail::unreplayable(*graph, made); !why.empty()) return why;
    graph->insertInput(0, "self");
    torch::jit::Module module = make_module(std::move(graph));
    *module_bytes = detail::module_bytes(module, e.guard, e.effects);
    e.module = std::move(module);
    e.forward = prepare(*e.module);
    if (std::string why = replays_otherwise(rec, e); !why.empty()) {
      e.module.reset();
      e.forward = nullptr;
      return why;
    }
    return "";
  } catch (const std::exception& ex) {
    torch::jit::tracer::abandon();
    std::string msg = ex.what();
    return msg.substr(0, msg.find('\n'));
  } catch (...) {  // an interrupt (the binding's Ctrl-C): no entry is made, the call raises it
    torch::jit::tracer::abandon();
    throw;
  }
}

namespace {

CompiledFunction::StructuredFn structured_of(CompiledFunction::Fn fn) {
  if (!fn) return {};
  return [f = std::move(fn)](TensorDict& td) {
    at::Tensor t = f(td);
    CallResult r;
    if (t.defined()) r.tensors.push_back(std::move(t));
    return r;
  };
}

const void* function_address(const CompiledFunction::Fn& fn) {
  auto* p = fn.target<at::Tensor (*)(TensorDict&)>();
  return p ? reinterpret_cast<const void*>(*p) : nullptr;
}

}  // namespace

CompiledFunction::CompiledFunction(std::string name, Fn fn, CompileOptions options)
    : CompiledFunction(std::move(name), structured_of(fn), std::move(options), fn.target_type(),
                       function_address(fn)) {}

CompiledFunction CompiledFunction::structured(std::string name, StructuredFn fn,
                                              CompileOptions options) {
  const std::type_info& type = fn.target_type();
  return CompiledFunction(std::move(name), std::move(fn), std::move(options), type, nullptr);
}

CompiledFunction::CompiledFunction(std::string name, StructuredFn fn, CompileOptions options,
                                   const std::type_info& type, const void* function)
    : state_(std::make_shared<State>()) {
  if (name.empty() || name.find_first_of(std::string_view("/\0", 2)) != std::string::npos)
    throw ArgumentError("compile: function name " + in_quotes(name) +
                        " must be non-empty, without '/' or NUL");
  if (!fn) throw ArgumentError("compile: function " + in_quotes(name) + " is empty");
  state_->name = std::move(name);
  state_->code_id = detail::code_identity(type, function, options.code_identity);
  state_->fn = std::move(fn);
  state_->options = std::move(options);
  // Two functions under one name share the name's stored graphs only when their code
  // identities agree; otherwise each sees only its own, and the user is told once.
  static std::mutex registry_mu;
  static std::map<std::string, std::string> registry;  // name -> first code identity
  std::lock_guard lock(registry_mu);
  detail::ForkSafeLock held(&state_->mu);  // no other thread sees the state yet
  auto [it, fresh] = registry.emplace(state_->name, state_->code_id);
  if (!fresh && it->second != state_->code_id)
    state_->event(
        fmt::format("another function was compiled under the name \"{}\" in this process (code {} "
                    "!= {}): their graphs are kept apart; give them distinct names",
                    state_->name, it->second, state_->code_id),
        true);
  if (state_->options.cache_limit < 0) state_->options.cache_limit = 0;
}

at::Tensor CompiledFunction::operator()(TensorDict& td) {
  static const std::string no_context;
  State& s = *state_;
  detail::ForkSafeLock lock(&s.mu);
  CallResult r = s.call(td, CallState{{}, no_context, {}}, &s.options.inputs);
  return r.tensors.empty() ? at::Tensor() : std::move(r.tensors[0]);
}

CallResult CompiledFunction::call(TensorDict& td, const CallState& state) {
  State& s = *state_;
  detail::ForkSafeLock lock(&s.mu);
  return s.call(td, state, &state.inputs);
}

// Under mu. `extra`: the graph inputs of this call (state.inputs, or CompileOptions::inputs).
CallResult CompiledFunction::State::call(TensorDict& td, const CallState& state,
                                         const std::vector<at::Tensor>* extra) {
  if (detail::current_observer()) {  // inside another compiled call: its recording sees this one
    ++stats.fallbacks;
    if (!nested_reported) {
      nested_reported = true;
      event("called while another compiled function records or traces: runs eagerly inside it",
            true);
    }
    return fn(td);
  }
  if (!state.eager_reason.empty()) {
    ++stats.fallbacks;
    if (eager_reasons_reported.insert(state.eager_reason).second)
      event("runs eagerly: " + state.eager_reason, true);
    return fn(td);
  }
  inputs = extra;
  context = &state.context;
  ambient = detail::ambient_state();
  TensorDict root = Access::root(td);
  if (!loaded) {
    load_persisted(root);
    count_entries();
  }
  std::vector<at::Tensor> reads;  // guards hold full keys: a sub-dict is checked via its root
  int64_t dim0 = -1;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].guard.check(root, td.prefix(), call_inputs(), &reads, &dim0)) continue;
    if (entries[i].guard.dynamic_dim0 && entries[i].sizes_refused.count(dim0)) continue;
    if (i > 0) std::rotate(entries.begin(), entries.begin() + i, entries.begin() + i + 1);
    Entry& e = entries.front();
    if (!e.module) {
      ++stats.fallbacks;
      return fn(td);
    }
    // A dynamic entry serves a size once a trace at that size proved it (this also checks a
    // loaded one); an exact entry is compared with eager on its first call when asked to.
    if (e.guard.dynamic_dim0 && !e.sizes_run.count(dim0)) return admit_size(e, td, root, dim0);
    if ((options.check_first_run || e.loaded) && !e.checked) return check(e, td, root, reads);
    return replay(e, td, root, reads);
  }
  return miss(td, root);
}

CompilePhase compile_phase(const TensorDict& td) {
  detail::Observer* o = detail::observer_for(&Access::impl(td));
  if (!o) return CompilePhase::None;
  return o->dry() ? CompilePhase::Tracing : CompilePhase::Recording;
}

void compile_unsupported(const TensorDict& td, std::string_view what) {
  if (detail::Observer* o = detail::observer_for(&Access::impl(td)); o && !o->dry())
    o->unsupported(what);
}

CompileStats CompiledFunction::stats() const {
  detail::ForkSafeLock lock(&state_->mu);
  return state_->stats;
}

std::string CompiledFunction::explain() const {
  detail::ForkSafeLock lock(&state_->mu);
  std::string out;
  for (const auto& e : state_->events) out += state_->name + ": " + e + "\n";
  for (size_t i = 0; i < state_->entries.size(); ++i) {
    const auto& e = state_->entries[i];
    out += fmt::format("{}: entry {}: {}{}\n", state_->name, i, e.guard.describe(),
                       e.module ? "" : " [eager: " + e.eager_reason + "]");
  }
  return out;
}

const std::string& CompiledFunction::name() const { return state_->name; }

}  // namespace tdstore
