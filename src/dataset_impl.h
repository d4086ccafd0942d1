// Dataset internals shared by src/dataset.cpp and the Loader (src/loader.cpp). Internal to src/.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "storage/dataset_manifest.h"
#include "tdstore/dataset.h"
#include "tdstore/export.h"

namespace tdstore {
struct TDSTORE_HIDDEN Dataset::Impl {
  std::filesystem::path dir;
  TensorDict manifest_store;
  storage::Manifest manifest;
  std::map<int64_t, TensorDict> readers;  // shard id -> read handle (shards with published rows)
  std::vector<int64_t> starts;            // global row of each manifest shard's first row

  std::string where() const { return dir.string(); }
  std::filesystem::path shard_dir(int64_t id) const;
  // Reads the manifest as manifest_store sees it and opens (or refreshes) the shards it names.
  void load();
};

namespace detail {
struct DatasetAccess {
  static const Dataset::Impl& impl(const Dataset& d) { return *d.impl_; }
};
}  // namespace detail

}  // namespace tdstore
