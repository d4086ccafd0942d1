// Lazy-property steps shared by TensorDict::get_or_compute and compiled functions, which
// replay get_or_compute calls without running them. Keys are full paths. Internal to src/.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "src/tensordict_impl.h"
#include "storage/derived.h"

namespace tdstore::detail {

// The provenance a property computed now would get: each dep's current fingerprint, sorted.
// KeyError when a dep is absent.
LazyInfo lazy_request(const TensorDict::Impl& impl, const std::string& full,
                      const std::vector<std::string>& full_deps, std::string_view version);
// Whether a stored (or in-memory) property matches `request`.
bool lazy_valid(const TensorDict::Impl& impl, const LazyInfo& request);
// The valid property (counts a reuse), read through the observer. REQUIRES: lazy_valid.
at::Tensor lazy_reuse(TensorDict& root, const std::string& key);
// A valid property held in memory (a read-only store's result); KeyError when there is none.
at::Tensor lazy_memory_result(const TensorDict::Impl& impl, const std::string& key);
// Stores result with request's provenance: committed on a writable store, kept in memory on
// a read-only one. Counts a computation. Returns the stored tensor.
at::Tensor lazy_store(TensorDict& root, LazyInfo request, const at::Tensor& result);

// Catalog attribute holding the progress of a row feature still being computed (Loader), beside
// the keys <key> and <key> + kRowsDoneSuffix.
// (storage/derived.h)
using storage::kRowFeatureAttr;
using storage::kRowsDoneSuffix;

// Keys derived from the dict's other keys, sorted: lazy properties (stored provenance or held in
// memory) and row features in progress (their values and done-rows mask). Appending rows
// changes every dependency, so append() drops the derived keys the appended rows do not hold.
std::vector<std::string> derived_keys(const TensorDict& root);
// Erases a derived key with its provenance or row-feature progress (a later request recomputes).
void drop_derived(TensorDict& root, const std::string& key);

}  // namespace tdstore::detail
