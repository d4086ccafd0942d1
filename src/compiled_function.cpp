// CompiledFunction: record, trace, cache, replay, persist. The only translation unit with JIT
// headers. Contract in include/tdstore/compile.h.
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
#include "src/fork_safe_mutex.h"
#include "src/guard.h"
#include "src/lazy_internal.h"
#include "src/observer.h"
#include "src/recording.h"
#include "src/tensordict_impl.h"
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

namespace {

using detail::Access;
using detail::Effects;
using detail::Guard;
using detail::Recording;
using detail::TensorSpec;
using detail::trace_copy;
using json = nlohmann::json;

bool log_recompiles() {
  static const bool on = [] {
    const char* v = std::getenv("TDSTORE_LOGS");
    return v && std::string_view(v).find("recompiles") != std::string_view::npos;
  }();
  return on;
}

// Debian's libtorch is built without LLVM: NNC CPU fusion would throw or crawl. Off, once.
void configure_jit() {
  static std::once_flag once;
  std::call_once(once, [] {
    torch::jit::overrideCanFuseOnCPULegacy(false);
    torch::jit::setTensorExprFuserEnabled(false);
  });
}

// Creates the graph's executor now, as the simple (non-profiling) executor: on small graphs it
// costs about a third of the profiling executor's per-call overhead, and it differentiates
// graphs the same way. The mode is process-wide, so it is switched only around the creation.
torch::jit::Function* prepare(torch::jit::Module& module) {
  static std::mutex mu;
  auto& fn = torch::jit::toGraphFunction(module.get_method("forward").function());
  std::lock_guard lock(mu);
  bool saved = torch::jit::getExecutorMode();
  torch::jit::getExecutorMode() = false;
  fn.get_executor();
  torch::jit::getExecutorMode() = saved;
  return &fn;
}

// A module whose forward is `graph` (its first input is self, retyped to the new module).
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

// A copy of m's graph without the sizes and strides the trace recorded in its types.
std::shared_ptr<torch::jit::Graph> shapeless(const torch::jit::Module& m) {
  auto g = forward_graph(m)->copy();
  torch::jit::EraseShapeInformation(g);
  return g;
}

// m's forward as its serialized form reads back: a traced graph and the same graph loaded from
// a store print alike only after both went through the serializer (it hoists constants and
// renames values).
std::shared_ptr<torch::jit::Graph> as_serialized(const torch::jit::Module& m) {
  std::stringstream bytes;
  m.save(bytes);
  torch::jit::Module back = torch::jit::load(bytes);
  auto g = forward_graph(back)->copy();
  torch::jit::EraseShapeInformation(g);
  return g;
}

// Whether two traces are one graph but for the sizes in their types: the same nodes, the same
// non-tensor constants (a size read into C++ becomes one), equal tensor constants.
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

}  // namespace

// ------------------------------------------------------------------------------------------

struct TDSTORE_HIDDEN CompiledFunction::State {
  struct Entry {
    Guard guard;
    Effects effects;
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
  const std::vector<at::Tensor>* inputs = nullptr;
  std::string ambient;
  const std::string* context = nullptr;
  detail::CallInputs call_inputs() const { return {*inputs, ambient, *context}; }
  std::set<std::string> eager_reasons_reported;
  std::string code_id;
  // A function may call itself (the nested call runs eagerly); a child forked while another
  // thread holds it gets a fresh one.
  detail::ForkSafeRecursiveMutex mu;
  std::vector<Entry> entries;  // most recently used first
  CompileStats stats;
  std::vector<std::string> events;
  bool limit_reported = false, nested_reported = false, loaded = false;
  std::optional<TensorDict> graph_store;  // CompileOptions::store, opened on first use

  storage::Store* store_for(const TensorDict& root);
  std::string catalog_prefix() const {
    return fmt::format("graph/{}/{}/{}/", name, code_id, TORCH_VERSION);
  }
  std::string catalog_key(const Entry& e) const {
    return catalog_prefix() + fmt::format("{:016x}", detail::guard_hash(e.guard));
  }
  void load_persisted(const TensorDict& root);
  void persist(const TensorDict& root, const Entry& e, const std::string& module_bytes);
  CallResult record(TensorDict& td, const TensorDict& root, Recording* rec);
  std::string trace(const Recording& rec, const TensorDict& td, const TensorDict& root, Entry& e,
                    std::string* module_bytes);
  std::vector<at::Tensor> run_graph(Entry& e, const std::vector<at::Tensor>& reads,
                                    const std::vector<at::Tensor>& extra);
  void apply(const Entry& e, TensorDict& root, const std::vector<at::Tensor>& outs);
  std::string differs(const Entry& e, const Recording& rec, const CallResult& ret,
                      const TensorDict& root, const std::vector<at::Tensor>& outs,
                      const std::vector<at::Tensor>& copies) const;
  CallResult replay(Entry& e, TensorDict& root, const std::vector<at::Tensor>& reads);
  CallResult check(Entry& e, TensorDict& td, TensorDict& root,
                   const std::vector<at::Tensor>& reads);
  CallResult admit_size(Entry& e, TensorDict& td, TensorDict& root, int64_t dim0);
  CallResult miss(TensorDict& td, TensorDict& root);
  CallResult call(TensorDict& td, const CallState& state, const std::vector<at::Tensor>* extra);
  void make_dynamic(const TensorDict& root, size_t fresh);
  void count_entries() {
    stats.entries = std::count_if(entries.begin(), entries.end(),
                                  [](const Entry& e) { return e.module.has_value(); });
  }
  void event(std::string text, bool log) {
    if (log && log_recompiles()) std::cerr << name << ": " << text << "\n";
    events.push_back(std::move(text));
  }
};

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
  std::vector<std::string> damaged;
  auto records = store->scan_cache(std::string(storage::kCachePrefix) + name + "/", &damaged);
  for (const auto& key : damaged)
    event(fmt::format("skipped damaged stored graph record {} (`tdstore cache --clear` removes it)",
                      key),
          true);
  for (const auto& [key, value] : records) {
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
    } catch (const std::exception& ex) {
      event(fmt::format("skipped stored graph {}: {}", key, ex.what()), true);
    }
  }
  if (stats.loads > 0)
    event(fmt::format("loaded {} graph(s) from {}", stats.loads, store->path().string()), true);
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
    store->put_cache(catalog_key(e), storage::encode_graph_record(
                                         detail::to_json(e.guard, e.effects), module_bytes));
  } catch (const std::exception& ex) {
    event(fmt::format("graph not persisted: {}", ex.what()), true);
  }
}

