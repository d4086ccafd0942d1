// Guards and effects of compiled-function entries (include/tdstore/compile.h): what a call
// observed of a dict, and what it wrote. Internal to src/; no JIT headers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tdstore/tensordict.h"

namespace tdstore::detail {

struct TensorSpec {
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  bool requires_grad = false;

  static TensorSpec of(const at::Tensor& t);
  bool matches(const at::Tensor& t) const;
  // What differs, e.g. "sizes [256, 784] != [96, 784]" (expected first); empty when matching.
  std::string diff(const at::Tensor& t) const;
};

struct Observation {
  enum class Kind { Read, Probe, PrefixProbe, KeySet, Lazy };
  Kind kind = Kind::Read;
  std::string key;                // full key; the prefix ("" or ending in '/') for KeySet
  TensorSpec spec;                // Read
  bool present = false;           // Probe, PrefixProbe: the answer; Lazy: valid
  std::vector<std::string> keys;  // KeySet: the full keys under the prefix, sorted
  std::vector<std::string> deps;  // Lazy: full dep keys
  std::string version;            // Lazy
};

struct Guard {
  std::string prefix;  // the prefix of the handle fn was called with ("" for a root handle)
  std::vector<Observation> observations;
  std::vector<TensorSpec> extra_inputs;  // CompileOptions::inputs
  bool grad_mode = true;

  // True when root (a root handle) and extra match; then `reads` holds the tensors of the
  // Read observations, in order. O(observations) except KeySet (O(keys)).
  bool check(const TensorDict& td, const TensorDict& root, const std::vector<at::Tensor>& extra,
             std::vector<at::Tensor>* reads) const;
  // The first mismatch in words, e.g. "\"obs\" sizes [256, 784] != [96, 784]".
  std::string mismatch(const TensorDict& td, const TensorDict& root,
                       const std::vector<at::Tensor>& extra) const;
  std::string describe() const;  // short summary: "reads obs, action; probes mask"
};

// What a call did to the dict, replayed after a graph run. Graph outputs are the return value
// (when `returns`) followed by the final value of each key in `writes`.
struct Effects {
  std::vector<std::string> writes;
  std::vector<LazyInfo> lazy;        // writes made by get_or_compute (provenance template)
  std::vector<std::string> erases;
  bool returns = false;
};

nlohmann::json to_json(const Guard& g, const Effects& e);
void from_json(const nlohmann::json& j, Guard* g, Effects* e);  // throws on malformed input
uint64_t guard_hash(const Guard& g);

}  // namespace tdstore::detail
