// import, export: other formats in and out of a store.
#include <fmt/format.h>

#include <iostream>

#include "tdstore/tdstore.h"
#include "tools/cli/commands.h"
#include "tools/cli/output.h"

namespace tdstore::cli {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

int cmd_import(const Args& a) {
  // Each source: KEY=FILE (.npy or IDX, gzip or raw) or [PREFIX=]FILE.safetensors.
  std::map<std::string, at::Tensor> tensors;
  {
    Progress bar("import", a.keys.size());
    uint64_t done = 0;
    for (const auto& src : a.keys) {
      auto eq = src.find('=');
      std::string name = eq == std::string::npos ? "" : src.substr(0, eq);
      std::string file = eq == std::string::npos ? src : src.substr(eq + 1);
      if (ends_with(file, ".safetensors")) {
        for (auto& [k, t] : read_safetensors(file)) tensors[name.empty() ? k : name + "/" + k] = t;
      } else {
        if (name.empty()) throw Error("import: give a key for " + file + " as KEY=" + file);
        tensors[name] = ends_with(file, ".npy") ? read_npy(file) : read_idx(file);
      }
      bar.update(++done);
    }
  }
  if (tensors.empty()) throw Error("import: nothing to import");
  int64_t rows = -1;
  for (const auto& [k, t] : tensors) {
    if (t.dim() == 0) throw ShapeError("import: '" + k + "' is 0-d; imported tensors share batch dim 0");
    if (rows >= 0 && t.size(0) != rows)
      throw ShapeError(fmt::format("import: '{}' has {} rows, others have {}", k, t.size(0), rows));
    rows = t.size(0);
  }
  bool exists = std::filesystem::exists(std::filesystem::path(a.store) / "keys.tdd");
  TensorDict td = exists ? TensorDict::open(a.store, OpenMode::ReadWrite) : TensorDict::create(a.store, {a.append ? 0 : rows});
  if (a.append) {
    TensorDict batch({rows});
    for (const auto& [k, t] : tensors) batch.set(k, t);
    td.append(batch);
  } else {
    for (const auto& [k, t] : tensors) td.set(k, t);
  }
  td.commit();
  fmt::print("{}: imported {} key(s), {} rows; now {} rows, generation {}\n", a.store, tensors.size(), rows,
             td.batch_size().empty() ? 0 : td.batch_size()[0], td.generation());
  return kOk;
}

int cmd_export(const Args& a) {
  auto td = TensorDict::open(a.store);
  auto keys = a.keys.empty() ? td.keys() : a.keys;
  if (!a.safetensors.empty()) {
    std::map<std::string, at::Tensor> out;
    for (const auto& k : keys) out[k] = td.get(k);
    std::map<std::string, std::string> meta{{"format", "pt"}, {"source", "tdstore " + a.store}};
    write_safetensors(a.safetensors, out, meta);
    fmt::print("{}: wrote {} key(s) to {}\n", a.store, out.size(), a.safetensors);
  }
  if (!a.npy.empty()) {
    Progress bar("export", keys.size());
    uint64_t done = 0;
    const auto root = std::filesystem::absolute(a.npy).lexically_normal();
    for (const auto& k : keys) {
      // Keys never hold '.' or '..' components (FORMAT.md), but a store can be crafted: the
      // output path is checked to stay under the target directory all the same.
      auto file = (root / (k + ".npy")).lexically_normal();
      auto rel = file.lexically_relative(root);
      if (rel.empty() || *rel.begin() == "..")
        throw Error("export: key '" + k + "' would write " + file.string() + ", outside " + root.string());
      std::filesystem::create_directories(file.parent_path());
      write_npy(file, td.get(k));
      bar.update(++done);
    }
    fmt::print("{}: wrote {} .npy file(s) under {}\n", a.store, keys.size(), a.npy);
  }
  if (a.safetensors.empty() && a.npy.empty()) throw Error("export: give --safetensors FILE or --npy DIR");
  return kOk;
}

}  // namespace tdstore::cli
