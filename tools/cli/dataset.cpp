// info, ls, verify, du on a dataset directory: per shard and in total (tdstore/dataset.h).
#include <fmt/format.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "output.h"
#include "tdstore/admin.h"
#include "tdstore/errors.h"
#include "values.h"

namespace tdstore::cli {
namespace {

using json = nlohmann::json;

}  // namespace

int dataset_info(const Args& a) {
  const DatasetInfo d = tdstore::dataset_info(a.store);
  json shards = json::array();
  uint64_t bytes = 0;
  for (const auto& s : d.shards) {
    const StoreSummary i = StoreReader::open(s.path).summary();
    const int64_t committed = i.batch_size.empty() ? 0 : i.batch_size[0];
    shards.push_back({{"shard", s.shard},
                      {"path", s.path.string()},
                      {"rows", s.rows},
                      {"committed_rows", committed},
                      {"generation", i.generation},
                      {"tensor_bytes", i.tensor_bytes}});
    bytes += i.tensor_bytes;
  }
  json features = nullptr;
  if (d.features) {
    const StoreSummary i = StoreReader::open(*d.features).summary();
    features = {{"path", d.features->string()}, {"keys", i.keys}, {"tensor_bytes", i.tensor_bytes}};
  }
  if (a.json) {
    std::cout << json{{"path", a.store},          {"dataset", true},  {"rows", d.rows},
                      {"row_shape", d.row_shape}, {"shards", shards}, {"tensor_bytes", bytes},
                      {"features", features}}
                     .dump(2)
              << "\n";
    return kOk;
  }
  fmt::print("dataset          {}\n", a.store);
  fmt::print("rows             {} published in {} shard(s)\n", d.rows, d.shards.size());
  fmt::print("tensor bytes     {}\n", human_bytes(bytes));
  for (const auto& s : shards)
    fmt::print("  shard {:05d}    {} rows published, {} committed, generation {}, {}\n",
               s["shard"].get<int64_t>(), s["rows"].get<int64_t>(),
               s["committed_rows"].get<int64_t>(), s["generation"].get<uint64_t>(),
               human_bytes(s["tensor_bytes"].get<uint64_t>()));
  if (d.features)
    fmt::print("row features     {} ({} keys, {})\n", d.features->string(),
               features["keys"].get<uint64_t>(),
               human_bytes(features["tensor_bytes"].get<uint64_t>()));
  return kOk;
}

int dataset_ls(const Args& a) {
  const DatasetInfo d = tdstore::dataset_info(a.store);
  // Keys and trailing shapes agree across shards (checked at publish); bytes add up.
  std::map<std::string, json> keys;
  for (const auto& s : d.shards) {
    if (s.rows == 0) continue;
    for (const auto& e : StoreReader::open(s.path).entries(a.prefix)) {
      json& k = keys[e.key];
      if (k.is_null()) {
        std::vector<int64_t> shape = e.shape;
        if (!shape.empty() && !e.ragged) shape[0] = d.rows;
        k = {{"key", e.key},   {"dtype", dtype_name(e.dtype)},
             {"shape", shape}, {"bytes", 0},
             {"shards", 0},    {"flags", e.ragged ? json::array({"ragged"}) : json::array()}};
      }
      k["bytes"] = k["bytes"].get<uint64_t>() + e.nbytes + e.offsets_nbytes;
      k["shards"] = k["shards"].get<int>() + 1;
    }
  }
  if (!a.prefix.empty() && keys.empty())
    throw KeyError(a.store + ": no key under '" + a.prefix + "'");
  json rows = json::array();
  for (auto& [k, j] : keys) rows.push_back(j);
  if (a.json) {
    std::cout << rows.dump(2) << "\n";
    return kOk;
  }
  for (const auto& j : rows)
    fmt::print("{:<32} {:<10} {:<18} {:>10}  in {} shard(s)\n", j["key"].get<std::string>(),
               j["dtype"].get<std::string>(), shape_str(j["shape"].get<std::vector<int64_t>>()),
               human_bytes(j["bytes"].get<uint64_t>()), j["shards"].get<int>());
  return kOk;
}

int dataset_verify(const Args& a) {
  const DatasetInfo d = tdstore::dataset_info(a.store);
  json shards = json::array();
  std::vector<std::string> problems;
  uint64_t checked = 0, bytes = 0;
  std::vector<std::pair<std::string, std::filesystem::path>> stores = {
      {"manifest", d.path / "manifest"}};
  for (const auto& s : d.shards) stores.emplace_back(fmt::format("shard {:05d}", s.shard), s.path);
  if (d.features) stores.emplace_back("features", *d.features);
  for (const auto& [name, path] : stores) {
    const bool shard = name.starts_with("shard");
    VerifyReport r = StoreReader::open(path).verify(shard ? a.keys : std::vector<std::string>{});
    checked += r.checked, bytes += r.bytes;
    for (const auto& k : r.corrupt)
      problems.push_back(fmt::format("{}: key '{}' fails its checksum", name, k));
    for (const auto& k : r.damaged_catalog)
      problems.push_back(fmt::format("{}: catalog record '{}' is damaged", name, k));
    for (const auto& k : r.damaged_structure)
      problems.push_back(fmt::format("{}: key directory damaged: {}", name, k.substr(1)));
    shards.push_back({{"store", name},
                      {"path", path.string()},
                      {"checked", r.checked},
                      {"bytes", r.bytes},
                      {"corrupt", r.corrupt},
                      {"damaged_catalog_records", r.damaged_catalog},
                      {"damaged_structure", r.damaged_structure}});
  }
  if (a.json) {
    std::cout << json{{"path", a.store}, {"dataset", true},  {"checked", checked},
                      {"bytes", bytes},  {"stores", shards}, {"problems", problems}}
                     .dump(2)
              << "\n";
  } else if (problems.empty()) {
    fmt::print("{}: {} shard(s){} intact, {} keys ({} hashed)\n", a.store, d.shards.size(),
               d.features ? ", the manifest and the row features" : " and the manifest", checked,
               human_bytes(bytes));
  }
  for (const auto& p : problems) fmt::print(stderr, "{}: {}\n", a.store, p);
  return problems.empty() ? kOk : kCorrupt;
}

int dataset_du(const Args& a) {
  const DatasetInfo d = tdstore::dataset_info(a.store);
  json shards = json::object();
  uint64_t total = 0, used = 0;
  for (const auto& s : d.shards) {
    const StoreSummary i = StoreReader::open(s.path).summary();
    shards[fmt::format("{:05d}", s.shard)] = {{"tensor_bytes", i.tensor_bytes},
                                              {"arena_bytes_used", i.arena_bytes_used}};
    total += i.tensor_bytes, used += i.arena_bytes_used;
  }
  json features = nullptr;
  if (d.features) {
    const StoreSummary i = StoreReader::open(*d.features).summary();
    features = {{"tensor_bytes", i.tensor_bytes}, {"arena_bytes_used", i.arena_bytes_used}};
    total += i.tensor_bytes, used += i.arena_bytes_used;
  }
  if (a.json) {
    std::cout << json{{"shards", shards},
                      {"features", features},
                      {"tensor_bytes", total},
                      {"arena_bytes_used", used}}
                     .dump(2)
              << "\n";
    return kOk;
  }
  for (const auto& [k, v] : shards.items())
    fmt::print("{:>12}  shard {} ({} arena)\n", human_bytes(v["tensor_bytes"].get<uint64_t>()), k,
               human_bytes(v["arena_bytes_used"].get<uint64_t>()));
  if (d.features)
    fmt::print("{:>12}  row features ({} arena)\n",
               human_bytes(features["tensor_bytes"].get<uint64_t>()),
               human_bytes(features["arena_bytes_used"].get<uint64_t>()));
  fmt::print("{:>12}  total tensor bytes ({} arena)\n", human_bytes(total), human_bytes(used));
  return kOk;
}

}  // namespace tdstore::cli
