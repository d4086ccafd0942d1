// The manifest of a dataset (docs/FORMAT.md, "Datasets"), parsed and written without
// libtorch: src/dataset.cpp publishes it, the admin API (tdstore/admin.h) and the CLI read it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tdstore::storage {

inline constexpr char kManifestAttr[] = "dataset";  // the manifest store's attribute
inline constexpr int kManifestFormat = 1;

// What must agree across shards for one key.
struct KeySpec {
  std::string dtype;
  std::vector<int64_t> shape;  // after the batch dims (a ragged key: after the values' dim 0)
  bool ragged = false;
  bool operator==(const KeySpec&) const = default;
  std::string text() const;  // "float32 [3]", "ragged int64 []"
};
using Specs = std::map<std::string, KeySpec>;

struct Manifest {
  std::vector<int64_t> row_shape;
  std::vector<std::pair<int64_t, int64_t>> shards;  // shard number, published rows; ascending
  Specs keys;
};

std::string manifest_json(const Manifest& m);
// FormatError for another manifest format; CorruptionError naming `where` for anything else.
Manifest parse_manifest(const std::string& text, const std::string& where);
// "<dir>/shards/<NNNNN>".
std::string shard_dir_name(int64_t shard);

}  // namespace tdstore::storage
