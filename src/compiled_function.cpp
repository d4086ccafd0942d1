// CompiledFunction: record, trace, cache, replay, persist. The only translation unit with JIT
// headers. Contract in include/tdstore/compile.h.
#include <fmt/format.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/graph_fuser.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/version.h>
#include <zstd.h>

#include <ATen/ops/allclose.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_set>

#include "src/build_id.h"
#include "src/guard.h"
#include "src/lazy_internal.h"
#include "src/observer.h"
#include "src/tensordict_impl.h"
#include "tdstore/compile.h"

namespace tdstore {
namespace {

using detail::Access;
using detail::Effects;
using detail::Guard;
using detail::Observation;
using detail::TensorSpec;
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

// Records what a call observes of one dict (the recording pass).
class Recorder final : public detail::Observer {
 public:
  explicit Recorder(const TensorDict& root) : Observer(&Access::impl(root)), root_(root) {}

  Guard guard;
  std::vector<at::Tensor> read_values;  // tensors of the Read observations, in order

  void read(std::string_view key, const at::Tensor& value) override {
    std::string k(key);
    if (touched_.count(k) || !reads_.insert(k).second) return;
    Observation o;
    o.kind = Observation::Kind::Read;
    o.key = k;
    o.spec = TensorSpec::of(value);
    guard.observations.push_back(std::move(o));
    read_values.push_back(value);
  }

  void probe(std::string_view key, bool prefix, bool present) override {
    std::string k(key);
    for (const auto& t : touched_)  // answers this call influenced itself say nothing of the input
      if (prefix ? t.compare(0, k.size(), k) == 0 : t == k) return;
    if (!probes_.insert((prefix ? "P" : "K") + k).second) return;
    Observation o;
    o.kind = prefix ? Observation::Kind::PrefixProbe : Observation::Kind::Probe;
    o.key = k;
    o.present = present;
    guard.observations.push_back(std::move(o));
  }

  void key_set(std::string_view prefix) override {
    std::string p(prefix);
    if (!key_sets_.insert(p).second) return;
    detail::ObserverScope quiet(nullptr);
    std::set<std::string> initial;
    for (auto& k : root_.keys())
      if (k.compare(0, p.size(), p) == 0) initial.insert(std::move(k));
    for (const auto& [k, existed] : first_touch_) {  // undo this call's own changes
      if (k.compare(0, p.size(), p) != 0) continue;
      if (existed) initial.insert(k);
      else initial.erase(k);
    }
    Observation o;
    o.kind = Observation::Kind::KeySet;
    o.key = p;
    o.keys.assign(initial.begin(), initial.end());
    guard.observations.push_back(std::move(o));
  }

  void write(std::string_view key, const at::Tensor&, bool existed) override {
    std::string k(key);
    touch(k, existed);
    final_[k] = true;
    if (std::find(order_.begin(), order_.end(), k) == order_.end()) order_.push_back(k);
  }

  void erased(std::string_view key) override {
    std::string k(key);
    touch(k, true);
    final_[k] = false;
    if (std::find(order_.begin(), order_.end(), k) == order_.end()) order_.push_back(k);
  }

  std::optional<at::Tensor> lazy(const LazyInfo& request, bool valid) override {
    if (lazy_.insert(request.key).second) {
      Observation o;
      o.kind = Observation::Kind::Lazy;
      o.key = request.key;
      o.present = valid;
      for (const auto& [d, h] : request.deps) o.deps.push_back(d);
      o.version = request.version;
      guard.observations.push_back(std::move(o));
    }
    if (!valid) lazy_writes_[request.key] = request;
    return std::nullopt;
  }

  Effects effects(bool returns) const {
    Effects e;
    e.returns = returns;
    for (const auto& k : order_) {
      if (!final_.at(k)) {
        e.erases.push_back(k);
      } else if (auto it = lazy_writes_.find(k); it != lazy_writes_.end()) {
        e.lazy.push_back(it->second);
      } else {
        e.writes.push_back(k);
      }
    }
    return e;
  }

