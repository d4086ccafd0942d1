#include "storage/dataset_manifest.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "storage/json_numbers.h"
#include "storage/messages.h"
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
  for (const auto& [id, rows] : m.shards) {
    json s = {{"shard", id}, {"rows", rows}};
    if (auto it = m.seals.find(id); it != m.seals.end()) {
      json sums = json::object();
      char hex[17];
      for (const auto& [k, sum] : it->second.checksums) {
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(sum));
        sums[k] = hex;
      }
      s["generation"] = it->second.generation;
      s["committed_at_ns"] = it->second.committed_at_ns;
      s["xxh3"] = sums;
    }
    shards.push_back(s);
  }
  for (const auto& [k, s] : m.keys)
    keys[k] = {{"dtype", s.dtype}, {"shape", s.shape}, {"ragged", s.ragged}};
  return json{
      {"format", kManifestFormat}, {"row_shape", m.row_shape}, {"shards", shards}, {"keys", keys}}
      .dump();
}

Manifest parse_manifest(const std::string& text, const std::string& where) {
  const std::string expected =
      "{format, row_shape, shards: [{shard, rows, generation, committed_at_ns, xxh3}], keys}";
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception&) {
    throw CorruptionError(where + ": manifest attribute '" + kManifestAttr +
                          "' is not JSON; expected " + expected);
  }
  auto field = [&](const json& obj, const char* name) -> const json& {
    if (!obj.is_object() || !obj.contains(name))
      throw CorruptionError(where + ": manifest: missing field " + in_quotes(std::string(name)) +
                            " (" + expected + ")");
    return obj.at(name);
  };
  try {
    const int64_t format = json_int(field(j, "format"));
    if (format != 1 && format != kManifestFormat)
      throw FormatError(where + ": manifest format " + std::to_string(format) +
                        ", this build reads 1 and " + std::to_string(kManifestFormat));
    Manifest m;
    m.row_shape = json_ints<int64_t>(field(j, "row_shape"));
    const json& shards = field(j, "shards");
    if (!shards.is_array()) throw std::invalid_argument("'shards' is not an array");
    for (const auto& s : shards) {
      const int64_t id = json_int(field(s, "shard")), rows = json_int(field(s, "rows"));
      if (id < 0 || rows < 0) throw CorruptionError(where + ": manifest: negative shard or rows");
      if (!m.shards.empty() && id <= m.shards.back().first)
        throw CorruptionError(where + ": manifest: shard numbers not ascending at shard " +
                              std::to_string(id));
      m.shards.emplace_back(id, rows);
      if (format < 2 || rows == 0) continue;
      ShardSeal seal;
      seal.generation = json_uint(field(s, "generation"));
      seal.committed_at_ns = json_uint(field(s, "committed_at_ns"));
      const json& sums = field(s, "xxh3");
      if (!sums.is_object()) throw std::invalid_argument("'xxh3' is not an object");
      for (const auto& [k, v] : sums.items()) {
        const std::string hex = v.is_string() ? v.get<std::string>() : "";
        if (hex.size() != 16 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
          throw std::invalid_argument("xxh3 of " + in_quotes(k) + " is not 16 hex digits");
        seal.checksums[k] = std::stoull(hex, nullptr, 16);
      }
      m.seals.emplace(id, std::move(seal));
    }
    const json& keys = field(j, "keys");
    if (!keys.is_object()) throw std::invalid_argument("'keys' is not an object");
    for (const auto& [k, s] : keys.items()) {
      const json& dtype = field(s, "dtype");
      const json& ragged = field(s, "ragged");
      if (!dtype.is_string() || !ragged.is_boolean())
        throw std::invalid_argument("key " + in_quotes(k) + ": bad dtype or ragged");
      m.keys[k] = {dtype.get<std::string>(), json_ints<int64_t>(field(s, "shape")),
                   ragged.get<bool>()};
    }
    return m;
  } catch (const std::invalid_argument& e) {
    throw CorruptionError(where + ": manifest: " + e.what() + " (" + expected + ")");
  } catch (const json::exception&) {
    throw CorruptionError(where + ": manifest attribute " + in_quotes(kManifestAttr) + " is not " +
                          expected);
  }
}

}  // namespace tdstore::storage
