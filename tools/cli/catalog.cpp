// lazy, cache: what the catalog holds beside the tensors.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "storage/store.h"
#include "tdstore/tdstore.h"
#include "tools/cli/commands.h"
#include "tools/cli/output.h"

namespace tdstore::cli {
namespace {

using json = nlohmann::json;

}  // namespace

int cmd_lazy(const Args& a) {
  if (!a.invalidate.empty()) {
    auto td = TensorDict::open(a.store, OpenMode::ReadWrite);
    if (!td.invalidate(a.invalidate))
      throw KeyError(a.store + ": key '" + a.invalidate + "' is not a lazy property");
    td.commit();
    fmt::print("{}: '{}' invalidated; the next get_or_compute recomputes it\n", a.store, a.invalidate);
    return kOk;
  }
  auto td = TensorDict::open(a.store);
  json out = json::array();
  for (const auto& p : td.lazy_properties()) {
    json deps = json::array();
    for (size_t i = 0; i < p.deps.size(); ++i)
      deps.push_back({{"key", p.deps[i].first},
                      {"xxh3", fmt::format("{:016x}", i < p.dep_checksums.size() ? p.dep_checksums[i] : 0)},
                      {"fingerprint", fmt::format("{:016x}", p.deps[i].second)}});
    out.push_back({{"key", p.key}, {"valid", p.valid}, {"version", p.version}, {"deps", deps},
                   {"computed_at", iso_time(p.computed_at_ns)}, {"compute_seconds", p.compute_ns / 1e9}});
    if (a.json) continue;
    std::vector<std::string> names;
    for (const auto& [k, h] : p.deps) names.push_back(k);
    fmt::print("{}  {}  version '{}'  from [{}]  computed {} in {:.3f} s\n", p.key,
               p.valid ? "valid" : "STALE", p.version, fmt::join(names, ", "),
               iso_time(p.computed_at_ns), p.compute_ns / 1e9);
  }
  if (a.json) std::cout << out.dump(2) << "\n";
  else if (out.empty()) fmt::print("{}: no lazy properties\n", a.store);
  return kOk;
}

int cmd_cache(const Args& a) {
  auto store = storage::Store::open(a.store, OpenMode::ReadOnly, {});
  std::string prefix = "graph/" + (a.function.empty() ? std::string() : a.function + "/");
  std::vector<std::string> damaged;
  auto entries = store->scan_cache(prefix, &damaged);
  if (a.clear) {
    for (const auto& [k, v] : entries) store->put_cache(k, std::nullopt);
    for (const auto& k : damaged) store->put_cache(k, std::nullopt);
    fmt::print("{}: removed {} compiled graph(s){}\n", a.store, entries.size(),
               damaged.empty() ? "" : fmt::format(" and {} damaged record(s)", damaged.size()));
    return kOk;
  }
  for (const auto& k : damaged) fmt::print(stderr, "{}: catalog record '{}' is damaged (skipped)\n", a.store, k);
  json out = json::array();
  for (const auto& [k, v] : entries) {
    // graph/<function>/<code id>/<libtorch version>/<guard hash>
    std::vector<std::string> parts = split_key(k);
    json meta;
    uint32_t n = 0;
    if (v.size() >= 4) std::memcpy(&n, v.data(), 4);
    try {
      meta = json::parse(v.substr(4, n));
    } catch (const std::exception&) {
      meta = json::object();
    }
    std::vector<std::string> reads;
    if (meta.contains("observations"))
      for (const auto& o : meta["observations"])
        if (o.is_object() && o.contains("read") && o.contains("key") && o.contains("spec") &&
            o["key"].is_string() && o["spec"].is_object() && o["spec"].contains("dtype") &&
            o["spec"]["dtype"].is_string() && o["spec"].contains("sizes"))
        {
          std::vector<std::string> sizes;  // -1: a dynamic dim 0 (any size), shown as *
          for (const auto& d : o["spec"]["sizes"]) sizes.push_back(d == -1 ? "*" : d.dump());
          reads.push_back(fmt::format("{} {}[{}]", o["key"].get<std::string>(),
                                      o["spec"]["dtype"].get<std::string>(), fmt::join(sizes, ",")));
        }
    json row = {{"key", k}, {"function", parts.size() > 1 ? parts[1] : ""},
                {"code_id", parts.size() > 2 ? parts[2] : ""}, {"torch_version", parts.size() > 3 ? parts[3] : ""},
                {"guard", parts.size() > 4 ? parts[4] : ""}, {"bytes", v.size()}, {"reads", reads},
                {"dynamic_dim0", meta.contains("dynamic_dim0") && meta["dynamic_dim0"] == true}};
    out.push_back(row);
    if (!a.json)
      fmt::print("{}  guard {}  {}  code {}  libtorch {}  reads {}\n", row["function"].get<std::string>(),
                 row["guard"].get<std::string>(), human_bytes(v.size()),
                 row["code_id"].get<std::string>(), row["torch_version"].get<std::string>(),
                 reads.empty() ? "nothing" : fmt::format("{}", fmt::join(reads, ", ")));
  }
  if (a.json) std::cout << out.dump(2) << "\n";
  else if (out.empty()) fmt::print("{}: no compiled graphs\n", a.store);
  return kOk;
}

}  // namespace tdstore::cli
