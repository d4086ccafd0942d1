// info, ls, show, stats, du: read-only views of a store.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "commands.h"
#include "output.h"
#include "tdstore/admin.h"
#include "tdstore/errors.h"
#include "tdstore/keys.h"
#include "values.h"

namespace tdstore::cli {
namespace {

using json = nlohmann::json;

// A row bound of --rows: an integer, named in the error when it is not one.
int64_t row_bound(const std::string& s, int64_t dflt, const std::string& rows) {
  if (s.empty()) return dflt;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  if (used != s.size())
    throw ArgumentError("--rows '" + rows + "': '" + s +
                        "' is not an integer (expected A:B, A: or :B)");
  return v;
}

// Rows "A:B" (either side optional) of batch dim 0, clamped.
std::pair<int64_t, int64_t> parse_rows(const std::string& rows, int64_t n) {
  auto colon = rows.find(':');
  int64_t a = row_bound(rows.substr(0, colon), 0, rows);
  int64_t b = colon == std::string::npos ? a + 1 : row_bound(rows.substr(colon + 1), n, rows);
  if (a < 0) a += n;
  if (b < 0) b += n;
  a = std::clamp<int64_t>(a, 0, n);
  b = std::clamp<int64_t>(b, a, n);
  return {a, b};
}

}  // namespace

int cmd_info(const Args& a) {
  auto reader = StoreReader::open(a.store);
  const StoreSummary i = reader.summary();
  uint64_t raw = 0, compressed = 0;  // the tensors' raw bytes; compressed keys
  for (const auto& e : reader.entries()) {
    raw += e.raw_nbytes + e.offsets_nbytes;
    compressed += e.compressed;
  }
  json j = {{"path", a.store},
            {"format_version", i.format_version},
            {"generation", i.generation},
            {"committed_at", iso_time(i.committed_at_ns)},
            {"batch_size", i.batch_size},
            {"keys", i.keys},
            {"key_slots_used", i.key_slots_used},
            {"key_capacity", i.key_capacity},
            {"tensor_bytes", i.tensor_bytes},
            {"tensor_raw_bytes", raw},
            {"compressed_keys", compressed},
            {"arena_bytes_used", i.arena_bytes_used},
            {"arena_bytes_on_disk", i.arena_bytes_on_disk},
            {"arena_bytes_reserved", i.arena_bytes_reserved},
            {"arena_bytes_reusable", i.arena_bytes_reusable},
            {"arena_bytes_pending", i.arena_bytes_pending},
            {"arena_bytes_allocated", i.arena_bytes_allocated},
            {"readers", i.readers},
            {"alignment", i.alignment},
            {"attributes", i.attributes},
            {"lazy_properties", i.lazy_properties},
            {"compiled_graphs", i.compiled_graphs},
            {"catalog_entries", i.catalog_entries}};
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return kOk;
  }
  fmt::print("store            {}\n", a.store);
  fmt::print("format version   {}\n", i.format_version);
  fmt::print("generation       {} (committed {})\n", i.generation, iso_time(i.committed_at_ns));
  fmt::print("batch size       [{}]\n", fmt::join(i.batch_size, ", "));
  fmt::print("keys             {} of {}\n", i.keys, i.key_capacity);
  if (compressed)
    fmt::print("tensor bytes     {} stored, {} raw ({:.2f}x; {} compressed keys)\n",
               human_bytes(i.tensor_bytes), human_bytes(raw), ratio(raw, i.tensor_bytes),
               compressed);
  else
    fmt::print("tensor bytes     {}\n", human_bytes(i.tensor_bytes));
  fmt::print("arena            {} used, {} on disk ({} allocated), {} reserved\n",
             human_bytes(i.arena_bytes_used), human_bytes(i.arena_bytes_on_disk),
             human_bytes(i.arena_bytes_allocated), human_bytes(i.arena_bytes_reserved));
  fmt::print("free space       {} reusable now, {} kept for readers ({} registered)\n",
             human_bytes(i.arena_bytes_reusable), human_bytes(i.arena_bytes_pending), i.readers);
  fmt::print("catalog entries  {} ({} attributes, {} lazy properties, {} compiled graphs)\n",
             i.catalog_entries, i.attributes, i.lazy_properties, i.compiled_graphs);
  return kOk;
}