 private:
  void touch(const std::string& k, bool existed) {
    if (touched_.insert(k).second) first_touch_[k] = existed;
  }

  TensorDict root_;
  std::unordered_set<std::string> reads_, probes_, key_sets_, lazy_;
  std::set<std::string> touched_;
  std::map<std::string, bool> first_touch_;  // key -> present before this call touched it
  std::map<std::string, bool> final_;        // key -> written (true) or erased (false)
  std::vector<std::string> order_;
  std::map<std::string, LazyInfo> lazy_writes_;
};

// During the tracing pass, answers get_or_compute on the proxy as the recording pass saw it:
// a property that was valid is the traced input holding it.
class ProxyObserver final : public detail::Observer {
 public:
  ProxyObserver(const TensorDict& proxy, const Guard& guard)
      : Observer(&Access::impl(proxy)), proxy_(proxy) {
    for (const auto& o : guard.observations)
      if (o.kind == Observation::Kind::Lazy && o.present) valid_.insert(o.key);
  }
  void read(std::string_view, const at::Tensor&) override {}
  void probe(std::string_view, bool, bool) override {}
  void key_set(std::string_view) override {}
  void write(std::string_view, const at::Tensor&, bool) override {}
  void erased(std::string_view) override {}
  std::optional<at::Tensor> lazy(const LazyInfo& request, bool) override {
    if (!valid_.count(request.key)) return std::nullopt;
    detail::ObserverScope quiet(nullptr);
    return proxy_.get(request.key);
  }

