#include "src/guard.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "src/dtype_map.h"
#include "src/lazy_internal.h"
#include "storage/checksum.h"

namespace tdstore::detail {
namespace {

using json = nlohmann::json;

std::string dtype_str(c10::ScalarType t) {
  auto code = to_storage_dtype(t);
  return code ? std::string(storage::dtype_name(*code)) : std::string(c10::toString(t));
}

c10::ScalarType dtype_from(const std::string& name) {
  auto code = storage::dtype_from_name(name);
  if (!code) throw std::runtime_error("unknown dtype " + name);
  return to_scalar_type(*code);
}

std::string q(std::string_view key) { return fmt::format("\"{}\"", key); }

std::vector<std::string> keys_under(const TensorDict& root, const std::string& prefix) {
  std::vector<std::string> out;
  for (auto& k : root.keys())
    if (k.compare(0, prefix.size(), prefix) == 0) out.push_back(std::move(k));
  return out;
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

std::string TensorSpec::diff(const at::Tensor& t) const {
  if (!t.defined()) return "undefined tensor";
  if (t.scalar_type() != dtype)
    return fmt::format("dtype {} != {}", dtype_str(dtype), dtype_str(t.scalar_type()));
  if (t.sizes() != c10::IntArrayRef(sizes))
    return fmt::format("sizes [{}] != [{}]", fmt::join(sizes, ", "), fmt::join(t.sizes(), ", "));
  if (t.strides() != c10::IntArrayRef(strides))
    return fmt::format("strides [{}] != [{}]", fmt::join(strides, ", "),
                       fmt::join(t.strides(), ", "));
  if (t.device() != device) return fmt::format("device {} != {}", device.str(), t.device().str());
  if (t.requires_grad() != requires_grad)
    return fmt::format("requires_grad {} != {}", requires_grad, t.requires_grad());
  return "";
}

bool Guard::check(const TensorDict& td, const TensorDict& root, const std::vector<at::Tensor>& extra,
                  std::vector<at::Tensor>* reads) const {
  if (at::GradMode::is_enabled() != grad_mode || extra.size() != extra_inputs.size() ||
      td.prefix() != prefix)
    return false;
  for (size_t i = 0; i < extra.size(); ++i)
    if (!extra_inputs[i].matches(extra[i])) return false;
  reads->clear();
  auto& impl = Access::impl(root);
  for (const auto& o : observations) {
    switch (o.kind) {
      case Observation::Kind::Read: {
        if (!root.contains(o.key)) return false;
        at::Tensor t = root.get(o.key);
        if (!o.spec.matches(t)) return false;
        reads->push_back(std::move(t));
        break;
      }
      case Observation::Kind::Probe:
        if (root.contains(o.key) != o.present) return false;
        break;
      case Observation::Kind::PrefixProbe:
        if (root.has_prefix(o.key) != o.present) return false;
        break;
      case Observation::Kind::KeySet:
        if (keys_under(root, o.key) != o.keys) return false;
        break;
      case Observation::Kind::Lazy: {
        bool valid;
        try {
          valid = lazy_valid(impl, lazy_request(impl, o.key, o.deps, o.version));
        } catch (const KeyError&) {
          return false;  // a dep is gone: the call must run eagerly (and report it)
        }
        if (valid != o.present) return false;
        break;
      }
    }
  }
  return true;
}

std::string Guard::mismatch(const TensorDict& td, const TensorDict& root,
                            const std::vector<at::Tensor>& extra) const {
  if (td.prefix() != prefix) return fmt::format("called on prefix {} != {}", q(prefix), q(td.prefix()));
  if (at::GradMode::is_enabled() != grad_mode)
    return fmt::format("grad mode {} != {}", grad_mode ? "on" : "off", grad_mode ? "off" : "on");
  if (extra.size() != extra_inputs.size())
    return fmt::format("{} inputs != {}", extra_inputs.size(), extra.size());
  for (size_t i = 0; i < extra.size(); ++i)
    if (auto d = extra_inputs[i].diff(extra[i]); !d.empty()) return fmt::format("input {} {}", i, d);
  auto& impl = Access::impl(root);
  for (const auto& o : observations) {
    switch (o.kind) {
      case Observation::Kind::Read:
        if (!root.contains(o.key)) return q(o.key) + " absent";
        if (auto d = o.spec.diff(root.get(o.key)); !d.empty()) return q(o.key) + " " + d;
        break;
      case Observation::Kind::Probe:
        if (root.contains(o.key) != o.present)
          return fmt::format("contains({}) {} != {}", q(o.key), o.present, !o.present);
        break;
      case Observation::Kind::PrefixProbe:
        if (root.has_prefix(o.key) != o.present)
          return fmt::format("has_prefix({}) {} != {}", q(o.key), o.present, !o.present);
        break;
      case Observation::Kind::KeySet: {
        auto now = keys_under(root, o.key);
        if (now != o.keys)
          return fmt::format("key set{} changed ({} keys != {} keys)",
                             o.key.empty() ? "" : " under " + q(o.key), o.keys.size(), now.size());
        break;
      }
      case Observation::Kind::Lazy: {
        bool valid = false;
        try {
          valid = lazy_valid(impl, lazy_request(impl, o.key, o.deps, o.version));
        } catch (const KeyError& e) {
          return fmt::format("lazy property {}: {}", q(o.key), e.what());
        }
        if (valid != o.present)
          return fmt::format("lazy property {} {} != {}", q(o.key), o.present ? "valid" : "stale",
                             valid ? "valid" : "stale");
        break;
      }
    }
  }
  return "";
}

std::string Guard::describe() const {
  std::vector<std::string> reads, probes, other;
  for (const auto& o : observations) {
    if (o.kind == Observation::Kind::Read) reads.push_back(o.key);
    else if (o.kind == Observation::Kind::KeySet) other.push_back("the key set");
    else if (o.kind == Observation::Kind::Lazy) other.push_back("lazy " + o.key);
    else probes.push_back(o.key);
  }
  std::string out = reads.empty() ? "reads nothing" : fmt::format("reads {}", fmt::join(reads, ", "));
  if (!probes.empty()) out += fmt::format("; probes {}", fmt::join(probes, ", "));
  if (!other.empty()) out += fmt::format("; observes {}", fmt::join(other, ", "));
  return out;
}

static json spec_json(const TensorSpec& s) {
  return {{"dtype", dtype_str(s.dtype)},   {"sizes", s.sizes},
          {"strides", s.strides},          {"device", s.device.str()},
          {"requires_grad", s.requires_grad}};
}

static TensorSpec spec_from(const json& j) {
  TensorSpec s;
  s.dtype = dtype_from(j.at("dtype").get<std::string>());
  s.sizes = j.at("sizes").get<std::vector<int64_t>>();
  s.strides = j.at("strides").get<std::vector<int64_t>>();
  s.device = c10::Device(j.at("device").get<std::string>());
  s.requires_grad = j.at("requires_grad").get<bool>();
  return s;
}

static const char* kind_name(Observation::Kind k) {
  switch (k) {
    case Observation::Kind::Read: return "read";
    case Observation::Kind::Probe: return "contains";
    case Observation::Kind::PrefixProbe: return "has_prefix";
    case Observation::Kind::KeySet: return "keys";
    case Observation::Kind::Lazy: return "lazy";
  }
  return "?";
}

json to_json(const Guard& g, const Effects& e) {
  json obs = json::array();
  for (const auto& o : g.observations) {
    json j = {{"kind", kind_name(o.kind)}, {"key", o.key}};
    if (o.kind == Observation::Kind::Read) j["spec"] = spec_json(o.spec);
    if (o.kind == Observation::Kind::Probe || o.kind == Observation::Kind::PrefixProbe ||
        o.kind == Observation::Kind::Lazy)
      j["present"] = o.present;
    if (o.kind == Observation::Kind::KeySet) j["keys"] = o.keys;
    if (o.kind == Observation::Kind::Lazy) j["deps"] = o.deps, j["version"] = o.version;
    obs.push_back(std::move(j));
  }
  json extra = json::array();
  for (const auto& s : g.extra_inputs) extra.push_back(spec_json(s));
  json lazy = json::array();
  for (const auto& l : e.lazy) {
    json deps = json::array();
    for (const auto& [k, h] : l.deps) deps.push_back(k);
    lazy.push_back({{"key", l.key}, {"deps", deps}, {"version", l.version}});
  }
  return {{"prefix", g.prefix}, {"observations", obs}, {"inputs", extra},       {"grad_mode", g.grad_mode},
          {"writes", e.writes},  {"lazy_writes", lazy},   {"erases", e.erases},
          {"returns", e.returns}};
}

void from_json(const json& j, Guard* g, Effects* e) {
  *g = Guard();
  *e = Effects();
  g->prefix = j.at("prefix").get<std::string>();
  for (const auto& jo : j.at("observations")) {
    Observation o;
    std::string kind = jo.at("kind").get<std::string>();
    o.key = jo.at("key").get<std::string>();
    if (kind == "read") o.kind = Observation::Kind::Read, o.spec = spec_from(jo.at("spec"));
    else if (kind == "contains") o.kind = Observation::Kind::Probe;
    else if (kind == "has_prefix") o.kind = Observation::Kind::PrefixProbe;
    else if (kind == "keys") o.kind = Observation::Kind::KeySet, o.keys = jo.at("keys").get<std::vector<std::string>>();
    else if (kind == "lazy") {
      o.kind = Observation::Kind::Lazy;
      o.deps = jo.at("deps").get<std::vector<std::string>>();
      o.version = jo.at("version").get<std::string>();
    } else {
      throw std::runtime_error("unknown observation kind " + kind);
    }
    if (jo.contains("present")) o.present = jo.at("present").get<bool>();
    g->observations.push_back(std::move(o));
  }
  for (const auto& s : j.at("inputs")) g->extra_inputs.push_back(spec_from(s));
  g->grad_mode = j.at("grad_mode").get<bool>();
  e->writes = j.at("writes").get<std::vector<std::string>>();
  for (const auto& l : j.at("lazy_writes")) {
    LazyInfo info;
    info.key = l.at("key").get<std::string>();
    for (const auto& d : l.at("deps")) info.deps.emplace_back(d.get<std::string>(), 0);
    info.version = l.at("version").get<std::string>();
    e->lazy.push_back(std::move(info));
  }
  e->erases = j.at("erases").get<std::vector<std::string>>();
  e->returns = j.at("returns").get<bool>();
}

uint64_t guard_hash(const Guard& g) { return storage::xxh3(to_json(g, Effects()).dump()); }

}  // namespace tdstore::detail