CallResult CompiledFunction::State::record(TensorDict& td, const TensorDict& root, Recording* rec) {
  detail::Recorder recorder(root, td.prefix(), *inputs);
  CallResult ret;
  {
    detail::ObserverScope scope(&recorder);
    ret = fn(td);
  }
  for (const auto& t : ret.tensors)
    if (!t.defined()) throw Error(fmt::format("{}: returned an undefined tensor", name));
  *rec = recorder.finish(static_cast<int64_t>(ret.tensors.size()));
  rec->effects.structure = ret.structure;
  rec->guard.ambient = ambient;
  rec->guard.context = *context;
  return ret;
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
  struct Restore {
    const std::vector<at::Tensor>& inputs;
    const std::vector<at::Tensor>& saved;
    ~Restore() {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < saved.size(); ++i)
        if (!at::equal(inputs[i], saved[i])) inputs[i].detach().copy_(saved[i]);
    }
  } restore_after{*inputs, saved};
  try {
    torch::jit::Stack stack;
    for (const auto& t : rec.inputs) stack.emplace_back(trace_copy(t));
    for (const auto& t : *inputs) stack.emplace_back(t);
    const size_t n_reads = rec.inputs.size();
    auto traced = [&](torch::jit::Stack in) -> torch::jit::Stack {
      std::vector<at::Tensor> reads;
      for (size_t i = 0; i < n_reads; ++i) reads.push_back(in[i].toTensor());
      detail::Replayer replayer(root, rec, std::move(reads));
      CallResult ret;
      {
        detail::ObserverScope scope(&replayer);
        TensorDict view = td;
        ret = fn(view);
      }
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
    graph->insertInput(0, "self");
    torch::jit::Module module = make_module(std::move(graph));
    *module_bytes = tdstore::module_bytes(module, e.guard, e.effects);
    e.module = std::move(module);
    e.forward = prepare(*e.module);
    return "";
  } catch (const std::exception& ex) {
    torch::jit::tracer::abandon();
    std::string msg = ex.what();
    return msg.substr(0, msg.find('\n'));
  }
}

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

CallResult CompiledFunction::State::replay(Entry& e, TensorDict& root,
                                           const std::vector<at::Tensor>& reads) {
  auto outs = run_graph(e, reads, *inputs);
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
    if (storage::Store* store = store_for(root)) {
      try {
        store->put_cache(catalog_key(e), std::nullopt);
      } catch (const std::exception& ex) {  // the result is eager's either way
        event(fmt::format("stored graph not removed: {}", ex.what()), true);
      }
    }
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
    if (storage::Store* store = store_for(root)) {
      try {
        store->put_cache(catalog_key(a), std::nullopt);
        store->put_cache(catalog_key(b), std::nullopt);
      } catch (const std::exception& ex) {
        event(fmt::format("exact graphs not removed from the store: {}", ex.what()), true);
      }
    }
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
    throw Error("compile: function name " + in_quotes(name) +
                " must be non-empty, without '/' or NUL");
  if (!fn) throw Error("compile: function " + in_quotes(name) + " is empty");
  state_->name = std::move(name);
  state_->code_id = detail::code_identity(type, function, options.code_identity);
  state_->fn = std::move(fn);
  state_->options = std::move(options);
  // Two functions under one name share the name's stored graphs only when their code
  // identities agree; otherwise each sees only its own, and the user is told once.
  static std::mutex registry_mu;
  static std::map<std::string, std::string> registry;  // name -> first code identity
  std::lock_guard lock(registry_mu);
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
  std::lock_guard lock(s.mu);
  CallResult r = s.call(td, CallState{{}, no_context, {}}, &s.options.inputs);
  return r.tensors.empty() ? at::Tensor() : std::move(r.tensors[0]);
}

CallResult CompiledFunction::call(TensorDict& td, const CallState& state) {
  State& s = *state_;
  std::lock_guard lock(s.mu);
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
    return replay(e, root, reads);
  }
  return miss(td, root);
}

void compile_unsupported(const TensorDict& td, std::string_view what) {
  if (detail::Observer* o = detail::observer_for(&Access::impl(td)); o && !o->dry())
    o->unsupported(what);
}

CompileStats CompiledFunction::stats() const {
  std::lock_guard lock(state_->mu);
  return state_->stats;
}

std::string CompiledFunction::explain() const {
  std::lock_guard lock(state_->mu);
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
