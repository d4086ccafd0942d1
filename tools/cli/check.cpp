// verify, diff, compact: integrity and maintenance.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "output.h"
#include "tdstore/admin.h"
#include "values.h"

namespace tdstore::cli {
namespace {

using json = nlohmann::json;

}  // namespace

int cmd_verify(const Args& a) {
  auto reader = StoreReader::open(a.store);
  VerifyReport r;
  {
    Progress bar("verify", 0, a.progress);
    r = reader.verify(a.keys, [&](uint64_t done, uint64_t total) {
      bar.set_total(total);
      bar.update(done);
    });
  }
  if (a.json) {
    std::cout << json{{"path", a.store},
                      {"checked", r.checked},
                      {"bytes", r.bytes},
                      {"corrupt", r.corrupt},
                      {"damaged_catalog_records", r.damaged_catalog},
                      {"damaged_structure", r.damaged_structure}}
                     .dump(2)
              << "\n";
  } else if (r.ok()) {
    fmt::print("{}: {} keys intact ({} hashed)\n", a.store, r.checked, human_bytes(r.bytes));
  }
  for (const auto& k : r.corrupt)
    fmt::print(stderr, "{}: key '{}' fails its checksum\n", a.store, k);
  for (const auto& k : r.damaged_catalog)
    fmt::print(stderr, "{}: catalog record '{}' is damaged{}\n", a.store, k,
               k.rfind("graph/", 0) == 0
                   ? " (a compiled-graph cache entry: `tdstore cache --clear` removes it)"
                   : "");
  for (const auto& problem : r.damaged_structure)
    fmt::print(stderr, "{}: key directory damaged: {}\n", a.store, problem.substr(1));
  return r.ok() ? kOk : kCorrupt;
}

int cmd_diff(const Args& a) {
  const StoreDiff d = diff(a.store, a.other);
  json spec = json::array();
  for (const auto& s : d.spec_changed)
    spec.push_back({{"key", s.key},
                    {"a", {{"dtype", dtype_name(s.a_dtype)}, {"shape", s.a_shape}}},
                    {"b", {{"dtype", dtype_name(s.b_dtype)}, {"shape", s.b_shape}}}});
  if (a.json) {
    std::cout << json{{"a", a.store},
                      {"b", a.other},
                      {"added", d.added},
                      {"removed", d.removed},
                      {"spec_changed", spec},
                      {"content_changed", d.content_changed},
                      {"identical", d.identical()}}
                     .dump(2)
              << "\n";
    return d.identical() ? kOk : kDiffer;
  }
  for (const auto& k : d.added) fmt::print("+ {}\n", k);
  for (const auto& k : d.removed) fmt::print("- {}\n", k);
  for (const auto& s : d.spec_changed)
    fmt::print("~ {}: {} {} -> {} {}\n", s.key, dtype_name(s.a_dtype), json(s.a_shape).dump(),
               dtype_name(s.b_dtype), json(s.b_shape).dump());
  for (const auto& k : d.content_changed) fmt::print("* {}: content differs\n", k);
  if (d.identical()) fmt::print("identical: {} keys\n", d.keys);
  return d.identical() ? kOk : kDiffer;
}

int cmd_compact(const Args& a) {
  CompactResult r;
  {
    Progress bar("compact", 0, a.progress);
    CompactOptions options;
    if (a.key_capacity) options.key_capacity = a.key_capacity;
    if (!a.compress.empty()) options.compression = Compression::parse(a.compress);
    options.progress = [&](uint64_t done, uint64_t total) {
      bar.set_total(total);
      bar.update(done);
    };
    r = compact(a.store, options);
  }
  if (a.json) {
    std::cout << json{{"path", a.store},
                      {"keys", r.keys},
                      {"arena_bytes_before", r.arena_bytes_before},
                      {"arena_bytes_after", r.arena_bytes_after},
                      {"generation", r.generation}}
                     .dump(2)
              << "\n";
  } else {
    fmt::print("{}: compacted {} keys, arena {} -> {}, generation {}\n", a.store, r.keys,
               human_bytes(r.arena_bytes_before), human_bytes(r.arena_bytes_after), r.generation);
  }
  return kOk;
}

}  // namespace tdstore::cli
