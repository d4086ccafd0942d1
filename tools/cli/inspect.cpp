// info, ls, show, stats, du: read-only views of a store.
#include <ATen/TensorOperators.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "storage/store.h"
#include "tdstore/tdstore.h"
#include "tools/cli/commands.h"
#include "tools/cli/output.h"

namespace tdstore::cli {
namespace {

using json = nlohmann::json;

std::unique_ptr<storage::Store> open_store(const std::string& path) {
  return storage::Store::open(path, OpenMode::ReadOnly, {});
}

// Rows "A:B" (either side optional) of batch dim 0, clamped.
std::pair<int64_t, int64_t> parse_rows(const std::string& rows, int64_t n) {
  auto colon = rows.find(':');
  auto num = [](const std::string& s, int64_t dflt) { return s.empty() ? dflt : std::stoll(s); };
  int64_t a = num(rows.substr(0, colon), 0);
  int64_t b = colon == std::string::npos ? a + 1 : num(rows.substr(colon + 1), n);
  if (a < 0) a += n;
  if (b < 0) b += n;
  a = std::clamp<int64_t>(a, 0, n);
  b = std::clamp<int64_t>(b, a, n);
  return {a, b};
}

std::set<std::string> lazy_keys(const TensorDict& td) {
  std::set<std::string> out;
  for (const auto& p : td.lazy_properties()) out.insert(p.key);
  return out;
}

}  // namespace

int cmd_info(const Args& a) {
  auto store = open_store(a.store);
  auto i = store->info();
  auto sp = store->space();
  auto td = TensorDict::open(a.store);
  uint64_t catalog = store->scan_meta("").size();
  json j = {{"path", a.store},
            {"format_version", i.format_version},
            {"generation", i.generation},
            {"committed_at", iso_time(static_cast<int64_t>(i.commit_time_ns))},
            {"batch_size", i.batch_size},
            {"keys", i.live_keys},
            {"key_capacity", i.key_capacity},
            {"tensor_bytes", i.live_bytes},
            {"arena_bytes_used", i.arena_end},
            {"arena_bytes_on_disk", i.arena_file_size},
            {"arena_bytes_reserved", i.arena_reserve},
            {"arena_bytes_reusable", sp.reusable_bytes},
            {"arena_bytes_pending", sp.pending_bytes},
            {"arena_bytes_allocated", sp.allocated_bytes},
            {"readers", sp.readers},
            {"alignment", i.alignment},
            {"attributes", td.attr_names().size()},
            {"lazy_properties", td.lazy_properties().size()},
            {"compiled_graphs", store->scan_cache("graph/").size()},
            {"catalog_entries", catalog}};
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return kOk;
  }
  fmt::print("store            {}\n", a.store);
  fmt::print("format version   {}\n", i.format_version);
  fmt::print("generation       {} (committed {})\n", i.generation, iso_time(static_cast<int64_t>(i.commit_time_ns)));
  fmt::print("batch size       [{}]\n", fmt::join(i.batch_size, ", "));
  fmt::print("keys             {} of {}\n", i.live_keys, i.key_capacity);
  fmt::print("tensor bytes     {}\n", human_bytes(i.live_bytes));
  fmt::print("arena            {} used, {} on disk ({} allocated), {} reserved\n", human_bytes(i.arena_end),
             human_bytes(i.arena_file_size), human_bytes(sp.allocated_bytes), human_bytes(i.arena_reserve));
  fmt::print("free space       {} reusable now, {} kept for readers ({} registered)\n",
             human_bytes(sp.reusable_bytes), human_bytes(sp.pending_bytes), sp.readers);
  fmt::print("catalog entries  {} ({} attributes, {} lazy properties, {} compiled graphs)\n",
             catalog, j["attributes"].get<int>(), j["lazy_properties"].get<int>(),
             j["compiled_graphs"].get<int>());
  return kOk;
}

