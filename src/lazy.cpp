// Lazy properties: computed once, stored beside their inputs with provenance, reused while
// the inputs are unchanged. Provenance lives in the catalog under "lazy/<key>" (FORMAT.md) and
// commits in the same generation as the property's tensor, so a crash never pairs a property
// with provenance it was not computed from.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

#include "src/lazy_internal.h"
#include "src/observer.h"
#include "src/tensordict_impl.h"

namespace tdstore {
namespace {

using json = nlohmann::json;
constexpr std::string_view kLazyPrefix = "lazy/";

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

// Catalog value of "lazy/<key>": {"version", "deps": [[key, hex]], "xxh3": hex of the
// property's bytes, "computed_at_ns", "compute_ns"}.
std::string encode(const LazyInfo& info, uint64_t property_hash) {
  json deps = json::array();
  for (const auto& [k, h] : info.deps) deps.push_back({k, hex(h)});
  return json{{"version", info.version},         {"deps", deps},
              {"xxh3", hex(property_hash)},      {"computed_at_ns", info.computed_at_ns},
              {"compute_ns", info.compute_ns}}
      .dump();
}

std::pair<LazyInfo, uint64_t> decode(std::string_view key, const std::string& value,
                                     const std::filesystem::path& where) {
  try {
    json j = json::parse(value);
    LazyInfo info;
    info.key = std::string(key);
    info.version = j.at("version").get<std::string>();
    for (const auto& d : j.at("deps"))
      info.deps.emplace_back(d.at(0).get<std::string>(),
                             std::stoull(d.at(1).get<std::string>(), nullptr, 16));
    info.computed_at_ns = j.at("computed_at_ns").get<int64_t>();
    info.compute_ns = j.at("compute_ns").get<int64_t>();
    info.persisted = true;
    return {info, std::stoull(j.at("xxh3").get<std::string>(), nullptr, 16)};
  } catch (const std::exception& e) {
    throw CorruptionError(where.string() + ": catalog entry lazy/" + std::string(key) +
                          " is not valid provenance: " + e.what());
  }
}

}  // namespace

// The fingerprint of a full key: its stored checksum, or its in-memory stamp.
static std::optional<uint64_t> fingerprint(const TensorDict::Impl& impl, std::string_view key) {
  if (impl.persistent()) {
    auto e = impl.store->find(key);
    if (!e) return std::nullopt;
    return e->content_hash;
  }
  auto it = impl.stamps.find(key);
  if (it == impl.stamps.end()) return std::nullopt;
  return it->second;
}

static bool deps_unchanged(const TensorDict::Impl& impl, const LazyInfo& info) {
  for (const auto& [d, h] : info.deps)
    if (fingerprint(impl, d) != h) return false;
  return true;
}

// Provenance of a full key with `valid` filled in: the catalog's when it is valid, else the
// one kept in memory (in-memory dicts, read-only results), else the catalog's stale one.
// `in_memory` tells which was returned.
static std::optional<LazyInfo> load(const TensorDict::Impl& impl, std::string_view key,
                                    bool* in_memory = nullptr) {
  std::optional<LazyInfo> stored;
  if (impl.persistent()) {
    if (auto value = impl.store->get_meta(std::string(kLazyPrefix) + std::string(key))) {
      auto [info, property_hash] = decode(key, *value, impl.store->path());
      info.valid = fingerprint(impl, key) == property_hash && deps_unchanged(impl, info);
      stored = std::move(info);
    }
  }
  if (in_memory) *in_memory = false;
  if (stored && stored->valid) return stored;
  if (auto it = impl.lazy.find(key); it != impl.lazy.end()) {
    const auto& m = it->second;
    LazyInfo info = m.info;
    bool property_ok = m.result.defined() || fingerprint(impl, key) == m.property_fingerprint;
    info.valid = property_ok && deps_unchanged(impl, info);
    if (in_memory) *in_memory = true;
    return info;
  }
  return stored;
}

namespace detail {

LazyInfo lazy_request(const TensorDict::Impl& impl, const std::string& full,
                      const std::vector<std::string>& full_deps, std::string_view version) {
  const std::string w = where(impl);
  check_key_path(full, w);
  LazyInfo request;
  request.key = full;
  request.version = std::string(version);
  for (const auto& d : full_deps) {
    auto fp = fingerprint(impl, d);
    if (!fp)
      throw KeyError(w + ": lazy property '" + full + "': dependency '" + d + "' not found");
    request.deps.emplace_back(d, *fp);
  }
  std::sort(request.deps.begin(), request.deps.end());
  request.deps.erase(std::unique(request.deps.begin(), request.deps.end()), request.deps.end());
  return request;
}

bool lazy_valid(const TensorDict::Impl& impl, const LazyInfo& request) {
  auto known = load(impl, request.key);
  return known && known->valid && known->version == request.version && known->deps == request.deps;
}

at::Tensor lazy_reuse(TensorDict& root, const LazyInfo& request) {
  auto& impl = Access::impl(root);
  ++impl.lazy_stats.reused;
  bool in_memory = false;
  load(impl, request.key, &in_memory);
  if (in_memory && impl.lazy[request.key].result.defined()) return impl.lazy[request.key].result;
  return root.get(request.key);
}

at::Tensor lazy_store(TensorDict& root, LazyInfo request, const at::Tensor& result) {
  auto& impl = Access::impl(root);
  const std::string& full = request.key;
  request.computed_at_ns = now_ns();
  ++impl.lazy_stats.computed;
  if (impl.persistent() && !impl.store->writable()) {
    ++impl.lazy_stats.not_persisted;
    if (!impl.lazy.count(full))
      fmt::print(stderr,
                 "tdstore: {}: lazy property '{}' computed in memory and not stored: the store "
                 "is open read-only\n",
                 impl.store->path().string(), full);
    impl.lazy[full] = {request, 0, result};
    return result;
  }
  root.set(full, result);
  if (impl.persistent()) {
    request.persisted = true;
    uint64_t property_hash = *fingerprint(impl, full);
    impl.store->put_meta(std::string(kLazyPrefix) + full, encode(request, property_hash));
    impl.store->commit();
    return root.get(full);
  }
  impl.lazy[full] = {request, *fingerprint(impl, full), at::Tensor()};
  return result;
}

}  // namespace detail

at::Tensor TensorDict::get_or_compute(std::string_view key, std::vector<std::string> deps,
                                      std::function<at::Tensor(const TensorDict&)> fn,
                                      std::string_view version) {
  for (auto& d : deps) d = full_key(d);
  LazyInfo request = detail::lazy_request(*impl_, full_key(key), deps, version);
  bool valid = detail::lazy_valid(*impl_, request);
  if (auto* o = detail::observer_for(impl_.get()))
    if (auto t = o->lazy(request, valid)) return *t;
  TensorDict root = detail::Access::root(*this);
  if (valid) return detail::lazy_reuse(root, request);
  auto t0 = std::chrono::steady_clock::now();
  at::Tensor result = fn(*this);
  request.compute_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
  return detail::lazy_store(root, std::move(request), result);
}

std::optional<LazyInfo> TensorDict::lazy_info(std::string_view key) const {
  return load(*impl_, full_key(key));
}

std::vector<LazyInfo> TensorDict::lazy_properties() const {
  std::map<std::string, LazyInfo> out;
  if (impl_->persistent())
    for (const auto& [k, v] : impl_->store->scan_meta(std::string(kLazyPrefix) + prefix_))
      if (auto info = lazy_info(std::string_view(k).substr(kLazyPrefix.size() + prefix_.size())))
        out[info->key] = *info;
  for (const auto& [k, v] : impl_->lazy)
    if (k.compare(0, prefix_.size(), prefix_) == 0)
      if (auto info = lazy_info(std::string_view(k).substr(prefix_.size()))) out[k] = *info;
  std::vector<LazyInfo> list;
  for (auto& [k, v] : out) list.push_back(std::move(v));
  return list;
}

bool TensorDict::invalidate(std::string_view key) {
  std::string full = full_key(key);
  bool had = impl_->lazy.erase(full) > 0;
  if (impl_->persistent() && impl_->store->writable()) {
    std::string meta = std::string(kLazyPrefix) + full;
    if (impl_->store->get_meta(meta)) {
      impl_->store->put_meta(meta, std::nullopt);
      had = true;
    }
  }
  return had;
}

LazyStats TensorDict::lazy_stats() const { return impl_->lazy_stats; }

}  // namespace tdstore
