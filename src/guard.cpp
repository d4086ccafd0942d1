#include "src/guard.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "src/dtype_map.h"
#include "src/lazy_internal.h"
#include "storage/checksum.h"
#include "storage/graph_meta.h"
#include "storage/json_numbers.h"
#include "storage/messages.h"

namespace tdstore::detail {
namespace {

using json = nlohmann::json;

std::string dtype_str(c10::ScalarType t) {
  auto code = to_storage_dtype(t);
  return code ? std::string(storage::dtype_name(*code)) : std::string(c10::toString(t));
}

c10::ScalarType dtype_from(const std::string& name) {
  auto code = storage::dtype_from_name(name);
  if (!code) throw CorruptionError("unknown dtype " + in_quotes(name));
  return to_scalar_type(*code);
}

std::string q(std::string_view key) { return json(std::string(key)).dump(); }

const char* read_name(ReadKind k) {
  switch (k) {
    case ReadKind::Get:
      return "get";
    case ReadKind::Stored:
      return "get_ragged";
    case ReadKind::LazyMemory:
      return "lazy_memory";
  }
  return "?";
}

ReadKind read_from_name(const std::string& name) {
  for (ReadKind k : {ReadKind::Get, ReadKind::Stored, ReadKind::LazyMemory})
    if (name == read_name(k)) return k;
  throw CorruptionError("unknown read kind " + in_quotes(name));
}

json answer_json(const Answer& a) {
  return std::visit(
      [](const auto& v) -> json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::optional<std::string>>)
          return v ? json(*v) : json(nullptr);
        else
          return json(v);
      },
      a);
}

Answer answer_from(Query query, const json& j) {
  switch (query) {
    case Query::Contains:
    case Query::HasPrefix:
    case Query::IsRagged:
    case Query::IsPersistent:
    case Query::IsWritable:
      return j.get<bool>();
    case Query::Count:
    case Query::Generation:
      return storage::json_int(j);
    case Query::Path:
      return j.get<std::string>();
    case Query::Attr:
      return j.is_null() ? std::optional<std::string>() : std::optional(j.get<std::string>());
    case Query::Keys:
    case Query::AttrNames:
      return j.get<std::vector<std::string>>();
    case Query::BatchSize:
      return storage::json_ints<int64_t>(j);
  }
  throw CorruptionError("unknown query");
}

// "contains(\"mask\")", "keys(\"next/\")", "batch_size()".
std::string call_name(const Observation& o) {
  switch (o.kind) {
    case Observation::Kind::Read:
      return fmt::format("{}({})", read_name(o.read), q(o.key));
    case Observation::Kind::Lazy:
      return fmt::format("get_or_compute({})", q(o.key));
    case Observation::Kind::Query:
      break;
  }
  return fmt::format("{}({})", query_name(o.query), o.key.empty() ? "" : q(o.key));
}