int cmd_ls(const Args& a) {
  auto store = open_store(a.store);
  auto td = TensorDict::open(a.store);
  auto lazy = lazy_keys(td);
  std::string prefix = a.prefix;
  if (!prefix.empty() && prefix.back() != '/') prefix += '/';
  std::map<std::string, storage::Entry> entries;
  store->for_each([&](std::string_view k, const storage::Entry& e) {
    // A ragged key's offsets ("<key>\0offsets") are listed with the key.
    if (k.substr(0, prefix.size()) == prefix && k.find('\0') == std::string_view::npos)
      entries.emplace(std::string(k), e);
  });
  if (!a.prefix.empty() && entries.empty() && !td.contains(a.prefix))
    throw KeyError(a.store + ": no key under '" + a.prefix + "'");
  if (!a.prefix.empty() && entries.empty()) {  // a leaf named exactly
    auto e = store->find(a.prefix);
    entries.emplace(a.prefix, *e);
  }
  json rows = json::array();
  std::vector<std::string> open;  // path components of the group printed last
  for (const auto& [k, e] : entries) {
    at::Tensor t = td.get(k);  // padded for a ragged key: its dtype
    std::string state = "unverified";
    if (a.verify) {
      auto bad = store->verify({k});
      if (e.flags & storage::kSlotRagged) {
        auto more = store->verify({storage::ragged_offsets_key(k)});
        bad.insert(bad.end(), more.begin(), more.end());
      }
      state = bad.empty() ? "ok" : "CORRUPT";
    }
    std::vector<std::string> flags;
    if (lazy.count(k)) flags.push_back("lazy");
    if (e.flags & storage::kSlotRagged) flags.push_back("ragged");
    if (a.json) {
      rows.push_back({{"key", k},
                      {"dtype", dtype_name(t)},
                      {"shape", e.shape},
                      {"bytes", e.nbytes},
                      {"flags", flags},
                      {"xxh3", fmt::format("{:016x}", e.content_hash)},
                      {"checksum", state}});
      continue;
    }
    std::string detail = fmt::format("{:<10} {:<18} {:>10}  xxh3 {:016x} {}{}", dtype_name(t),
                                     shape_str(e.shape), human_bytes(e.nbytes), e.content_hash,
                                     state, flags.empty() ? "" : "  [" + fmt::format("{}", fmt::join(flags, ",")) + "]");
    if (a.flat) {
      fmt::print("{:<32} {}\n", k, detail);
      continue;
    }
    std::vector<std::string> parts = split_key(k);
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common]) ++common;
    open.resize(common);
    for (size_t d = common; d + 1 < parts.size(); ++d) {
      fmt::print("{}{}/\n", std::string(2 * d, ' '), parts[d]);
      open.push_back(parts[d]);
    }
    size_t depth = parts.size() - 1;
    fmt::print("{}{:<{}} {}\n", std::string(2 * depth, ' '), parts.back(),
               std::max<int>(1, 30 - static_cast<int>(2 * depth)), detail);
  }
  if (a.json) std::cout << rows.dump(2) << "\n";
  return kOk;
}

int cmd_show(const Args& a) {
  auto td = TensorDict::open(a.store);
  at::Tensor t = td.get(a.key);
  int64_t a0 = 0, b0 = 0;
  if (t.dim() > 0) {
    std::tie(a0, b0) = parse_rows(a.rows.empty() ? ":" : a.rows, t.size(0));
    if (a.rows.empty() && !a.png.empty()) b0 = std::min<int64_t>(t.size(0), 16);
    t = t.slice(0, a0, b0);
  }
  if (!a.png.empty() || a.draw) {
    if (!image_like(t))
      throw ShapeError(a.store + ": key '" + a.key + "' is " + dtype_name(t) + " " + shape_str(t.sizes()) +
                       "; images are uint8 [N, H, W] or [N, C, H, W] with C 1 or 3");
    if (!a.png.empty()) {
      write_png_grid(t, a.png);
      fmt::print("wrote rows {}:{} of '{}' to {}\n", a0, b0, a.key, a.png);
    }
    if (a.draw) std::cout << draw_images(a.rows.empty() ? t.slice(0, 0, std::min<int64_t>(t.size(0), 4)) : t);
    return kOk;
  }
  if (a.json) {
    if (t.numel() > 100000)
      throw ShapeError(a.store + ": key '" + a.key + "': " + std::to_string(t.numel()) +
                       " values; narrow with --rows for --json (at most 100000)");
    at::Tensor d = t.is_complex() ? at::Tensor(t) : t.to(at::kDouble);
    std::function<json(const at::Tensor&)> rec = [&](const at::Tensor& x) -> json {
      if (x.dim() == 0) {
        if (x.is_complex()) {
          auto c = x.item<c10::complex<double>>();
          return json::array({c.real(), c.imag()});
        }
        return x.item<double>();
      }
      json arr = json::array();
      for (int64_t i = 0; i < x.size(0); ++i) arr.push_back(rec(x.select(0, i)));
      return arr;
    };
    json j = {{"key", a.key}, {"dtype", dtype_name(t)}, {"shape", t.sizes().vec()},
              {"rows", {a0, b0}}, {"values", rec(d)}};
    std::cout << j.dump() << "\n";
    return kOk;
  }
  fmt::print("{} (rows {}:{})\n{}\n", a.key, a0, b0, format_tensor(t));
  return kOk;
}

