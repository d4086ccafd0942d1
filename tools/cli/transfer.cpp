// import, export: other formats in and out of a store.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <optional>

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

// HDF5 and zarr are read through their Python libraries: the torch-free tool refuses them
// and names the Python entry points.
static void refuse_python_only(const std::string& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const bool zarr = fs::exists(fs::path(file) / ".zgroup", ec) || ends_with(file, ".zarr");
  if (zarr || ends_with(file, ".h5") || ends_with(file, ".hdf5") || ends_with(file, ".hdf"))
    throw ArgumentError("import: " + file + " is " + (zarr ? "a zarr group" : "an HDF5 file") +
                        ", which this tool does not read: use `python3 -m tdstore import STORE " +
                        file + "` or tdstore.import_from(\"" + file + "\", STORE) (h5py/zarr)");
}

int cmd_import(const Args& a) {
  // Each source: KEY=FILE (.npy or IDX, gzip or raw), [PREFIX=]FILE.safetensors or [PREFIX=]DIR
  // (a tensordict memmap directory, else a directory of .npy files).
  std::map<std::string, Array> arrays;
  for (const auto& src : a.keys) {
    auto eq = src.find('=');
    std::string name = eq == std::string::npos ? "" : src.substr(0, eq);
    std::string file = eq == std::string::npos ? src : src.substr(eq + 1);
    refuse_python_only(file);
    auto add_all = [&](std::map<std::string, Array> more) {
      for (auto& [k, t] : more) arrays[name.empty() ? k : name + "/" + k] = std::move(t);
    };
    std::error_code ec;
    if (std::filesystem::is_directory(file, ec)) {
      add_all(std::filesystem::exists(std::filesystem::path(file) / "meta.json", ec)
                  ? read_tensordict_arrays(file)
                  : read_npy_directory(file));
    } else if (ends_with(file, ".safetensors")) {
      add_all(read_safetensors_arrays(file));
    } else {
      if (name.empty()) throw ArgumentError("import: give a key for " + file + " as KEY=" + file);
      arrays[name] = ends_with(file, ".npy") ? map_npy_array(file) : read_idx_array(file);
    }
  }
  if (arrays.empty()) throw ArgumentError("import: nothing to import");
  ImportOptions options;
  options.append = a.append;
  if (!a.compress.empty()) options.compression = Compression::parse(a.compress);
  if (a.chunk_mib < 1) throw ArgumentError("import: --chunk-mib must be at least 1");
  options.chunk_bytes = static_cast<uint64_t>(a.chunk_mib) << 20;
  std::optional<Progress> bar;
  options.progress = [&](int64_t done, int64_t total) {
    if (!bar) bar.emplace("import", static_cast<uint64_t>(total), a.progress);
    bar->update(static_cast<uint64_t>(done));
  };
  ChunkedImportResult r = import_arrays_chunked(a.store, arrays, options);
  bar.reset();
  if (r.resumed_from > 0)
    fmt::print("{}: resumed after {} rows an earlier import committed\n", a.store, r.resumed_from);
  fmt::print("{}: imported {} key(s), {} rows; now {} rows, generation {}; {} bytes verified\n",
             a.store, r.keys, r.rows, r.total_rows, r.generation, r.verified_bytes);
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
        throw ArgumentError("export: key '" + k + "' would write " + file.string() + ", outside " +
                            root.string());
      std::filesystem::create_directories(file.parent_path());
      write_npy_array(file, reader.read_dense(k));
      bar.update(++done);
    }
    fmt::print("{}: wrote {} .npy file(s) under {}\n", a.store, keys.size(), a.npy);
  }
  if (!a.tensordict.empty()) {
    std::map<std::string, Array> out;
    for (const auto& k : keys) out[k] = reader.read_dense(k);
    write_tensordict_arrays(a.tensordict, out, reader.summary().batch_size);
    fmt::print("{}: wrote {} key(s) as a tensordict memmap directory {}\n", a.store, out.size(),
               a.tensordict);
  }
  if (a.safetensors.empty() && a.npy.empty() && a.tensordict.empty())
    throw ArgumentError("export: give --safetensors FILE, --npy DIR or --tensordict DIR");
  return kOk;
}

}  // namespace tdstore::cli
