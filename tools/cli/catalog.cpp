// lazy, cache, key: what the catalog holds beside the tensors, and who may write its code.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "output.h"
#include "tdstore/admin.h"
#include "tdstore/errors.h"
#include "tdstore/trust.h"

namespace tdstore::cli {
namespace {

using json = nlohmann::json;

}  // namespace

int cmd_lazy(const Args& a) {
  if (!a.invalidate.empty()) {
    if (!invalidate_lazy(a.store, a.invalidate))
      throw KeyError(a.store + ": key '" + a.invalidate + "' is not a lazy property");
    fmt::print("{}: '{}' invalidated; the next get_or_compute recomputes it\n", a.store,
               a.invalidate);
    return kOk;
  }
  auto reader = StoreReader::open(a.store);
  json out = json::array();
  for (const auto& p : reader.lazy_properties()) {
    json deps = json::array();
    std::vector<std::string> names;
    for (const auto& d : p.deps) {
      deps.push_back({{"key", d.key},
                      {"xxh3", fmt::format("{:016x}", d.xxh3)},
                      {"fingerprint", fmt::format("{:016x}", d.fingerprint)}});
      names.push_back(d.key);
    }
    out.push_back({{"key", p.key},
                   {"valid", p.valid},
                   {"version", p.version},
                   {"deps", deps},
                   {"computed_at", iso_time(p.computed_at_ns)},
                   {"compute_seconds", p.compute_ns / 1e9}});
    if (a.json) continue;
    fmt::print("{}  {}  version '{}'  from [{}]  computed {} in {:.3f} s\n", p.key,
               p.valid ? "valid" : "STALE", p.version, fmt::join(names, ", "),
               iso_time(p.computed_at_ns), p.compute_ns / 1e9);
  }
  if (a.json)
    std::cout << out.dump(2) << "\n";
  else if (out.empty())
    fmt::print("{}: no lazy properties\n", a.store);
  return kOk;
}

int cmd_cache(const Args& a) {
  std::string store = a.store;
  if (a.user) {
    store = keyring_info().graph_cache.string();
    if (store.empty()) throw Error("no graph cache: no home directory and no XDG_CACHE_HOME");
    if (!std::filesystem::exists(store)) {
      fmt::print("{}: no compiled graphs (the cache is created on first use)\n", store);
      return kOk;
    }
  } else if (store.empty()) {
    throw ArgumentError("cache: name a STORE, or --user for this user's graph cache");
  }
  if (a.clear) {
    ClearResult r = clear_graphs(store, a.function);
    fmt::print("{}: removed {} compiled graph(s){}\n", store, r.removed - r.damaged,
               r.damaged ? fmt::format(" and {} damaged record(s)", r.damaged) : "");
    return kOk;
  }
  if (a.sign) {
    SignResult r = sign_graphs(store, a.function);
    fmt::print(
        "{}: signed {} unsigned compiled graph(s) with key {}; {} already signed, left "
        "as they were\n",
        store, r.signed_records, keyring_info().keys.at(0).id, r.kept);
    return kOk;
  }
  auto reader = StoreReader::open(store);
  std::vector<std::string> damaged;
  auto graphs = reader.graphs(a.function, &damaged);
  for (const auto& k : damaged)
    fmt::print(stderr, "{}: catalog record '{}' is damaged (skipped)\n", store, k);
  json out = json::array();
  for (const auto& g : graphs) {
    out.push_back({{"key", g.key},
                   {"function", g.function},
                   {"code_id", g.code_id},
                   {"torch_version", g.torch_version},
                   {"guard", g.guard},
                   {"bytes", g.bytes},
                   {"reads", g.reads},
                   {"dynamic_dim0", g.dynamic_dim0},
                   {"trust", g.trust},
                   {"signer", g.signer}});
    if (!a.json)
      fmt::print("{}  guard {}  {}  {}  code {}  libtorch {}  reads {}\n", g.function, g.guard,
                 human_bytes(g.bytes),
                 g.signer.empty() ? g.trust : fmt::format("{} (key {})", g.trust, g.signer),
                 g.code_id, g.torch_version,
                 g.reads.empty() ? "nothing" : fmt::format("{}", fmt::join(g.reads, ", ")));
  }
  if (a.json)
    std::cout << out.dump(2) << "\n";
  else if (out.empty())
    fmt::print("{}: no compiled graphs\n", store);
  return kOk;
}

int cmd_key(const Args& a) {
  if (!a.new_key.empty()) {
    std::string id = create_key_file(a.new_key);
    fmt::print(
        "{}: new key {} (mode 0600). Share it only with those whose graphs you would "
        "run; see README, \"Sharing a dataset\"\n",
        a.new_key, id);
    return kOk;
  }
  KeyringInfo k = keyring_info();
  if (a.json) {
    json keys = json::array();
    for (const auto& t : k.keys)
      keys.push_back({{"id", t.id}, {"path", t.path.string()}, {"signs", t.signs}});
    std::cout << json{{"keys", keys},
                      {"refused", k.refused},
                      {"graph_cache", k.graph_cache.string()}}
                     .dump(2)
              << "\n";
    return kOk;
  }
  for (const auto& t : k.keys)
    fmt::print("{}  {}  {}\n", t.id, t.signs ? "signs and loads" : "loads  ", t.path.string());
  for (const auto& r : k.refused) fmt::print("refused: {}\n", r);
  fmt::print("graph cache: {}\n", k.graph_cache.string());
  return kOk;
}

}  // namespace tdstore::cli