std::string brief(const json& j) {
  std::string s = j.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

bool excluded(const Observation& o, const std::string& key) {
  return std::binary_search(o.exclude.begin(), o.exclude.end(), key);
}

// The observation's answer on the dict now, exclusions applied; throws what the call throws.
Answer answer_now(const TensorDict::Impl& impl, const Observation& o) {
  if (o.kind == Observation::Kind::Lazy)
    return lazy_valid(impl, lazy_request(impl, o.key, o.deps, o.version));
  if (o.exclude.empty() ||
      (o.query != Query::HasPrefix && o.query != Query::Keys && o.query != Query::Count))
    return ask(impl, o.query, o.key);
  std::vector<std::string> keys = impl.keys_under(o.key);
  std::erase_if(keys, [&](const std::string& k) { return excluded(o, k); });
  if (o.query == Query::HasPrefix) return !keys.empty();
  if (o.query == Query::Count) return static_cast<int64_t>(keys.size());
  return keys;
}

at::Tensor read_now(const TensorDict::Impl& impl, const Observation& o) {
  switch (o.read) {
    case ReadKind::Get:
      return impl.get(o.key);
    case ReadKind::Stored:
      return impl.stored(o.key);
    case ReadKind::LazyMemory:
      return lazy_memory_result(impl, o.key);
  }
  throw Error("unknown read kind");
}

// Binds *dim0 to v, or checks v against it; a dynamic guard's one size.
bool bind_dim0(int64_t* dim0, int64_t v) {
  if (*dim0 < 0) *dim0 = v;
  return *dim0 == v;
}

// A BatchSize answer of a dynamic guard: [kDynamicSize, rest...] accepts [B, rest...].
bool answer_matches(const Observation& o, const Answer& a, int64_t* dim0) {
  if (a == o.answer) {
    const auto* want = std::get_if<std::vector<int64_t>>(&o.answer);
    return !(dim0 && want && !want->empty() && (*want)[0] == kDynamicSize);  // a literal -1 never
  }
  if (!dim0 || o.kind != Observation::Kind::Query || o.query != Query::BatchSize) return false;
  const auto& want = std::get<std::vector<int64_t>>(o.answer);
  const auto* got = std::get_if<std::vector<int64_t>>(&a);
  if (!got || got->size() != want.size() || want.empty() || want[0] != kDynamicSize) return false;
  if (!std::equal(want.begin() + 1, want.end(), got->begin() + 1)) return false;
  return bind_dim0(dim0, (*got)[0]);
}

// Whether o holds now; a successful read goes to *read. When it does not and why != nullptr,
// *why says how. dim0: the bound size of a dynamic guard (nullptr for an exact one).
bool holds(const TensorDict::Impl& impl, const Observation& o, at::Tensor* read, std::string* why,
           int64_t* dim0) {
  std::optional<Failure> failed;
  at::Tensor t;
  Answer a;
  try {
    if (o.kind == Observation::Kind::Read)
      t = read_now(impl, o);
    else
      a = answer_now(impl, o);
  } catch (const Error& e) {
    failed = Failure{error_kind(e), e.what()};
  }
  if (o.failure || failed) {
    if (o.failure == failed) return true;
    if (why) {
      if (!failed)
        *why = fmt::format("{} threw {}, now succeeds", call_name(o),
                           error_kind_name(o.failure->kind));
      else if (!o.failure)
        *why = fmt::format("{} now throws {}: {}", call_name(o), error_kind_name(failed->kind),
                           failed->message);
      else
        *why = fmt::format("{} throws another error: {}", call_name(o), failed->message);
    }
    return false;
  }
  if (o.kind == Observation::Kind::Read) {
    if (!(dim0 ? o.spec.matches(t, dim0) : o.spec.matches(t))) {
      if (why) {
        *why = call_name(o) + " " + o.spec.diff(t);
        if (dim0 && *dim0 >= 0 && !o.spec.sizes.empty() && o.spec.sizes[0] == kDynamicSize)
          *why += fmt::format(" (dim 0 must equal the other dynamic reads' {})", *dim0);
      }
      return false;
    }
    *read = std::move(t);
    return true;
  }
  if (answer_matches(o, a, dim0)) return true;
  if (why) {
    if (const auto* keys = std::get_if<std::vector<std::string>>(&a);
        keys && o.query == Query::Keys)
      *why = fmt::format("{} changed ({} keys != {} keys)", call_name(o),
                         std::get<std::vector<std::string>>(o.answer).size(), keys->size());
    else if (o.kind == Observation::Kind::Lazy)
      *why = fmt::format("{} {} != {}", call_name(o), std::get<bool>(o.answer) ? "valid" : "stale",
                         std::get<bool>(a) ? "valid" : "stale");
    else
      *why = fmt::format("{} {} != {}", call_name(o), brief(answer_json(o.answer)),
                         brief(answer_json(a)));
  }
  return false;
}

json spec_json(const TensorSpec& s) {
  return {{"dtype", dtype_str(s.dtype)},
          {"sizes", s.sizes},
          {"strides", s.strides},
          {"device", s.device.str()},
          {"requires_grad", s.requires_grad}};
}

TensorSpec spec_from(const storage::GraphSpec& m) {
  TensorSpec s;
  s.dtype = dtype_from(m.dtype);
  s.sizes = m.sizes;
  s.strides = m.strides;
  s.device = c10::Device(m.device);
  s.requires_grad = m.requires_grad;
  return s;
}

json guard_json(const Guard& g) {
  json obs = json::array();
  for (const auto& o : g.observations) {
    json j;
    switch (o.kind) {
      case Observation::Kind::Read:
        j = {{"read", read_name(o.read)}, {"key", o.key}};
        if (!o.failure) j["spec"] = spec_json(o.spec);
        break;
      case Observation::Kind::Query:
        j = {{"query", query_name(o.query)}, {"key", o.key}};
        if (!o.failure) j["answer"] = answer_json(o.answer);
        if (!o.exclude.empty()) j["exclude"] = o.exclude;
        break;
      case Observation::Kind::Lazy:
        j = {{"lazy", o.key}, {"deps", o.deps}, {"version", o.version}};
        if (!o.failure) j["answer"] = std::get<bool>(o.answer);
        break;
    }
    if (o.failure)
      j["error"] = {{"kind", error_kind_name(o.failure->kind)}, {"message", o.failure->message}};
    obs.push_back(std::move(j));
  }
  json extra = json::array();
  for (const auto& s : g.extra_inputs) extra.push_back(spec_json(s));
  json j = {
      {"prefix", g.prefix}, {"observations", obs}, {"inputs", extra}, {"grad_mode", g.grad_mode}};
  if (g.dynamic_dim0) j["dynamic_dim0"] = true;      // absent in exact guards: their hashes stay
  if (!g.ambient.empty()) j["ambient"] = g.ambient;  // absent in the default state, likewise
  if (!g.context.empty()) j["context"] = g.context;
  return j;
}

}  // namespace

