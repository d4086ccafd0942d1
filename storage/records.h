// The JSON catalog records tdstore keeps beside tensors (docs/FORMAT.md, "Catalog"), parsed and
// written without libtorch: lazy-property provenance ("lazy/<key>"), saved Loader positions
// ("attr/loader/<name>") and row-feature progress ("attr/rowfeature/<key>"). Parsers throw
// CorruptionError naming `where` and the field, never a JSON exception.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tdstore/loader_position.h"

namespace tdstore::storage {

struct LazyRecord {
  std::string version;
  struct Dep {
    std::string key;
    uint64_t fingerprint = 0;
    uint64_t checksum = 0;  // 0 in records written before checksums were kept beside fingerprints
  };
  std::vector<Dep> deps;
  std::optional<uint64_t> fingerprint;  // absent in records of an earlier layout: stale
  uint64_t xxh3 = 0;
  int64_t computed_at_ns = 0, compute_ns = 0;
};
LazyRecord parse_lazy_record(std::string_view text, const std::string& where);
std::string lazy_record_json(const LazyRecord& r);

// A saved Loader position (docs/FORMAT.md, "loader/"): every field of LoaderPosition.
LoaderPosition parse_loader_record(std::string_view text, const std::string& where);
std::string loader_record_json(const LoaderPosition& r);

struct RowFeatureRecord {
  std::vector<std::pair<std::string, uint64_t>> deps;  // key, fingerprint
  std::string version;
};
RowFeatureRecord parse_row_feature_record(std::string_view text, const std::string& where);
std::string row_feature_record_json(const RowFeatureRecord& r);

}  // namespace tdstore::storage
