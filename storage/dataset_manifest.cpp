#include "storage/dataset_manifest.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "tdstore/errors.h"

namespace tdstore::storage {

using json = nlohmann::json;

std::string KeySpec::text() const {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  return (ragged ? "ragged " : "") + dtype + " [" + dims + "]";
}

std::string shard_dir_name(int64_t shard) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%05lld", static_cast<long long>(shard));
  return buf;
}

std::string manifest_json(const Manifest& m) {
  json shards = json::array(), keys = json::object();
  for (const auto& [id, rows] : m.shards) shards.push_back({{"shard", id}, {"rows", rows}});
  for (const auto& [k, s] : m.keys)
    keys[k] = {{"dtype", s.dtype}, {"shape", s.shape}, {"ragged", s.ragged}};
  return json{
      {"format", kManifestFormat}, {"row_shape", m.row_shape}, {"shards", shards}, {"keys", keys}}
      .dump();
}

Manifest parse_manifest(const std::string& text, const std::string& where) {
  try {
    json j = json::parse(text);
    if (j.at("format").get<int>() != kManifestFormat)
      throw FormatError(where + ": manifest format " + j.at("format").dump() +
                        ", this build reads " + std::to_string(kManifestFormat));
    Manifest m;
    m.row_shape = j.at("row_shape").get<std::vector<int64_t>>();
    for (const auto& s : j.at("shards")) {
      int64_t id = s.at("shard").get<int64_t>(), rows = s.at("rows").get<int64_t>();
      if (id < 0 || rows < 0) throw CorruptionError(where + ": manifest: negative shard or rows");
      m.shards.emplace_back(id, rows);
    }
    for (const auto& [k, s] : j.at("keys").items())
      m.keys[k] = {s.at("dtype").get<std::string>(), s.at("shape").get<std::vector<int64_t>>(),
                   s.at("ragged").get<bool>()};
    return m;
  } catch (const json::exception&) {
    throw CorruptionError(where + ": manifest attribute '" + kManifestAttr +
                          "' is not {format, row_shape, shards: [{shard, rows}], keys}");
  }
}

}  // namespace tdstore::storage