TensorSpec TensorSpec::of(const at::Tensor& t) {
  TensorSpec s;
  s.dtype = t.scalar_type();
  s.sizes.assign(t.sizes().begin(), t.sizes().end());
  s.strides.assign(t.strides().begin(), t.strides().end());
  s.device = t.device();
  s.requires_grad = t.requires_grad();
  return s;
}

bool TensorSpec::matches(const at::Tensor& t) const {
  return t.defined() && t.scalar_type() == dtype && t.sizes() == c10::IntArrayRef(sizes) &&
         t.strides() == c10::IntArrayRef(strides) && t.device() == device &&
         t.requires_grad() == requires_grad;
}

bool TensorSpec::matches(const at::Tensor& t, int64_t* dim0) const {
  if (sizes.empty() || sizes[0] != kDynamicSize) return matches(t);
  if (!t.defined() || t.scalar_type() != dtype || t.dim() != static_cast<int64_t>(sizes.size()) ||
      t.strides() != c10::IntArrayRef(strides) || t.device() != device ||
      t.requires_grad() != requires_grad)
    return false;
  if (!std::equal(sizes.begin() + 1, sizes.end(), t.sizes().begin() + 1)) return false;
  return bind_dim0(dim0, t.size(0));
}

std::string TensorSpec::diff(const at::Tensor& t) const {
  if (!t.defined()) return "undefined tensor";
  if (t.scalar_type() != dtype)
    return fmt::format("dtype {} != {}", dtype_str(dtype), dtype_str(t.scalar_type()));
  if (t.dim() != static_cast<int64_t>(sizes.size()) ||
      !std::equal(sizes.begin(), sizes.end(), t.sizes().begin(),
                  [](int64_t want, int64_t got) { return want == kDynamicSize || want == got; })) {
    std::vector<std::string> want;
    for (int64_t v : sizes) want.push_back(v == kDynamicSize ? "*" : std::to_string(v));
    return fmt::format("sizes [{}] != [{}]", fmt::join(want, ", "), fmt::join(t.sizes(), ", "));
  }
  if (t.strides() != c10::IntArrayRef(strides))
    return fmt::format("strides [{}] != [{}]", fmt::join(strides, ", "),
                       fmt::join(t.strides(), ", "));
  if (t.device() != device) return fmt::format("device {} != {}", device.str(), t.device().str());
  if (t.requires_grad() != requires_grad)
    return fmt::format("requires_grad {} != {}", requires_grad, t.requires_grad());
  return "";
}