int cmd_stats(const Args& a) {
  auto td = TensorDict::open(a.store);
  auto keys = a.keys.empty() ? td.keys() : a.keys;
  json out = json::array();
  for (const auto& k : keys) {
    at::Tensor t = td.get(k);
    if (t.is_complex()) t = at::abs(t);
    at::Tensor d = t.to(at::kDouble).flatten();
    int64_t nan = 0, inf = 0;
    if (at::isFloatingType(t.scalar_type())) {
      nan = at::isnan(d).sum().item<int64_t>();
      inf = at::isinf(d).sum().item<int64_t>();
    }
    at::Tensor finite = (nan || inf) ? d.masked_select(~(at::isnan(d) | at::isinf(d))) : d;
    json j = {{"key", k}, {"dtype", dtype_name(t)}, {"shape", t.sizes().vec()}, {"numel", t.numel()},
              {"nan", nan}, {"inf", inf}};
    std::vector<double> edges;
    std::vector<int64_t> counts;
    if (finite.numel() > 0) {
      double lo = finite.min().item<double>(), hi = finite.max().item<double>();
      j["min"] = lo;
      j["max"] = hi;
      j["mean"] = finite.mean().item<double>();
      j["std"] = finite.numel() > 1 ? finite.std().item<double>() : 0.0;
      int bins = std::max(1, a.bins);
      double span = hi > lo ? hi - lo : 1.0;
      for (int b = 0; b <= bins; ++b) edges.push_back(lo + span * b / bins);
      at::Tensor idx = ((finite - lo) / span * bins).floor().clamp(0, bins - 1).to(at::kLong);
      at::Tensor hist = at::zeros({bins}, at::kLong).index_add_(0, idx, at::ones_like(idx));
      for (int b = 0; b < bins; ++b) counts.push_back(hist[b].item<int64_t>());
      j["histogram"] = {{"edges", edges}, {"counts", counts}};
    }
    if (a.json) {
      out.push_back(j);
      continue;
    }
    fmt::print("{}: {} {}  ({} values)\n", k, dtype_name(t), shape_str(t.sizes()), t.numel());
    if (finite.numel() > 0)
      fmt::print("  min {:.6g}  max {:.6g}  mean {:.6g}  std {:.6g}  nan {}  inf {}\n",
                 j["min"].get<double>(), j["max"].get<double>(), j["mean"].get<double>(),
                 j["std"].get<double>(), nan, inf);
    else
      fmt::print("  no finite values  nan {}  inf {}\n", nan, inf);
    if (!counts.empty()) std::cout << draw_histogram(edges, counts);
  }
  if (a.json) std::cout << out.dump(2) << "\n";
  return kOk;
}

int cmd_du(const Args& a) {
  auto store = open_store(a.store);
  auto i = store->info();
  std::map<std::string, uint64_t> prefixes, keys;
  store->for_each([&](std::string_view full, const storage::Entry& e) {
    std::string_view k = full.substr(0, full.find('\0'));  // offsets count with their ragged key
    keys[std::string(k)] += e.nbytes;
    for (size_t p = k.find('/'); p != std::string_view::npos; p = k.find('/', p + 1))
      prefixes[std::string(k.substr(0, p + 1))] += e.nbytes;
  });
  auto sp = store->space();
  uint64_t allocated = sp.allocated_bytes;
  uint64_t overhead = i.arena_end - std::min<uint64_t>(i.arena_end, i.live_bytes + storage::kArenaDataOffset);
  json j = {{"keys", keys},
            {"prefixes", prefixes},
            {"tensor_bytes", i.live_bytes},
            {"arena_bytes_used", i.arena_end},
            {"reclaimable_bytes", overhead},
            {"arena_bytes_on_disk", i.arena_file_size},
            {"arena_bytes_allocated", allocated},
            {"arena_bytes_reusable", sp.reusable_bytes},
            {"arena_bytes_pending", sp.pending_bytes},
            {"free_reserved_bytes", i.arena_reserve - i.arena_end}};
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return kOk;
  }
  std::vector<std::pair<uint64_t, std::string>> rows;
  for (const auto& [k, b] : prefixes) rows.emplace_back(b, k);
  for (const auto& [k, b] : keys) rows.emplace_back(b, k);
  std::sort(rows.begin(), rows.end(), [](auto& x, auto& y) { return x.second < y.second; });
  for (const auto& [b, k] : rows) fmt::print("{:>12}  {}\n", human_bytes(b), k);
  fmt::print("{:>12}  total tensor bytes\n", human_bytes(i.live_bytes));
  fmt::print("\narena: {} used, {} reclaimable by `tdstore compact` (replaced and erased tensors, "
             "slot history, padding), {} on disk ({} allocated), {} of the reservation free\n",
             human_bytes(i.arena_end), human_bytes(overhead), human_bytes(i.arena_file_size),
             human_bytes(allocated), human_bytes(i.arena_reserve - i.arena_end));
  fmt::print("free space: {} reusable by the next commits, {} kept for readers of older generations\n",
             human_bytes(sp.reusable_bytes), human_bytes(sp.pending_bytes));
  return kOk;
}

}  // namespace tdstore::cli