 private:
  TensorDict proxy_;
  std::set<std::string> valid_;
};

// An in-memory dict holding what fn may observe: `inputs` for the read keys, and the caller's
// tensors for keys that only need to exist (probed, listed, lazy deps).
TensorDict make_proxy(const TensorDict& root, const Guard& guard, const Effects& effects,
                      const std::vector<at::Tensor>& inputs) {
  detail::ObserverScope quiet(nullptr);
  TensorDict proxy(root.batch_size());
  auto ensure = [&](const std::string& k) {
    if (!proxy.contains(k) && root.contains(k)) proxy.set(k, root.get(k));
  };
  size_t r = 0;
  for (const auto& o : guard.observations) {
    switch (o.kind) {
      case Observation::Kind::Read: proxy.set(o.key, inputs.at(r++)); break;
      case Observation::Kind::Probe: if (o.present) ensure(o.key); break;
      case Observation::Kind::PrefixProbe:
        if (o.present)
          for (const auto& k : root.keys())
            if (k.compare(0, o.key.size(), o.key) == 0) { ensure(k); break; }
        break;
      case Observation::Kind::KeySet: for (const auto& k : o.keys) ensure(k); break;
      case Observation::Kind::Lazy: for (const auto& d : o.deps) ensure(d); break;
    }
  }
  for (const auto& k : effects.erases)  // the recording pass may have erased it already
    if (!proxy.contains(k)) proxy.set(k, at::empty(root.batch_size()));
  return proxy;
}

// A private copy of a read tensor for the tracing pass, so in-place updates happen once.
at::Tensor trace_copy(const at::Tensor& t) {
  at::Tensor c = t.detach().clone(at::MemoryFormat::Preserve);
  if (t.requires_grad()) c.requires_grad_(true);
  return c;
}

// Runs fn on a proxy of `root` holding `inputs`; returns [ret?] + final values of the writes.
std::vector<at::Tensor> run_on_proxy(const CompiledFunction::Fn& fn, const TensorDict& root,
                                     const std::string& prefix, const Guard& guard,
                                     const Effects& effects, const std::vector<at::Tensor>& inputs) {
  TensorDict proxy = make_proxy(root, guard, effects, inputs);
  ProxyObserver watch(proxy, guard);
  at::Tensor ret;
  {
    detail::ObserverScope scope(&watch);
    TensorDict view = prefix.empty() ? proxy : proxy.sub(prefix.substr(0, prefix.size() - 1));
    ret = fn(view);
  }
  detail::ObserverScope quiet(nullptr);
  std::vector<at::Tensor> out;
  if (effects.returns) out.push_back(ret);
  for (const auto& k : effects.writes) out.push_back(proxy.get(k));
  for (const auto& l : effects.lazy) out.push_back(proxy.get(l.key));
  return out;
}

std::string compress(const std::string& raw) {
  std::string out(ZSTD_compressBound(raw.size()), '\0');
  size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 3);
  if (ZSTD_isError(n)) throw Error(std::string("zstd: ") + ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

std::string decompress(std::string_view z) {
  unsigned long long n = ZSTD_getFrameContentSize(z.data(), z.size());
  if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN)
    throw CorruptionError("compiled graph: not a zstd frame");
  std::string out(n, '\0');
  size_t got = ZSTD_decompress(out.data(), n, z.data(), z.size());
  if (ZSTD_isError(got) || got != n) throw CorruptionError("compiled graph: zstd frame is corrupt");
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------------------

struct CompiledFunction::State {
  struct Entry {
    Guard guard;
    Effects effects;
    std::optional<torch::jit::Module> module;  // nullopt: this guard runs eagerly
    torch::jit::Function* forward = nullptr;    // module's forward, executor prepared
    std::string eager_reason;
    bool checked = false;
  };

  std::string name;
  Fn fn;
  CompileOptions options;
  std::mutex mu;
  std::vector<Entry> entries;  // most recently used first
  CompileStats stats;
  std::vector<std::string> events;
  bool limit_reported = false;
  bool loaded = false;
  std::optional<TensorDict> graph_store;  // CompileOptions::store, opened on first use

  storage::Store* store_for(const TensorDict& root);
  std::string catalog_prefix() const {
    return fmt::format("graph/{}/{}/{}/", name, detail::executable_build_id(), TORCH_VERSION);
  }
  void load_persisted(const TensorDict& root);
  void persist(const TensorDict& root, const Entry& e, const std::string& module_bytes);
  at::Tensor replay(Entry& e, TensorDict& td, TensorDict& root, std::vector<at::Tensor>& reads);
  at::Tensor miss(TensorDict& td, TensorDict& root);
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
  for (const auto& [key, value] : store->scan_cache(catalog_prefix())) {
    if (stats.compiles + stats.loads >= options.cache_limit) break;
    try {
      if (value.size() < 4) throw CorruptionError("truncated");
      uint32_t n;
      std::memcpy(&n, value.data(), 4);
      if (value.size() < 4 + size_t{n}) throw CorruptionError("truncated");
      Entry e;
      detail::from_json(json::parse(value.substr(4, n)), &e.guard, &e.effects);
      std::istringstream in(decompress(std::string_view(value).substr(4 + n)));
      e.module = torch::jit::load(in);
      e.forward = prepare(*e.module);
      entries.push_back(std::move(e));
      ++stats.loads;
    } catch (const std::exception& ex) {
      event(fmt::format("skipped stored graph {}: {}", key, ex.what()), true);
    }
  }
  if (stats.loads > 0)
    event(fmt::format("loaded {} graph(s) from {}", stats.loads, store->path().string()), true);
}

void CompiledFunction::State::persist(const TensorDict& root, const Entry& e,
                                      const std::string& module_bytes) {
  storage::Store* store = store_for(root);
  if (!store) return;
  try {
    std::string meta = detail::to_json(e.guard, e.effects).dump();
    uint32_t n = static_cast<uint32_t>(meta.size());
    std::string value(reinterpret_cast<const char*>(&n), 4);
    value += meta;
    value += compress(module_bytes);
    store->put_cache(catalog_prefix() + fmt::format("{:016x}", detail::guard_hash(e.guard)), value);
  } catch (const std::exception& ex) {
    event(fmt::format("graph not persisted: {}", ex.what()), true);
  }
}

at::Tensor CompiledFunction::State::replay(Entry& e, TensorDict& td, TensorDict& root,
                                           std::vector<at::Tensor>& reads) {
  const std::string& prefix = td.prefix();
  torch::jit::Stack stack;
  stack.reserve(1 + reads.size() + options.inputs.size());
  stack.emplace_back(e.module->_ivalue());
  for (const auto& t : reads) stack.emplace_back(t);
  for (const auto& t : options.inputs) stack.emplace_back(t);
  e.forward->run(stack);
  c10::IValue result = std::move(stack.back());
  const auto& outs = result.toTupleRef().elements();
  size_t expected = (e.effects.returns ? 1 : 0) + e.effects.writes.size() + e.effects.lazy.size();
  if (outs.size() != expected)
    throw CorruptionError(fmt::format("{}: graph returned {} values, its entry expects {}", name,
                                      outs.size(), expected));
  if (options.check_first_run && !e.checked) {
    e.checked = true;
    std::vector<at::Tensor> copies;
    for (const auto& t : reads) copies.push_back(trace_copy(t));
    auto eager = run_on_proxy(fn, root, prefix, e.guard, e.effects, copies);
    for (size_t i = 0; i < eager.size(); ++i) {
      const at::Tensor g = outs[i].toTensor();
      bool same = eager[i].sizes() == g.sizes() && eager[i].scalar_type() == g.scalar_type() &&
                  (!at::isFloatingType(g.scalar_type()) && !at::isComplexType(g.scalar_type())
                       ? at::equal(eager[i], g)
                       : at::allclose(eager[i], g, options.rtol, options.atol, true));
      if (!same) {
        e.module.reset();
        e.eager_reason = fmt::format("graph output {} differs from eager on its first run", i);
        event("entry dropped to eager: " + e.eager_reason, true);
        ++stats.fallbacks;
        --stats.entries;
        return fn(td);  // nothing was applied yet: run the call for real
      }
    }
  }
  size_t i = 0;
  at::Tensor ret = e.effects.returns ? outs[i++].toTensor() : at::Tensor();
  for (const auto& k : e.effects.writes) root.set(k, outs[i++].toTensor());
  for (const auto& l : e.effects.lazy) {
    std::vector<std::string> deps;
    for (const auto& [d, h] : l.deps) deps.push_back(d);
    auto request = detail::lazy_request(Access::impl(root), l.key, deps, l.version);
    detail::lazy_store(root, std::move(request), outs[i++].toTensor());
  }
  for (const auto& k : e.effects.erases)
    if (root.contains(k)) root.erase(k);
  return ret;
}

at::Tensor CompiledFunction::State::miss(TensorDict& td, TensorDict& root) {
  std::string why;
  if (!entries.empty()) {
    for (size_t i = 0; i < entries.size() && i < 2; ++i)
      why += fmt::format("{}entry {}: {}", i ? "; " : "", i,
                         entries[i].guard.mismatch(td, root, options.inputs));
  }
  if (stats.compiles + stats.loads >= options.cache_limit) {
    ++stats.fallbacks;
    if (!limit_reported) {
      limit_reported = true;
      event(fmt::format("cache_limit {} reached: calls matching no entry run eagerly ({})",
                        options.cache_limit, why),
            true);
    }
    return fn(td);
  }

  // 1. The eager call, recorded.
  Recorder rec(root);
  rec.guard.grad_mode = at::GradMode::is_enabled();
  rec.guard.prefix = td.prefix();
  for (const auto& t : options.inputs) rec.guard.extra_inputs.push_back(TensorSpec::of(t));
  at::Tensor ret;
  {
    detail::ObserverScope scope(&rec);
    ret = fn(td);
  }
  Entry e;
  e.guard = std::move(rec.guard);
  e.effects = rec.effects(ret.defined());
  event(why.empty() ? fmt::format("compiling ({}; first call)", e.guard.describe())
                    : fmt::format("recompiling ({})", why),
        true);

  // 2. The trace, on private copies of what was read.
  configure_jit();
  std::string prefix = td.prefix();
  std::string module_bytes;
  try {
    torch::jit::Stack inputs;
    for (const auto& t : rec.read_values) inputs.emplace_back(trace_copy(t));
    for (const auto& t : options.inputs) inputs.emplace_back(t);
    const size_t n_reads = rec.read_values.size();
    auto traced = [&](torch::jit::Stack in) -> torch::jit::Stack {
      std::vector<at::Tensor> reads;
      for (size_t i = 0; i < n_reads; ++i) reads.push_back(in[i].toTensor());
      auto outs = run_on_proxy(fn, root, prefix, e.guard, e.effects, reads);
      std::vector<c10::IValue> values(outs.begin(), outs.end());
      for (const auto& v : outs)
        if (!v.defined()) throw Error("a written or returned tensor is undefined");
      return {c10::ivalue::Tuple::create(std::move(values))};
    };
    auto [state, outs] = torch::jit::tracer::trace(
        std::move(inputs), traced, [](const torch::autograd::Variable&) { return std::string(); },
        /*strict=*/true, /*force_outplace=*/false);
    auto cu = std::make_shared<torch::jit::CompilationUnit>();
    auto cls = c10::ClassType::create("__torch__.tdstore.Graph", cu, /*is_module=*/true);
    torch::jit::Module module(cu, cls);
    auto graph = state->graph->copy();
    graph->insertInput(0, "self")->setType(cls);
    cls->addMethod(cu->create_function("__torch__.tdstore.Graph.forward", graph));
    std::ostringstream os;
    module.save(os, {{"tdstore.json", detail::to_json(e.guard, e.effects).dump()},
                     {"torch_version", TORCH_VERSION}});
    module_bytes = os.str();
    e.module = std::move(module);
    e.forward = prepare(*e.module);
    ++stats.compiles;
  } catch (const std::exception& ex) {
    torch::jit::tracer::abandon();
    std::string msg = ex.what();
    e.eager_reason = "untraceable: " + msg.substr(0, msg.find('\n'));
    event(e.eager_reason + " (this guard runs eagerly)", true);
  }
  if (e.module) {
    persist(root, e, module_bytes);
    ++stats.entries;
  }
  entries.insert(entries.begin(), std::move(e));
  return ret;
}

CompiledFunction::CompiledFunction(std::string name, Fn fn, CompileOptions options)
    : state_(std::make_shared<State>()) {
  state_->name = std::move(name);
  state_->fn = std::move(fn);
  state_->options = std::move(options);
  if (state_->options.cache_limit < 0) state_->options.cache_limit = 0;
}

at::Tensor CompiledFunction::operator()(TensorDict& td) {
  State& s = *state_;
  std::lock_guard lock(s.mu);
  TensorDict root = Access::root(td);
  if (!s.loaded) {
    s.load_persisted(root);
    s.stats.entries = static_cast<int64_t>(s.entries.size());
  }
  std::vector<at::Tensor> reads;  // guards hold full keys: a sub-dict is checked via its root
  for (size_t i = 0; i < s.entries.size(); ++i) {
    if (!s.entries[i].guard.check(td, root, s.options.inputs, &reads)) continue;
    if (i > 0) std::rotate(s.entries.begin(), s.entries.begin() + i, s.entries.begin() + i + 1);
    State::Entry& e = s.entries.front();
    if (!e.module) {
      ++s.stats.fallbacks;
      return s.fn(td);
    }
    ++s.stats.hits;
    return s.replay(e, td, root, reads);
  }
  return s.miss(td, root);
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
