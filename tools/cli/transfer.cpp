// import, export: other formats in and out of a store.
#include <fmt/format.h>

#include <iostream>

#include "commands.h"
#include "output.h"
#include "tdstore/admin.h"
#include "tdstore/errors.h"
#include "tdstore/formats.h"

namespace tdstore::cli {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

int cmd_import(const Args& a) {
  // Each source: KEY=FILE (.npy or IDX, gzip or raw) or [PREFIX=]FILE.safetensors.
  std::map<std::string, Array> arrays;
  {
    Progress bar("import", a.keys.size(), a.progress);
    uint64_t done = 0;
    for (const auto& src : a.keys) {
      auto eq = src.find('=');
      std::string name = eq == std::string::npos ? "" : src.substr(0, eq);
      std::string file = eq == std::string::npos ? src : src.substr(eq + 1);
      if (ends_with(file, ".safetensors")) {
        for (auto& [k, t] : read_safetensors_arrays(file))
          arrays[name.empty() ? k : name + "/" + k] = std::move(t);
      } else {
        if (name.empty()) throw Error("import: give a key for " + file + " as KEY=" + file);
        arrays[name] = ends_with(file, ".npy") ? read_npy_array(file) : read_idx_array(file);
      }
      bar.update(++done);
    }
  }
  if (arrays.empty()) throw ArgumentError("import: nothing to import");
  std::optional<Compression> compression;
  if (!a.compress.empty()) compression = Compression::parse(a.compress);
  ImportResult r = import_arrays(a.store, arrays, a.append, compression);
  fmt::print("{}: imported {} key(s), {} rows; now {} rows, generation {}\n", a.store, r.keys,
             r.rows, r.total_rows, r.generation);
  return kOk;
}

int cmd_export(const Args& a) {
  auto reader = StoreReader::open(a.store);
  std::vector<std::string> keys = a.keys;
  if (keys.empty())
    for (const auto& e : reader.entries()) keys.push_back(e.key);
  if (!a.safetensors.empty()) {
    std::map<std::string, Array> out;
    for (const auto& k : keys) out[k] = reader.read_dense(k);
    std::map<std::string, std::string> meta{{"format", "pt"}, {"source", "tdstore " + a.store}};
    write_safetensors_arrays(a.safetensors, out, meta);
    fmt::print("{}: wrote {} key(s) to {}\n", a.store, out.size(), a.safetensors);
  }
  if (!a.npy.empty()) {
    Progress bar("export", keys.size(), a.progress);
    uint64_t done = 0;
    const auto root = std::filesystem::absolute(a.npy).lexically_normal();
    for (const auto& k : keys) {
      // Keys never hold '.' or '..' components (FORMAT.md), but a store can be crafted: the
      // output path is checked to stay under the target directory all the same.
      auto file = (root / (k + ".npy")).lexically_normal();
      auto rel = file.lexically_relative(root);
      if (rel.empty() || *rel.begin() == "..")
        throw Error("export: key '" + k + "' would write " + file.string() + ", outside " +
                    root.string());
      std::filesystem::create_directories(file.parent_path());
      write_npy_array(file, reader.read_dense(k));
      bar.update(++done);
    }
    fmt::print("{}: wrote {} .npy file(s) under {}\n", a.store, keys.size(), a.npy);
  }
  if (a.safetensors.empty() && a.npy.empty())
    throw Error("export: give --safetensors FILE or --npy DIR");
  return kOk;
}

}  // namespace tdstore::cli
