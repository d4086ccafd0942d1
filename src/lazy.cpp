// Lazy properties: computed once, stored beside their inputs with provenance, reused while
// the inputs are unchanged. Provenance lives in the catalog under "lazy/<key>" (FORMAT.md) and
// commits in the same generation as the property's tensor, so a crash never pairs a property
// with provenance it was not computed from.
//
// A property is valid when storage::lazy_valid (storage/derived.h) says so, with fingerprints
// that are content checksum plus dtype, shape and, for a ragged key, its offsets (in memory, a
// stamp renewed by every set()), and the caller asks for the same version.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <set>

#include "src/lazy_internal.h"
#include "src/observer.h"
#include "src/tensordict_impl.h"
#include "storage/checksum.h"
#include "storage/records.h"

namespace tdstore {
namespace {

using json = nlohmann::json;
using storage::kLazyPrefix;
using storage::kMaxLazyChain;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Catalog value of "lazy/<key>" (FORMAT.md, "Lazy-property provenance"; storage/records.h).
std::string encode(const LazyInfo& info, uint64_t property_fp, uint64_t property_hash) {
  storage::LazyRecord r;
  r.version = info.version;
  for (size_t i = 0; i < info.deps.size(); ++i)
    r.deps.push_back({info.deps[i].first, info.deps[i].second,
                      i < info.dep_checksums.size() ? info.dep_checksums[i] : 0});
  r.fingerprint = property_fp;
  r.xxh3 = property_hash;
  r.computed_at_ns = info.computed_at_ns;
  r.compute_ns = info.compute_ns;
  return storage::lazy_record_json(r);
}

// Provenance and the property's fingerprint; nullopt as fingerprint for records of an earlier
// layout (before fingerprints), which are stale.
std::pair<LazyInfo, std::optional<uint64_t>> decode(std::string_view key, const std::string& value,
                                                    const std::filesystem::path& where) {
  storage::LazyRecord r = storage::parse_lazy_record(
      value, where.string() + ": catalog entry lazy/" + std::string(key));
  LazyInfo info;
  info.key = std::string(key);
  info.version = r.version;
  for (const auto& d : r.deps) {
    info.deps.emplace_back(d.key, d.fingerprint);
    info.dep_checksums.push_back(d.checksum);
  }
  info.computed_at_ns = r.computed_at_ns;
  info.compute_ns = r.compute_ns;
  info.persisted = true;
  return {info, r.fingerprint};
}

}  // namespace

// The fingerprint of a full key: for a store, xxh3 of its content checksum, dtype, shape and
// ragged offsets' checksum (FORMAT.md); in memory, the key's stamp. `checksum` receives the
// content checksum (0 in memory).
static std::optional<uint64_t> fingerprint(const TensorDict::Impl& impl, std::string_view key,
                                           uint64_t* checksum = nullptr) {
  if (impl.persistent()) return storage::key_fingerprint(*impl.store, key, checksum);
  if (checksum) *checksum = 0;
  return impl.stamp(key);
}

static std::optional<LazyInfo> load(const TensorDict::Impl& impl, std::string_view key,
                                    bool* in_memory = nullptr, int depth = 0);

// The fingerprint a dependency has for this handle now: a read-only store's property
// recomputed in memory (its stored bytes are stale) is its in-memory result, identified by the
// stamp it got when computed, so properties built on the stored bytes are stale too; any other
// key's is fingerprint().
static std::optional<uint64_t> current_fingerprint(const TensorDict::Impl& impl,
                                                   std::string_view key, uint64_t* checksum,
                                                   int depth) {
  if (impl.persistent()) {
    if (auto it = impl.lazy.find(key); it != impl.lazy.end() && it->second.result.defined()) {
      if (depth >= kMaxLazyChain) return std::nullopt;  // a cycle: nothing built on it is valid
      bool in_memory = false;
      if (auto info = load(impl, key, &in_memory, depth + 1); info && info->valid && in_memory) {
        if (checksum) *checksum = 0;
        return it->second.property_fingerprint;
      }
    }
  }
  return fingerprint(impl, key, checksum);
}

namespace {
// The lazy-property rule's facts (storage/derived.h) as this handle sees them.
struct HandleLazyFacts final : storage::LazyFacts {
  const TensorDict::Impl& impl;
  explicit HandleLazyFacts(const TensorDict::Impl& i) : impl(i) {}
  std::optional<uint64_t> fingerprint(std::string_view key, int depth) const override {
    return current_fingerprint(impl, key, nullptr, depth);
  }
  std::optional<bool> lazy_valid(std::string_view key, int depth) const override {
    auto info = load(impl, key, nullptr, depth);
    return info ? std::optional<bool>(info->valid) : std::nullopt;
  }
};
}  // namespace

// Provenance of a full key with `valid` filled in: the catalog's when it is valid, else the
// one kept in memory (in-memory dicts, read-only results), else the catalog's stale one.
// `in_memory` tells which was returned.
static std::optional<LazyInfo> load(const TensorDict::Impl& impl, std::string_view key,
                                    bool* in_memory, int depth) {
  std::optional<LazyInfo> stored;
  if (impl.persistent()) {
    if (auto value = impl.store->get_meta(std::string(kLazyPrefix) + std::string(key))) {
      auto [info, property_fp] = decode(key, *value, impl.store->path());
      info.valid = storage::lazy_valid(property_fp && fingerprint(impl, key) == property_fp,
                                       info.deps, depth, HandleLazyFacts(impl));
      stored = std::move(info);
    }
  }
  if (in_memory) *in_memory = false;
  if (stored && stored->valid) return stored;
  if (auto it = impl.lazy.find(key); it != impl.lazy.end()) {
    const auto& m = it->second;
    LazyInfo info = m.info;
    bool property_ok = m.result.defined() || fingerprint(impl, key) == m.property_fingerprint;
    info.valid = storage::lazy_valid(property_ok, info.deps, depth, HandleLazyFacts(impl));
    if (in_memory) *in_memory = true;
    return info;
  }
  return stored;
}

namespace detail {

LazyInfo lazy_request(const TensorDict::Impl& impl, const std::string& full,
                      const std::vector<std::string>& full_deps, std::string_view version) {
  const std::string w = where(impl);
  storage::check_key(full, w);
  std::vector<std::string> deps = full_deps;
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  LazyInfo request;
  request.key = full;
  request.version = std::string(version);
  for (const auto& d : deps) {
    if (d == full)
      throw KeyError(w + ": lazy property " + in_quotes(full) + " cannot depend on itself");
    uint64_t checksum = 0;
    auto fp = current_fingerprint(impl, d, &checksum, 0);
    if (!fp)
      throw KeyError(w + ": lazy property " + in_quotes(full) + ": dependency " + in_quotes(d) +
                     " not found");
    request.deps.emplace_back(d, *fp);
    request.dep_checksums.push_back(checksum);
  }
  return request;
}

bool lazy_valid(const TensorDict::Impl& impl, const LazyInfo& request) {
  auto known = load(impl, request.key);
  return known && known->valid && known->version == request.version && known->deps == request.deps;
}

at::Tensor lazy_reuse(TensorDict& root, const std::string& key) {
  auto& impl = Access::impl(root);
  Observer* o = observer_for(&impl);
  if (!(o && o->dry())) ++impl.lazy_stats.reused;
  if (auto it = impl.lazy.find(key); it != impl.lazy.end() && it->second.result.defined()) {
    bool in_memory = false;
    load(impl, key, &in_memory);
    if (in_memory) {
      at::Tensor result = it->second.result;
      return o ? o->read(ReadKind::LazyMemory, key, [&] { return result; }) : result;
    }
  }
  return root.get(key);
}

at::Tensor lazy_memory_result(const TensorDict::Impl& impl, const std::string& key) {
  bool in_memory = false;
  auto info = load(impl, key, &in_memory);
  auto it = impl.lazy.find(key);
  if (!info || !info->valid || !in_memory || it == impl.lazy.end() || !it->second.result.defined())
    throw KeyError(where(impl) + ": lazy property " + in_quotes(key) + " is not held in memory");
  return it->second.result;
}

at::Tensor lazy_store(TensorDict& root, LazyInfo request, const at::Tensor& result) {
  auto& impl = Access::impl(root);
  const std::string full = request.key;
  const bool dry = [&] {
    Observer* o = observer_for(&impl);
    return o && o->dry();
  }();
  request.computed_at_ns = now_ns();
  if (!dry) ++impl.lazy_stats.computed;
  if (impl.persistent() && !impl.store->writable()) {
    if (dry) return result;
    ++impl.lazy_stats.not_persisted;
    if (!impl.lazy.count(full))
      fmt::print(stderr,
                 "tdstore: {}: lazy property '{}' computed in memory and not stored: the store "
                 "is open read-only\n",
                 impl.store->path().string(), full);
    // A stamp no stored content hashes to in practice (xxh3 values are uniform over 2^64;
    // stamps count up from 2^63 in this process): a property built on this result records it.
    static std::atomic<uint64_t> next_stamp{uint64_t{1} << 63};
    impl.lazy[full] = {request, next_stamp.fetch_add(1), result};
    return result;
  }
  if (impl.persistent()) {
    if (!dry) {
      {
        storage::WriteGroup group(*impl.store);  // the property and its provenance, or neither
        root.set(full, result);
        request.persisted = true;
        uint64_t property_hash = 0;
        uint64_t property_fp = *fingerprint(impl, full, &property_hash);
        impl.store->put_meta(std::string(kLazyPrefix) + full,
                             encode(request, property_fp, property_hash));
        group.done();
      }
      impl.store->commit();
    } else {
      root.set(full, result);
    }
    return root.get(full);
  }
  root.set(full, result);
  if (!dry) impl.lazy[full] = {request, *fingerprint(impl, full), at::Tensor()};
  return result;
}

std::vector<std::string> derived_keys(const TensorDict& root) {
  const auto& impl = Access::impl(root);
  std::set<std::string> out;
  if (impl.persistent())
    for (auto& k : storage::derived_keys(*impl.store)) out.insert(std::move(k));
  for (const auto& [k, v] : impl.lazy) out.insert(k);
  const std::string attr_prefix(kRowFeatureAttr);
  if (!impl.persistent())
    for (const auto& name : root.attr_names())
      if (name.compare(0, attr_prefix.size(), attr_prefix) == 0) {
        std::string key = name.substr(attr_prefix.size());
        out.insert(key);
        out.insert(key + std::string(kRowsDoneSuffix));
      }
  std::erase_if(out, [&](const std::string& k) { return !root.contains(k); });
  return {out.begin(), out.end()};
}

void drop_derived(TensorDict& root, const std::string& key) {
  if (root.contains(key)) root.erase(key);
  root.invalidate(key);
  const std::string attr = std::string(kRowFeatureAttr) + key;
  if (root.attr(attr)) {
    root.erase_attr(attr);
    const std::string mask = key + std::string(kRowsDoneSuffix);
    if (root.contains(mask)) root.erase(mask);
  }
}

}  // namespace detail

at::Tensor TensorDict::get_or_compute(std::string_view key, std::vector<std::string> deps,
                                      std::function<at::Tensor(const TensorDict&)> fn,
                                      std::string_view version) {
  for (auto& d : deps) d = full_key(d);
  const std::string full = full_key(key);
  LazyInfo request;
  request.key = full;  // a replay answers without real(): key and version are all it keeps
  request.version = std::string(version);
  auto real = [&] {
    request = detail::lazy_request(*impl_, full, deps, version);
    return detail::lazy_valid(*impl_, request);
  };
  detail::Observer* o = detail::observer_for(impl_.get());
  bool valid = o ? o->lazy(full, deps, version, real) : real();
  TensorDict root = detail::Access::root(*this);
  if (valid) return detail::lazy_reuse(root, full);
  auto t0 = std::chrono::steady_clock::now();
  at::Tensor result = fn(*this);
  if (!(o && o->dry())) {
    // What fn computed from: a dependency it recomputed through get_or_compute has a new
    // fingerprint; any other change of a dependency while fn ran, or a dependency that is a
    // stale lazy property, means the result was not computed from valid inputs.
    LazyInfo after = detail::lazy_request(*impl_, full, deps, version);
    for (size_t i = 0; i < after.deps.size(); ++i) {
      const std::string& d = after.deps[i].first;
      auto dep = load(*impl_, d);
      if (dep && !dep->valid)
        throw Error(where(*impl_) + ": lazy property " + in_quotes(full) +
                    " depends on lazy property '" + d +
                    "', which is stale: compute it first (get_or_compute('" + d +
                    "', ...) before or inside this property's function)");
      if (!dep && after.deps[i].second != request.deps[i].second)
        throw Error(where(*impl_) + ": lazy property " + in_quotes(full) + ": its dependency '" +
                    d + "' changed while its function ran");
    }
    request.deps = std::move(after.deps);
    request.dep_checksums = std::move(after.dep_checksums);
  }
  request.compute_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  return detail::lazy_store(root, std::move(request), result);
}

std::optional<LazyInfo> TensorDict::lazy_info(std::string_view key) const {
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    o->unsupported("lazy_info()");
  return load(*impl_, full_key(key));
}

std::vector<LazyInfo> TensorDict::lazy_properties() const {
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    o->unsupported("lazy_properties()");
  std::map<std::string, LazyInfo> out;
  if (impl_->persistent())
    for (const auto& [k, v] : impl_->store->scan_meta(std::string(kLazyPrefix) + prefix_))
      if (auto info = load(*impl_, std::string_view(k).substr(kLazyPrefix.size())))
        out[info->key] = *info;
  for (const auto& [k, v] : impl_->lazy)
    if (k.compare(0, prefix_.size(), prefix_) == 0)
      if (auto info = load(*impl_, k)) out[k] = *info;
  std::vector<LazyInfo> list;
  for (auto& [k, v] : out) list.push_back(std::move(v));
  return list;
}

bool TensorDict::invalidate(std::string_view key) {
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    o->unsupported("invalidate()");
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

LazyStats TensorDict::lazy_stats() const {
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    o->unsupported("lazy_stats()");
  return impl_->lazy_stats;
}

}  // namespace tdstore
