// The meta JSON of a compiled-graph record (docs/FORMAT.md, "Compiled graphs"), parsed once for
// every reader: src/guard.cpp turns it into a guard and effects, StoreReader::graphs describes
// it. Names stay strings here (dtypes, devices, reads, queries, error kinds); what they mean,
// and the types of query answers, are src/'s business.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tdstore::storage {

struct GraphSpec {
  std::string dtype;                    // "float32"
  std::vector<int64_t> sizes, strides;  // of one rank; sizes[0] may be -1 in a dynamic guard
  std::string device;                   // "cpu"
  bool requires_grad = false;
};

struct GraphObservation {
  enum class Kind : uint8_t { Read, Query, Lazy };
  Kind kind = Kind::Read;
  std::string call;                  // Read: the read ("get"); Query: the query ("contains")
  std::string key;                   // Lazy: the property
  GraphSpec spec;                    // Read, unless it failed
  nlohmann::json answer;             // Query, unless it failed; Lazy: a bool, unless it failed
  std::vector<std::string> exclude;  // Query: sorted
  std::vector<std::string> deps;     // Lazy
  std::string version;               // Lazy
  std::optional<std::pair<std::string, std::string>> error;  // the call threw: kind, message
};

struct GraphLazyWrite {
  std::string key;
  std::vector<std::string> deps;
  std::string version;
};

struct GraphMeta {
  std::string prefix;
  std::vector<GraphObservation> observations;
  std::vector<GraphSpec> inputs;
  bool grad_mode = true;
  bool dynamic_dim0 = false;
  std::string ambient, context;
  std::vector<std::string> erases, writes;
  std::vector<GraphLazyWrite> lazy_writes;
  int64_t lazy_reuses = 0;
  int64_t returns = 0;                   // 0 or 1 without a structure; at most 2^20 with one
  std::optional<std::string> structure;  // how a Python caller arranges the returned tensors
};

// Throws CorruptionError("guard record: <what is wrong>") for a missing or mistyped field, an
// observation of no known kind, sizes and strides of different ranks, an unsorted exclude list,
// or a returned-tensor count out of range.
GraphMeta parse_graph_meta(const nlohmann::json& meta);

}  // namespace tdstore::storage
