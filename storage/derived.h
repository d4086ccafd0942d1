// Keys derived from a store's other keys (docs/FORMAT.md, "Catalog"): lazy properties, whose
// provenance is the catalog record "lazy/<key>", and row features still being computed, whose
// progress is the attribute "rowfeature/<key>" beside the keys <key> and <key>.rows_done.
// Appending rows changes every dependency, so an append drops the derived keys it does not
// extend (TensorDict::append, tdstore::import_arrays).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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

// What the validity rule asks of a reader, answered from what it holds: a key's fingerprint as
// a lazy property's dependents see it now (nullopt when absent), and whether a key is a lazy
// property and valid (nullopt when it is no lazy property). `depth` is how deep in a chain of
// properties the question is asked; an answer that recurses passes it on.
class LazyFacts {
 public:
  virtual std::optional<uint64_t> fingerprint(std::string_view key, int depth) const = 0;
  virtual std::optional<bool> lazy_valid(std::string_view key, int depth) const = 0;

 protected:
  ~LazyFacts() = default;
};

// The validity rule of a lazy property, for every reader (TensorDict::get_or_compute,
// StoreReader::lazy_properties): valid when its own tensor is unchanged since it was computed
// (`property_unchanged`), it is fewer than kMaxLazyChain properties deep (`depth`), every
// dependency has the fingerprint recorded in `deps`, and every dependency that is a lazy
// property is valid itself (asked at depth + 1).
bool lazy_valid(bool property_unchanged, std::span<const std::pair<std::string, uint64_t>> deps,
                int depth, const LazyFacts& facts);

}  // namespace tdstore::storage