int cmd_ls(const Args& a) {
  auto reader = StoreReader::open(a.store);
  std::vector<EntryInfo> entries = reader.entries(a.prefix);
  if (!a.prefix.empty() && entries.empty())
    throw KeyError(a.store + ": no key under '" + a.prefix + "'");
  json rows = json::array();
  std::vector<std::string> open;  // path components of the group printed last
  for (const auto& e : entries) {
    std::string state = "unverified";
    if (a.verify) {
      std::vector<std::string> names{e.key};
      if (e.ragged) names.push_back(e.key + " (offsets)");
      state = reader.verify(names).ok() ? "ok" : "CORRUPT";
    }
    std::vector<std::string> flags;
    if (e.lazy) flags.push_back("lazy");
    if (e.ragged) flags.push_back("ragged");
    if (e.compressed)
      flags.push_back(fmt::format("zstd {:.2f}x of {}", ratio(e.raw_nbytes, e.nbytes),
                                  human_bytes(e.raw_nbytes)));
    if (a.json) {
      rows.push_back({{"key", e.key},
                      {"dtype", dtype_name(e.dtype)},
                      {"shape", e.shape},
                      {"bytes", e.nbytes},
                      {"raw_bytes", e.raw_nbytes},
                      {"compression", e.compressed ? json("zstd") : json(nullptr)},
                      {"flags", flags},
                      {"xxh3", fmt::format("{:016x}", e.xxh3)},
                      {"checksum", state}});
      continue;
    }
    std::string detail =
        fmt::format("{:<10} {:<18} {:>10}  xxh3 {:016x} {}{}", dtype_name(e.dtype),
                    shape_str(e.shape), human_bytes(e.nbytes), e.xxh3, state,
                    flags.empty() ? "" : "  [" + fmt::format("{}", fmt::join(flags, ",")) + "]");
    if (a.flat) {
      fmt::print("{:<32} {}\n", e.key, detail);
      continue;
    }
    std::vector<std::string> parts = split_key(e.key);
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common])
      ++common;
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
  auto reader = StoreReader::open(a.store);
  Array t = reader.read_dense(a.key);
  int64_t a0 = 0, b0 = 0;
  if (!t.shape.empty()) {
    std::tie(a0, b0) = parse_rows(a.rows.empty() ? ":" : a.rows, t.shape[0]);
    if (a.rows.empty() && !a.png.empty()) b0 = std::min<int64_t>(t.shape[0], 16);
    t = slice_rows(t, a0, b0);
  }
  if (!a.png.empty() || a.draw) {
    if (!image_like(t))
      throw ShapeError(a.store + ": key '" + a.key + "' is " + std::string(dtype_name(t.dtype)) +
                       " " + shape_str(t.shape) +
                       "; images are uint8 [N, H, W] or [N, C, H, W] with C 1 or 3");
    if (!a.png.empty()) {
      write_png_grid(t, a.png);
      fmt::print("wrote rows {}:{} of '{}' to {}\n", a0, b0, a.key, a.png);
    }
    if (a.draw)
      std::cout << draw_images(a.rows.empty() ? slice_rows(t, 0, std::min<int64_t>(t.shape[0], 4))
                                              : t);
    return kOk;
  }
  if (a.json) {
    if (t.numel() > 100000)
      throw ShapeError(a.store + ": key '" + a.key + "': " + std::to_string(t.numel()) +
                       " values; narrow with --rows for --json (at most 100000)");
    std::function<json(size_t, uint64_t)> rec = [&](size_t dim, uint64_t base) -> json {
      if (dim == t.shape.size()) {
        if (is_complex(t.dtype)) {
          auto c = complex_at(t, base);
          return json::array({c.real(), c.imag()});
        }
        return value_at(t, base);
      }
      uint64_t stride = 1;
      for (size_t d = dim + 1; d < t.shape.size(); ++d) stride *= static_cast<uint64_t>(t.shape[d]);
      json arr = json::array();
      for (int64_t i = 0; i < t.shape[dim]; ++i)
        arr.push_back(rec(dim + 1, base + static_cast<uint64_t>(i) * stride));
      return arr;
    };
    json j = {{"key", a.key},
              {"dtype", dtype_name(t.dtype)},
              {"shape", t.shape},
              {"rows", {a0, b0}},
              {"values", rec(0, 0)}};
    std::cout << j.dump() << "\n";
    return kOk;
  }
  fmt::print("{} (rows {}:{})\n{}\n", a.key, a0, b0, format_array(t));
  return kOk;
}

