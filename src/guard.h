// Guards and effects of compiled-function entries (include/tdstore/compile.h): what a call
// observed of a dict, and what it did to it. Internal to src/; no JIT headers.
//
// A guard lists every observation a recorded call made whose answer came from the dict as it
// was when the call started (src/recording.h derives it); answers the call determined itself
// (reads of keys it wrote, probes of keys it erased) are left out. A guard holds when every
// observation gives the recorded answer again, errors included.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "src/observer.h"
#include "tdstore/tensordict.h"

namespace tdstore::detail {

// Marks dim 0 of a read's sizes, or of a BatchSize answer, in a dynamic guard: any size, the
// same for every dynamic read of one call.
inline constexpr int64_t kDynamicSize = -1;

struct TensorSpec {
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  std::vector<int64_t> sizes, strides;  // sizes[0] may be kDynamicSize (Guard::dynamic_dim0)
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  bool requires_grad = false;

  static TensorSpec of(const at::Tensor& t);
  bool matches(const at::Tensor& t) const;
  // matches(), with a kDynamicSize dim 0 accepting t.size(0) when it equals *dim0 (or binding
  // *dim0 to it when *dim0 < 0).
  bool matches(const at::Tensor& t, int64_t* dim0) const;
  // What differs, e.g. "sizes [256, 784] != [96, 784]" (expected first); empty when matching.
  std::string diff(const at::Tensor& t) const;
  bool operator==(const TensorSpec&) const = default;
};

struct Observation {
  enum class Kind : uint8_t { Read, Query, Lazy };
  Kind kind = Kind::Read;
  ReadKind read = ReadKind::Get;   // Read
  Query query = Query::Contains;   // Query
  std::string key;                 // full key, prefix or attribute name ("" when none)
  TensorSpec spec;                 // Read that succeeded
  Answer answer;                   // Query; Lazy: bool valid
  std::optional<Failure> failure;  // the call threw this instead of answering
  // HasPrefix, Keys, Count: keys the call itself had written or erased when it asked; the
  // answer is over the other keys.
  std::vector<std::string> exclude;
  std::vector<std::string> deps;  // Lazy: full dependency keys, as passed
  std::string version;            // Lazy

  bool operator==(const Observation&) const = default;
};

// The engine's ambient state a traced result depends on besides grad mode: CPU (and CUDA)
// autocast with its dtype, the default dtype, deterministic algorithms, inference mode. ""
// in the default state (autocast off, float32, nondeterministic allowed, inference mode off),
// e.g. "autocast_cpu=BFloat16;default_dtype=Double" otherwise.
std::string ambient_state();

// What a call brings besides the dict: its extra inputs (CompileOptions::inputs or the
// CallState's), ambient_state() and the caller's context (CallState::context).
struct CallInputs {
  const std::vector<at::Tensor>& extra;
  std::string ambient;
  const std::string& context;
};

struct Guard {
  std::string prefix;  // the prefix of the handle fn was called with ("" for a root handle)
  std::vector<Observation> observations;
  std::vector<TensorSpec> extra_inputs;  // CompileOptions::inputs or CallState::inputs
  bool grad_mode = true;
  std::string ambient;  // ambient_state() of the call
  std::string context;  // CallState::context of the call
  // Dim 0 is free (kDynamicSize) in some reads and in the BatchSize preconditions of writes:
  // one size B, bound by the first of them and equal in all (generalize_dim0).
  bool dynamic_dim0 = false;

  // True when every observation holds on `root` (the dict's whole-dict handle) called through
  // a handle of `prefix`, the extra inputs match and the ambient state and context are equal;
  // `reads` then holds the tensors of the successful Read observations, in order, and *dim0 (when
  // given) the bound size B of a dynamic guard (-1 otherwise). One evaluation per observation;
  // Keys, Count and HasPrefix with exclusions cost O(keys under their prefix).
  bool check(const TensorDict& root, const std::string& prefix, const CallInputs& call,
             std::vector<at::Tensor>* reads, int64_t* dim0 = nullptr) const;
  // Whether this guard accepts everything the exact guard `g` observed (equal, or equal but
  // for dynamic dim-0 sizes that agree on one B).
  bool covers(const Guard& g) const;
  // The first observation that does not hold, in words, e.g. "get(\"obs\") sizes [256, 784] !=
  // [96, 784]"; empty when the guard holds.
  std::string mismatch(const TensorDict& root, const std::string& prefix,
                       const CallInputs& call) const;
  std::string describe() const;  // short summary: "reads obs, action; asks contains(mask)"
  bool operator==(const Guard&) const = default;
};

// What a call did to the dict, replayed after a graph run. Graph outputs are the `returns`
// returned tensors, then the final value of each key in `writes`, then of each `lazy`.
struct Effects {
  std::vector<std::string> erases;  // applied first
  std::vector<std::string> writes;  // then these sets
  std::vector<LazyInfo> lazy;       // then get_or_compute results (key, deps, version)
  int64_t lazy_reuses = 0;          // valid properties the call reused (LazyStats::reused)
  int64_t returns = 0;              // tensors returned (0 or 1 for a function returning a tensor)
  std::string structure;  // CallResult::structure: how the caller arranges them ("" in C++)
  bool operator==(const Effects& o) const;
};

// The guard accepting both exact guards when they differ only in dim 0 of some reads, all
// from one size to one other size (*from -> *to), and in the same way in the BatchSize
// preconditions of writes (never in a batch_size() the function itself read); nullopt
// otherwise. Whether the two traces are one graph is the caller's question.
std::optional<Guard> generalize_dim0(const Guard& a, const Guard& b, int64_t* from, int64_t* to);

// Persisted form (docs/FORMAT.md, "Compiled graphs"). from_json reads what
// storage::parse_graph_meta parsed and throws CorruptionError naming the field on malformed
// input.
nlohmann::json to_json(const Guard& g, const Effects& e);
void from_json(const nlohmann::json& j, Guard* g, Effects* e);
uint64_t guard_hash(const Guard& g);

}  // namespace tdstore::detail
