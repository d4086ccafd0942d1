// verify, diff, compact: integrity and maintenance.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "storage/checksum.h"
#include "storage/compact.h"
#include "storage/store.h"
#include "tdstore/tdstore.h"
#include "tools/cli/commands.h"
#include "tools/cli/output.h"

namespace tdstore::cli {
namespace {

using json = nlohmann::json;

// Every stored tensor by display name: a ragged key's offsets show as "<key> (offsets)".
std::map<std::string, storage::Entry> entries_of(storage::Store& s) {
  std::map<std::string, storage::Entry> out;
  s.for_each([&](std::string_view k, const storage::Entry& e) {
    std::string name(k.substr(0, k.find('\0')));
    if (k.find('\0') != std::string_view::npos) name += " (offsets)";
    out.emplace(name, e);
  });
  return out;
}

}  // namespace

int cmd_verify(const Args& a) {
  auto store = storage::Store::open(a.store, OpenMode::ReadOnly, {});
  auto all = entries_of(*store);
  std::vector<std::pair<std::string, storage::Entry>> todo;
  if (a.keys.empty()) {
    todo.assign(all.begin(), all.end());
  } else {
    for (const auto& k : a.keys) {
      auto it = all.find(k);
      if (it == all.end()) throw KeyError(a.store + ": key '" + k + "' not found");
      todo.emplace_back(*it);
    }
  }
  uint64_t total = 0, done = 0;
  for (const auto& [k, e] : todo) total += e.nbytes;
  std::vector<std::string> bad;
  {
    Progress bar("verify", total);
    for (const auto& [k, e] : todo) {
      // Hash in 64 MiB pieces so the bar moves on large tensors.
      const auto* p = static_cast<const uint8_t*>(store->data(e));
      storage::Xxh3Stream h;
      for (uint64_t off = 0; off < e.nbytes; off += 64 << 20) {
        uint64_t n = std::min<uint64_t>(64 << 20, e.nbytes - off);
        h.update(p + off, n);
        bar.update(done += n);
      }
      if (h.digest() != e.content_hash) bad.push_back(k);
    }
  }
  std::vector<std::string> damaged, structure;  // catalog records that cannot be decoded; the rest
  if (a.keys.empty())
    for (auto& problem : store->verify_structure()) {
      if (problem.rfind("/catalog/", 0) == 0) damaged.push_back(problem.substr(9));
      else structure.push_back(std::move(problem));
    }
  if (a.json) {
    std::cout << json{{"path", a.store}, {"checked", todo.size()}, {"bytes", total}, {"corrupt", bad},
                      {"damaged_catalog_records", damaged}, {"damaged_structure", structure}}
                     .dump(2)
              << "\n";
  } else if (bad.empty() && damaged.empty() && structure.empty()) {
    fmt::print("{}: {} keys intact ({} hashed)\n", a.store, todo.size(), human_bytes(total));
  }
  for (const auto& k : bad) fmt::print(stderr, "{}: key '{}' fails its checksum\n", a.store, k);
  for (const auto& k : damaged)
    fmt::print(stderr, "{}: catalog record '{}' is damaged{}\n", a.store, k,
               k.rfind("graph/", 0) == 0 ? " (a compiled-graph cache entry: `tdstore cache --clear` removes it)" : "");
  for (const auto& problem : structure) fmt::print(stderr, "{}: key directory damaged: {}\n", a.store, problem.substr(1));
  return bad.empty() && damaged.empty() && structure.empty() ? kOk : kCorrupt;
}

int cmd_diff(const Args& a) {
  auto sa = storage::Store::open(a.store, OpenMode::ReadOnly, {});
  auto sb = storage::Store::open(a.other, OpenMode::ReadOnly, {});
  auto ea = entries_of(*sa), eb = entries_of(*sb);
  std::vector<std::string> added, removed, content;
  json spec = json::array();
  auto describe = [](const storage::Entry& e) {
    return json{{"dtype", storage::dtype_name(e.dtype)}, {"shape", e.shape}};
  };
  for (const auto& [k, e] : ea) {
    auto it = eb.find(k);
    if (it == eb.end()) {
      removed.push_back(k);
    } else if (it->second.dtype != e.dtype || it->second.shape != e.shape) {
      spec.push_back({{"key", k}, {"a", describe(e)}, {"b", describe(it->second)}});
    } else if (it->second.content_hash != e.content_hash) {
      content.push_back(k);
    }
  }
  for (const auto& [k, e] : eb)
    if (!ea.count(k)) added.push_back(k);
  bool same = added.empty() && removed.empty() && spec.empty() && content.empty();
  if (a.json) {
    std::cout << json{{"a", a.store}, {"b", a.other}, {"added", added}, {"removed", removed},
                      {"spec_changed", spec}, {"content_changed", content}, {"identical", same}}
                     .dump(2)
              << "\n";
    return same ? kOk : kDiffer;
  }
  for (const auto& k : added) fmt::print("+ {}\n", k);
  for (const auto& k : removed) fmt::print("- {}\n", k);
  for (const auto& s : spec)
    fmt::print("~ {}: {} {} -> {} {}\n", s["key"].get<std::string>(), s["a"]["dtype"].get<std::string>(),
               s["a"]["shape"].dump(), s["b"]["dtype"].get<std::string>(), s["b"]["shape"].dump());
  for (const auto& k : content) fmt::print("* {}: content differs\n", k);
  if (same) fmt::print("identical: {} keys\n", ea.size());
  return same ? kOk : kDiffer;
}

int cmd_compact(const Args& a) {
  storage::CompactResult r;
  {
    Progress bar("compact", 0);
    r = storage::compact(
        a.store, {},
        [&](uint64_t done, uint64_t total) {
          bar.set_total(total);
          bar.update(done);
        },
        a.key_capacity);
  }
  if (a.json) {
    std::cout << json{{"path", a.store}, {"keys", r.keys}, {"arena_bytes_before", r.arena_before},
                      {"arena_bytes_after", r.arena_after}, {"generation", r.generation}}
                     .dump(2)
              << "\n";
  } else {
    fmt::print("{}: compacted {} keys, arena {} -> {}, generation {}\n", a.store, r.keys,
               human_bytes(r.arena_before), human_bytes(r.arena_after), r.generation);
  }
  return kOk;
}

}  // namespace tdstore::cli
