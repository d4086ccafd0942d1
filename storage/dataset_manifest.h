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
inline constexpr int kManifestFormat = 2;           // format 1 (no seals) is still read

// What must agree across shards for one key.
struct KeySpec {
  std::string dtype;
  std::vector<int64_t> shape;  // after the batch dims (a ragged key: after the values' dim 0)
  bool ragged = false;
  bool operator==(const KeySpec&) const = default;
  std::string text() const;  // "float32 [3]", "ragged int64 []"
};
using Specs = std::map<std::string, KeySpec>;

// What a publish recorded of one shard (format 2): the shard store's generation and commit
// time then, and the xxh3 of each key's published bytes (a dense key's first `rows` rows; a
// ragged key's values of those rows followed by its offsets [0, rows]). A reader whose shard
// is still at that commit reads it as published; otherwise it checks the checksums.
struct ShardSeal {
  uint64_t generation = 0;
  uint64_t committed_at_ns = 0;
  std::map<std::string, uint64_t> checksums;
  bool operator==(const ShardSeal&) const = default;
};

struct Manifest {
  std::vector<int64_t> row_shape;
  std::vector<std::pair<int64_t, int64_t>> shards;  // shard number, published rows; ascending
  Specs keys;
  std::map<int64_t, ShardSeal> seals;  // per shard with published rows; empty in format 1
};

std::string manifest_json(const Manifest& m);
// FormatError for another manifest format; CorruptionError naming `where` for anything else.
Manifest parse_manifest(const std::string& text, const std::string& where);
// "<dir>/shards/<NNNNN>".
std::string shard_dir_name(int64_t shard);

}  // namespace tdstore::storage