bool Guard::check(const TensorDict& root, const std::string& call_prefix, const CallInputs& call,
                  std::vector<at::Tensor>* reads, int64_t* dim0_out) const {
  const auto& extra = call.extra;
  if (at::GradMode::is_enabled() != grad_mode || extra.size() != extra_inputs.size() ||
      call_prefix != prefix || call.ambient != ambient || call.context != context)
    return false;
  for (size_t i = 0; i < extra.size(); ++i)
    if (!extra_inputs[i].matches(extra[i])) return false;
  reads->clear();
  const auto& impl = Access::impl(root);
  at::Tensor t;
  int64_t dim0 = -1;
  for (const auto& o : observations) {
    if (!holds(impl, o, &t, nullptr, dynamic_dim0 ? &dim0 : nullptr)) return false;
    if (t.defined()) reads->push_back(std::move(t));
    t.reset();
  }
  if (dim0_out) *dim0_out = dim0;
  return true;
}

bool Guard::covers(const Guard& g) const {
  if (!dynamic_dim0) return *this == g;
  if (g.dynamic_dim0 || prefix != g.prefix || grad_mode != g.grad_mode || ambient != g.ambient ||
      context != g.context || extra_inputs != g.extra_inputs ||
      observations.size() != g.observations.size())
    return false;
  int64_t dim0 = -1;
  for (size_t i = 0; i < observations.size(); ++i) {
    const Observation &o = observations[i], &x = g.observations[i];
    if (o == x) continue;
    Observation y = x;  // x with this guard's dynamic dim 0, when x's size binds consistently
    if (o.kind == Observation::Kind::Read && !o.failure && !x.failure && !o.spec.sizes.empty() &&
        o.spec.sizes[0] == kDynamicSize && !x.spec.sizes.empty()) {
      if (!bind_dim0(&dim0, x.spec.sizes[0])) return false;
      y.spec.sizes[0] = kDynamicSize;
    } else if (o.kind == Observation::Kind::Query && o.query == Query::BatchSize && !o.failure &&
               !x.failure) {
      auto& b = std::get<std::vector<int64_t>>(y.answer);
      if (b.empty() || !bind_dim0(&dim0, b[0])) return false;
      b[0] = kDynamicSize;
    }
    if (!(o == y)) return false;
  }
  return true;
}

std::optional<Guard> generalize_dim0(const Guard& a, const Guard& b, int64_t* from, int64_t* to) {
  if (a.dynamic_dim0 || b.dynamic_dim0 || a.prefix != b.prefix || a.grad_mode != b.grad_mode ||
      a.ambient != b.ambient || a.context != b.context || a.extra_inputs != b.extra_inputs ||
      a.observations.size() != b.observations.size())
    return std::nullopt;
  Guard out = a;
  out.dynamic_dim0 = true;
  int64_t b1 = -1, b2 = -1;
  bool read_changed = false;
  // One size to one other size, everywhere it changes.
  auto pair = [&](int64_t x, int64_t y) {
    if (b1 < 0) b1 = x, b2 = y;
    return x == b1 && y == b2;
  };
  for (size_t i = 0; i < a.observations.size(); ++i) {
    const Observation &x = a.observations[i], &y = b.observations[i];
    if (x == y) continue;
    Observation moved = y;
    if (x.kind == Observation::Kind::Read && y.kind == Observation::Kind::Read && !x.failure &&
        !y.failure && x.spec.sizes.size() == y.spec.sizes.size() && !x.spec.sizes.empty() &&
        x.spec.sizes[0] != y.spec.sizes[0] && x.spec.sizes[0] >= 0 && y.spec.sizes[0] >= 0) {
      if (!pair(x.spec.sizes[0], y.spec.sizes[0])) return std::nullopt;
      moved.spec.sizes[0] = x.spec.sizes[0];
      read_changed = true;
      out.observations[i].spec.sizes[0] = kDynamicSize;
    } else if (x.kind == Observation::Kind::Query && x.query == Query::BatchSize &&
               y.kind == x.kind && y.query == x.query && !x.failure && !y.failure) {
      const auto& bx = std::get<std::vector<int64_t>>(x.answer);
      const auto& by = std::get<std::vector<int64_t>>(y.answer);
      if (bx.empty() || by.size() != bx.size() || !pair(bx[0], by[0])) return std::nullopt;
      std::get<std::vector<int64_t>>(moved.answer)[0] = bx[0];
      std::get<std::vector<int64_t>>(out.observations[i].answer)[0] = kDynamicSize;
    }
    if (!(moved == x)) return std::nullopt;  // something else differs
  }
  if (!read_changed || b1 == b2) return std::nullopt;
  *from = b1;
  *to = b2;
  return out;
}

