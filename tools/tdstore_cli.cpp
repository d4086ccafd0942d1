// `tdstore`: inspect stored dicts from a shell. Subcommands: info, ls, show, verify.
// Exit codes: 0 success, 1 usage, 2 not a store, 3 corrupt (or verify found corrupt keys),
// 4 locked, 5 I/O error, 6 other error.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <ATen/core/Formatting.h>
#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>

#include "storage/store.h"
#include "tdstore/tdstore.h"

namespace {

using json = nlohmann::json;
using tdstore::OpenMode;
using tdstore::TensorDict;

std::string dtype_of(const at::Tensor& t) {
  std::string s(c10::toString(t.scalar_type()));
  static const std::map<std::string, std::string> names = {
      {"Bool", "bool"},       {"Byte", "uint8"},    {"Char", "int8"},        {"Short", "int16"},
      {"Int", "int32"},       {"Long", "int64"},    {"Half", "float16"},     {"BFloat16", "bfloat16"},
      {"Float", "float32"},   {"Double", "float64"}, {"ComplexFloat", "complex64"},
      {"ComplexDouble", "complex128"}};
  auto it = names.find(s);
  return it == names.end() ? s : it->second;
}

std::string human(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

int cmd_info(const std::string& path, bool as_json) {
  auto store = tdstore::storage::Store::open(path, OpenMode::ReadOnly, {});
  auto i = store->info();
  auto secs = static_cast<time_t>(i.commit_time_ns / 1000000000);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&secs));
  json j = {{"path", path},
            {"format_version", i.format_version},
            {"generation", i.generation},
            {"committed_at", when},
            {"batch_size", i.batch_size},
            {"keys", i.live_keys},
            {"key_capacity", i.key_capacity},
            {"tensor_bytes", i.live_bytes},
            {"arena_bytes_used", i.arena_end},
            {"arena_bytes_on_disk", i.arena_file_size},
            {"arena_bytes_reserved", i.arena_reserve},
            {"alignment", i.alignment},
            {"attributes", store->attr_names().size()}};
  if (as_json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  fmt::print("store           {}\n", path);
  fmt::print("format version  {}\n", i.format_version);
  fmt::print("generation      {} (committed {})\n", i.generation, when);
  fmt::print("batch size      [{}]\n", fmt::join(i.batch_size, ", "));
  fmt::print("keys            {} of {}\n", i.live_keys, i.key_capacity);
  fmt::print("tensor bytes    {}\n", human(i.live_bytes));
  fmt::print("arena           {} used, {} on disk, {} reserved\n", human(i.arena_end),
             human(i.arena_file_size), human(i.arena_reserve));
  fmt::print("attributes      {}\n", store->attr_names().size());
  return 0;
}

int cmd_ls(const std::string& path, const std::string& prefix, bool flat, bool as_json) {
  auto td = TensorDict::open(path);
  auto view = prefix.empty() ? td : td.sub(prefix);
  json rows = json::array();
  std::string last_group;
  for (const auto& k : view.keys()) {
    at::Tensor t = view.get(k);
    uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    if (as_json) {
      rows.push_back({{"key", view.prefix() + k}, {"dtype", dtype_of(t)}, {"shape", shape},
                      {"bytes", bytes}});
      continue;
    }
    std::string line = fmt::format("{} [{}] {}", dtype_of(t), fmt::join(shape, ", "), human(bytes));
    if (flat) {
      fmt::print("{}{}  {}\n", view.prefix(), k, line);
      continue;
    }
    auto slash = k.rfind('/');
    std::string group = slash == std::string::npos ? "" : k.substr(0, slash + 1);
    if (group != last_group && !group.empty()) fmt::print("{}\n", group);
    last_group = group;
    fmt::print("{}{}  {}\n", group.empty() ? "" : "  ", k.substr(group.size()), line);
  }
  if (as_json) std::cout << rows.dump(2) << "\n";
  return 0;
}

int cmd_show(const std::string& path, const std::string& key, const std::string& rows) {
  auto td = TensorDict::open(path);
  at::Tensor t = td.get(key);
  if (!rows.empty() && t.dim() > 0) {
    auto colon = rows.find(':');
    int64_t a = std::stoll(rows.substr(0, colon));
    int64_t b = colon == std::string::npos ? a + 1 : std::stoll(rows.substr(colon + 1));
    t = t.slice(0, a, b);
  }
  std::cout << key << ": " << dtype_of(t) << " " << t.sizes() << "\n" << t << "\n";
  return 0;
}

int cmd_verify(const std::string& path) {
  auto td = TensorDict::open(path);
  auto bad = td.verify();
  if (bad.empty()) {
    fmt::print("{}: {} keys intact\n", path, td.size());
    return 0;
  }
  for (const auto& k : bad) fmt::print(stderr, "{}: key '{}' fails its checksum\n", path, k);
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tdstore: inspect memory-mapped TensorDict stores"};
  app.require_subcommand(1);
  std::string path, key, prefix, rows;
  bool as_json = false, flat = false;

  auto* info = app.add_subcommand("info", "format version, generation, keys, arena usage");
  info->add_option("STORE", path, "store directory")->required();
  info->add_flag("--json", as_json, "machine-readable output");

  auto* ls = app.add_subcommand("ls", "keys with dtype, shape and bytes");
  ls->add_option("STORE", path, "store directory")->required();
  ls->add_option("PREFIX", prefix, "list only keys under this prefix");
  ls->add_flag("--flat", flat, "one full path per line");
  ls->add_flag("--json", as_json, "machine-readable output");

  auto* show = app.add_subcommand("show", "print a tensor's values");
  show->add_option("STORE", path, "store directory")->required();
  show->add_option("KEY", key, "key path")->required();
  show->add_option("--rows", rows, "rows A:B of batch dim 0");

  auto* verify = app.add_subcommand("verify", "re-hash every tensor and compare checksums");
  verify->add_option("STORE", path, "store directory")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 1;
  }
  try {
    if (*info) return cmd_info(path, as_json);
    if (*ls) return cmd_ls(path, prefix, flat, as_json);
    if (*show) return cmd_show(path, key, rows);
    if (*verify) return cmd_verify(path);
  } catch (const tdstore::FormatError& e) {
    fmt::print(stderr, "tdstore: {}\n", e.what());
    return 2;
  } catch (const tdstore::CorruptionError& e) {
    fmt::print(stderr, "tdstore: {}\n", e.what());
    return 3;
  } catch (const tdstore::LockError& e) {
    fmt::print(stderr, "tdstore: {}\n", e.what());
    return 4;
  } catch (const tdstore::IOError& e) {
    fmt::print(stderr, "tdstore: {}\n", e.what());
    return 5;
  } catch (const std::exception& e) {
    fmt::print(stderr, "tdstore: {}\n", e.what());
    return 6;
  }
  return 1;
}