int cmd_stats(const Args& a) {
  auto reader = StoreReader::open(a.store);
  std::vector<std::string> keys = a.keys;
  if (keys.empty())
    for (const auto& e : reader.entries()) keys.push_back(e.key);
  json out = json::array();
  for (const auto& k : keys) {
    const Array t = reader.read_dense(k);
    // Complex values count by magnitude; NaN and Inf exist only in floating and complex dtypes.
    const bool complex = is_complex(t.dtype), floating = complex || is_floating(t.dtype);
    const uint64_t n = static_cast<uint64_t>(t.numel());
    auto at = [&](uint64_t i) { return complex ? std::abs(complex_at(t, i)) : value_at(t, i); };
    int64_t nan = 0, inf = 0;
    uint64_t finite = 0;
    double lo = INFINITY, hi = -INFINITY, sum = 0;
    for (uint64_t i = 0; i < n; ++i) {
      double v = at(i);
      if (floating && std::isnan(v)) {
        ++nan;
      } else if (floating && std::isinf(v)) {
        ++inf;
      } else {
        ++finite, sum += v;
        lo = std::min(lo, v), hi = std::max(hi, v);
      }
    }
    json j = {{"key", k},         {"dtype", dtype_name(t.dtype)},
              {"shape", t.shape}, {"numel", t.numel()},
              {"nan", nan},       {"inf", inf}};
    std::vector<double> edges;
    std::vector<int64_t> counts;
    if (finite > 0) {
      const double mean = sum / static_cast<double>(finite);
      const int bins = std::max(1, a.bins);
      const double span = hi > lo ? hi - lo : 1.0;
      double squares = 0;  // second pass: deviations from the mean, as a two-pass std
      counts.assign(static_cast<size_t>(bins), 0);
      for (uint64_t i = 0; i < n; ++i) {
        double v = at(i);
        if (!std::isfinite(v)) continue;
        squares += (v - mean) * (v - mean);
        double b = std::floor((v - lo) / span * bins);
        ++counts[static_cast<size_t>(std::clamp<double>(b, 0, bins - 1))];
      }
      for (int b = 0; b <= bins; ++b) edges.push_back(lo + span * b / bins);
      j["min"] = lo;
      j["max"] = hi;
      j["mean"] = mean;
      j["std"] = finite > 1 ? std::sqrt(squares / static_cast<double>(finite - 1))
                            : 0.0;  // unbiased, as torch.std
      j["histogram"] = {{"edges", edges}, {"counts", counts}};
    }
    if (a.json) {
      out.push_back(j);
      continue;
    }
    fmt::print("{}: {} {}  ({} values)\n", k, dtype_name(t.dtype), shape_str(t.shape), t.numel());
    if (finite > 0)
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
  auto reader = StoreReader::open(a.store);
  const StoreSummary i = reader.summary();
  std::map<std::string, uint64_t> prefixes, keys, raw_keys;
  uint64_t raw = 0;
  for (const auto& e : reader.entries()) {
    const uint64_t bytes = e.nbytes + e.offsets_nbytes;  // offsets count with their ragged key
    keys[e.key] += bytes;
    raw_keys[e.key] += e.raw_nbytes + e.offsets_nbytes;
    raw += e.raw_nbytes + e.offsets_nbytes;
    for (size_t p = e.key.find('/'); p != std::string::npos; p = e.key.find('/', p + 1))
      prefixes[e.key.substr(0, p + 1)] += bytes;
  }
  const uint64_t overhead = i.arena_bytes_reclaimable;
  json j = {{"keys", keys},
            {"raw_keys", raw_keys},
            {"prefixes", prefixes},
            {"tensor_bytes", i.tensor_bytes},
            {"tensor_raw_bytes", raw},
            {"arena_bytes_used", i.arena_bytes_used},
            {"reclaimable_bytes", overhead},
            {"arena_bytes_on_disk", i.arena_bytes_on_disk},
            {"arena_bytes_allocated", i.arena_bytes_allocated},
            {"arena_bytes_reusable", i.arena_bytes_reusable},
            {"arena_bytes_pending", i.arena_bytes_pending},
            {"free_reserved_bytes", i.arena_bytes_reserved - i.arena_bytes_used}};
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return kOk;
  }
  std::vector<std::pair<uint64_t, std::string>> rows;
  for (const auto& [k, b] : prefixes) rows.emplace_back(b, k);
  for (const auto& [k, b] : keys) rows.emplace_back(b, k);
  std::sort(rows.begin(), rows.end(), [](auto& x, auto& y) { return x.second < y.second; });
  for (const auto& [b, k] : rows) {
    auto r = raw_keys.find(k);  // a key stored compressed: its raw bytes and the ratio
    if (r != raw_keys.end() && r->second != b)
      fmt::print("{:>12}  {}  (raw {}, {:.2f}x)\n", human_bytes(b), k, human_bytes(r->second),
                 ratio(r->second, b));
    else
      fmt::print("{:>12}  {}\n", human_bytes(b), k);
  }
  fmt::print("{:>12}  total tensor bytes{}\n", human_bytes(i.tensor_bytes),
             raw != i.tensor_bytes
                 ? fmt::format(" (raw {}, {:.2f}x)", human_bytes(raw), ratio(raw, i.tensor_bytes))
                 : "");
  fmt::print(
      "\narena: {} used, {} reclaimable by `tdstore compact` (replaced and erased tensors, "
      "slot history, padding), {} on disk ({} allocated), {} of the reservation free\n",
      human_bytes(i.arena_bytes_used), human_bytes(overhead), human_bytes(i.arena_bytes_on_disk),
      human_bytes(i.arena_bytes_allocated),
      human_bytes(i.arena_bytes_reserved - i.arena_bytes_used));
  fmt::print(
      "free space: {} reusable by the next commits, {} kept for readers of older generations\n",
      human_bytes(i.arena_bytes_reusable), human_bytes(i.arena_bytes_pending));
  return kOk;
}

}  // namespace tdstore::cli