std::string Guard::mismatch(const TensorDict& root, const std::string& call_prefix,
                            const CallInputs& call) const {
  const auto& extra = call.extra;
  if (call_prefix != prefix)
    return fmt::format("called on prefix {} != {}", q(prefix), q(call_prefix));
  if (at::GradMode::is_enabled() != grad_mode)
    return fmt::format("grad mode {} != {}", grad_mode ? "on" : "off", grad_mode ? "off" : "on");
  if (call.ambient != ambient)
    return fmt::format("ambient state {} != {}", q(ambient.empty() ? "default" : ambient),
                       q(call.ambient.empty() ? "default" : call.ambient));
  if (call.context != context) return fmt::format("context {} != {}", q(context), q(call.context));
  if (extra.size() != extra_inputs.size())
    return fmt::format("{} inputs != {}", extra_inputs.size(), extra.size());
  for (size_t i = 0; i < extra.size(); ++i)
    if (auto d = extra_inputs[i].diff(extra[i]); !d.empty())
      return fmt::format("input {} {}", i, d);
  const auto& impl = Access::impl(root);
  std::string why;
  at::Tensor t;
  int64_t dim0 = -1;
  for (const auto& o : observations)
    if (!holds(impl, o, &t, &why, dynamic_dim0 ? &dim0 : nullptr)) return why;
  return "";
}

std::string Guard::describe() const {
  std::vector<std::string> reads, asks;
  for (const auto& o : observations) {
    if (o.kind == Observation::Kind::Read && !o.failure)
      reads.push_back(o.key);
    else
      asks.push_back(call_name(o));
  }
  std::string out =
      reads.empty() ? "reads nothing" : fmt::format("reads {}", fmt::join(reads, ", "));
  if (!asks.empty()) out += fmt::format("; asks {}", fmt::join(asks, ", "));
  if (dynamic_dim0) out += "; any size of dim 0";
  if (!ambient.empty()) out += "; under " + ambient;
  if (!context.empty()) out += fmt::format("; context {}", context.substr(0, 16));
  return out;
}

bool Effects::operator==(const Effects& o) const {
  if (erases != o.erases || writes != o.writes || lazy_reuses != o.lazy_reuses ||
      returns != o.returns || structure != o.structure || lazy.size() != o.lazy.size())
    return false;
  for (size_t i = 0; i < lazy.size(); ++i) {
    const auto &a = lazy[i], &b = o.lazy[i];
    if (a.key != b.key || a.version != b.version || a.deps.size() != b.deps.size()) return false;
    for (size_t d = 0; d < a.deps.size(); ++d)
      if (a.deps[d].first != b.deps[d].first) return false;
  }
  return true;
}

