// lazy, cache: what the catalog holds beside the tensors.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "output.h"
#include "tdstore/admin.h"
#include "tdstore/errors.h"

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
  if (a.clear) {
    ClearResult r = clear_graphs(a.store, a.function);
    fmt::print("{}: removed {} compiled graph(s){}\n", a.store, r.removed - r.damaged,
               r.damaged ? fmt::format(" and {} damaged record(s)", r.damaged) : "");
    return kOk;
  }
  auto reader = StoreReader::open(a.store);
  std::vector<std::string> damaged;
  auto graphs = reader.graphs(a.function, &damaged);
  for (const auto& k : damaged)
    fmt::print(stderr, "{}: catalog record '{}' is damaged (skipped)\n", a.store, k);
  json out = json::array();
  for (const auto& g : graphs) {
    out.push_back({{"key", g.key},
                   {"function", g.function},
                   {"code_id", g.code_id},
                   {"torch_version", g.torch_version},
                   {"guard", g.guard},
                   {"bytes", g.bytes},
                   {"reads", g.reads},
                   {"dynamic_dim0", g.dynamic_dim0}});
    if (!a.json)
      fmt::print("{}  guard {}  {}  code {}  libtorch {}  reads {}\n", g.function, g.guard,
                 human_bytes(g.bytes), g.code_id, g.torch_version,
                 g.reads.empty() ? "nothing" : fmt::format("{}", fmt::join(g.reads, ", ")));
  }
  if (a.json)
    std::cout << out.dump(2) << "\n";
  else if (out.empty())
    fmt::print("{}: no compiled graphs\n", a.store);
  return kOk;
}

}  // namespace tdstore::cli
