// Keys derived from a store's other keys (docs/FORMAT.md, "Catalog"): lazy properties, whose
// provenance is the catalog record "lazy/<key>", and row features still being computed, whose
// progress is the attribute "rowfeature/<key>" beside the keys <key> and <key>.rows_done.
// Appending rows changes every dependency, so an append drops the derived keys it does not
// extend (TensorDict::append, tdstore::import_arrays).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tdstore::storage {

class Store;

inline constexpr std::string_view kLazyPrefix = "lazy/";
// Lazy properties built on lazy properties are trusted this deep; a deeper chain (or a cycle,
// which stored records can hold after damage) makes every property on it stale.
inline constexpr int kMaxLazyChain = 64;
inline constexpr std::string_view kRowFeatureAttr = "rowfeature/";
inline constexpr std::string_view kRowsDoneSuffix = ".rows_done";

// The present derived keys of the handle's view (staged changes included), sorted.
std::vector<std::string> derived_keys(const Store& store);
// Erases a derived key (and a ragged key's offsets) with its provenance or row-feature
// progress. REQUIRES: store.writable().
void drop_derived(Store& store, const std::string& key);

}  // namespace tdstore::storage