json to_json(const Guard& g, const Effects& e) {
  json lazy = json::array();
  for (const auto& l : e.lazy) {
    json deps = json::array();
    for (const auto& [k, h] : l.deps) deps.push_back(k);
    lazy.push_back({{"key", l.key}, {"deps", deps}, {"version", l.version}});
  }
  json j = guard_json(g);
  j["effects"] = {{"erases", e.erases},
                  {"writes", e.writes},
                  {"lazy_writes", lazy},
                  {"lazy_reuses", e.lazy_reuses}};
  if (e.structure.empty()) {
    j["effects"]["returns"] = e.returns > 0;  // a C++ function returns one tensor or none
  } else {
    j["effects"]["returns"] = e.returns;
    j["effects"]["structure"] = e.structure;
  }
  return j;
}

void from_json(const json& j, Guard* g, Effects* e) {
  *g = Guard();
  *e = Effects();
  const storage::GraphMeta m = storage::parse_graph_meta(j);
  try {
    g->prefix = m.prefix;
    for (const auto& mo : m.observations) {
      Observation o;
      o.key = mo.key;
      switch (mo.kind) {
        case storage::GraphObservation::Kind::Read:
          o.kind = Observation::Kind::Read;
          o.read = read_from_name(mo.call);
          if (!mo.error) o.spec = spec_from(mo.spec);
          break;
        case storage::GraphObservation::Kind::Query: {
          o.kind = Observation::Kind::Query;
          auto query = query_from_name(mo.call);
          if (!query) throw CorruptionError("unknown query " + in_quotes(mo.call));
          o.query = *query;
          if (!mo.error) o.answer = answer_from(o.query, mo.answer);
          o.exclude = mo.exclude;
          break;
        }
        case storage::GraphObservation::Kind::Lazy:
          o.kind = Observation::Kind::Lazy;
          o.deps = mo.deps;
          o.version = mo.version;
          if (!mo.error) o.answer = mo.answer.get<bool>();
          break;
      }
      if (mo.error) {
        auto kind = error_kind_from_name(mo.error->first);
        if (!kind) throw CorruptionError("unknown error kind " + in_quotes(mo.error->first));
        o.failure = Failure{*kind, mo.error->second};
      }
      g->observations.push_back(std::move(o));
    }
    for (const auto& s : m.inputs) g->extra_inputs.push_back(spec_from(s));
    g->grad_mode = m.grad_mode;
    g->dynamic_dim0 = m.dynamic_dim0;
    g->ambient = m.ambient;
    g->context = m.context;
    for (const auto& o : g->observations) {  // kDynamicSize only where a dynamic guard allows it
      const std::vector<int64_t>* sizes = nullptr;
      if (o.kind == Observation::Kind::Read && !o.failure) sizes = &o.spec.sizes;
      if (o.kind == Observation::Kind::Query && o.query == Query::BatchSize && !o.failure)
        sizes = &std::get<std::vector<int64_t>>(o.answer);
      if (!sizes) continue;
      for (size_t d = 0; d < sizes->size(); ++d)
        if ((*sizes)[d] < 0 && !(d == 0 && (*sizes)[d] == kDynamicSize && g->dynamic_dim0))
          throw CorruptionError(fmt::format("guard record: size {} of {} is negative{}",
                                            (*sizes)[d], call_name(o),
                                            d == 0 ? " in a guard without dynamic_dim0" : ""));
    }
    e->erases = m.erases;
    e->writes = m.writes;
    for (const auto& l : m.lazy_writes) {
      LazyInfo info;
      info.key = l.key;
      for (const auto& d : l.deps) info.deps.emplace_back(d, 0);
      info.version = l.version;
      e->lazy.push_back(std::move(info));
    }
    e->lazy_reuses = m.lazy_reuses;
    e->returns = m.returns;
    e->structure = m.structure.value_or("");
  } catch (const json::exception& ex) {
    throw CorruptionError(std::string("guard record: ") + ex.what());
  } catch (const c10::Error& ex) {
    throw CorruptionError(std::string("guard record: ") + ex.what_without_backtrace());
  } catch (const std::invalid_argument& ex) {
    throw CorruptionError(std::string("guard record: ") + ex.what());
  }
}

uint64_t guard_hash(const Guard& g) { return storage::xxh3(guard_json(g).dump()); }

}  // namespace tdstore::detail
