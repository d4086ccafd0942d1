#include "storage/records.h"

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <type_traits>

#include "storage/json_numbers.h"
#include "storage/messages.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

using json = nlohmann::json;

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t unhex(const json& j) {
  const std::string& s = j.get_ref<const std::string&>();
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw std::invalid_argument(in_quotes(s) + " is not 16 lowercase hex digits");
  return std::stoull(s, nullptr, 16);
}

template <class T>
T as(const json& j) {
  if constexpr (std::is_same_v<T, bool>)
    return j.get<bool>();
  else if constexpr (std::is_same_v<T, uint64_t>)
    return json_uint(j);
  else
    return json_int(j);
}

// Runs parse; any JSON or conversion error becomes a CorruptionError naming where and what.
template <class F>
auto parsed(std::string_view text, const std::string& where, const char* what, F&& parse) {
  try {
    return parse(json::parse(text));
  } catch (const json::exception& e) {
    // The library's text without its "[json.exception.<kind>.<id>] " tag.
    std::string m = e.what();
    throw CorruptionError(where + " is not " + what + ": " +
                          m.substr(m.find("] ") == std::string::npos ? 0 : m.find("] ") + 2));
  } catch (const std::exception& e) {
    throw CorruptionError(where + " is not " + what + ": " + e.what());
  }
}

}  // namespace

LazyRecord parse_lazy_record(std::string_view text, const std::string& where) {
  return parsed(text, where, "valid provenance", [](const json& j) {
    LazyRecord r;
    r.version = j.at("version").get<std::string>();
    for (const auto& d : j.at("deps")) {
      if (!d.is_array() || d.size() < 2)
        throw std::invalid_argument("a dependency is not [key, fingerprint, ...]");
      r.deps.push_back(
          {d.at(0).get<std::string>(), unhex(d.at(1)), d.size() > 2 ? unhex(d.at(2)) : 0});
    }
    if (j.contains("fingerprint")) r.fingerprint = unhex(j.at("fingerprint"));
    r.xxh3 = j.contains("xxh3") ? unhex(j.at("xxh3")) : 0;
    r.computed_at_ns = json_int(j.at("computed_at_ns"));
    r.compute_ns = json_int(j.at("compute_ns"));
    return r;
  });
}

std::string lazy_record_json(const LazyRecord& r) {
  json deps = json::array();
  for (const auto& d : r.deps) deps.push_back({d.key, hex(d.fingerprint), hex(d.checksum)});
  json j = {{"version", r.version},
            {"deps", deps},
            {"xxh3", hex(r.xxh3)},
            {"computed_at_ns", r.computed_at_ns},
            {"compute_ns", r.compute_ns}};
  if (r.fingerprint) j["fingerprint"] = hex(*r.fingerprint);
  return j.dump();
}

LoaderPosition parse_loader_record(std::string_view text, const std::string& where) {
  return parsed(text, where, "a saved Loader position", [](const json& j) {
    LoaderPosition r;
    for_each_field(r, [&j]<class T>(const char* field, T& out) {
      if constexpr (std::is_same_v<T, decltype(r.shards)>) {
        if (!j.contains(field)) return;
        out.emplace();
        for (const auto& s : j.at(field)) out->emplace_back(json_int(s.at(0)), json_int(s.at(1)));
      } else if constexpr (requires { typename T::value_type; }) {
        if (j.contains(field)) out = as<typename T::value_type>(j.at(field));
      } else {
        out = as<T>(j.at(field));  // required
      }
    });
    return r;
  });
}

std::string loader_record_json(const LoaderPosition& r) {
  json j = json::object();
  for_each_field(r, [&j]<class T>(const char* field, const T& v) {
    if constexpr (std::is_same_v<T, decltype(r.shards)>) {
      if (!v) return;
      json shards = json::array();
      for (const auto& [id, rows] : *v) shards.push_back({id, rows});
      j[field] = shards;
    } else if constexpr (requires { typename T::value_type; }) {
      if (v) j[field] = *v;
    } else {
      j[field] = v;
    }
  });
  return j.dump();
}

RowFeatureRecord parse_row_feature_record(std::string_view text, const std::string& where) {
  return parsed(text, where, "row-feature progress", [](const json& j) {
    RowFeatureRecord r;
    for (const auto& d : j.at("deps"))
      r.deps.emplace_back(d.at(0).get<std::string>(), json_uint(d.at(1)));
    r.version = j.at("version").get<std::string>();
    return r;
  });
}

std::string row_feature_record_json(const RowFeatureRecord& r) {
  json deps = json::array();
  for (const auto& [k, h] : r.deps) deps.push_back({k, h});
  return json{{"deps", deps}, {"version", r.version}}.dump();
}

}  // namespace tdstore::storage
