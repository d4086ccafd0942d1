#include "storage/derived.h"

#include <set>

#include "storage/store.h"

namespace tdstore::storage {

std::vector<std::string> derived_keys(const Store& store) {
  std::set<std::string> out;
  for (const auto& [k, v] : store.scan_meta(kLazyPrefix)) out.insert(k.substr(kLazyPrefix.size()));
  for (const auto& name : store.attr_names())
    if (name.compare(0, kRowFeatureAttr.size(), kRowFeatureAttr) == 0) {
      std::string key = name.substr(kRowFeatureAttr.size());
      out.insert(key + std::string(kRowsDoneSuffix));
      out.insert(std::move(key));
    }
  std::erase_if(out, [&](const std::string& k) { return !store.find(k); });
  return {out.begin(), out.end()};
}

void drop_derived(Store& store, const std::string& key) {
  store.erase(key);
  store.erase(ragged_offsets_key(key));
  store.put_meta(std::string(kLazyPrefix) + key, std::nullopt);
  const std::string attr = std::string(kRowFeatureAttr) + key;
  if (store.get_attr(attr)) {
    store.put_attr(attr, std::nullopt);
    store.erase(key + std::string(kRowsDoneSuffix));
  }
}

bool lazy_valid(bool property_unchanged, std::span<const std::pair<std::string, uint64_t>> deps,
                int depth, const LazyFacts& facts) {
  if (!property_unchanged || depth >= kMaxLazyChain) return false;  // a cycle, or too deep to trust
  for (const auto& [key, fingerprint] : deps)
    if (facts.fingerprint(key, depth) != fingerprint) return false;
  for (const auto& [key, fingerprint] : deps)
    if (auto valid = facts.lazy_valid(key, depth + 1); valid && !*valid) return false;
  return true;
}

}  // namespace tdstore::storage
