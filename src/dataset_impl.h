// Dataset internals shared by src/dataset.cpp and the Loader (src/loader.cpp). Internal to src/.
#pragma once

#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "storage/dataset_manifest.h"
#include "storage/records.h"
#include "tdstore/dataset.h"
#include "tdstore/export.h"

namespace tdstore {
struct TDSTORE_HIDDEN Dataset::Impl {
  std::filesystem::path dir;
  TensorDict manifest_store;
  storage::Manifest manifest;
  std::map<int64_t, TensorDict> readers;  // shard id -> read handle (shards with published rows)
  std::vector<int64_t> starts;            // global row of each manifest shard's first row

  // Shard commits already found to hold what a seal published: id -> (seal generation, seal
  // commit time, shard generation, shard commit time).
  mutable std::map<int64_t, std::tuple<uint64_t, uint64_t, uint64_t, uint64_t>> verified;

  bool closed = false;  // Dataset::close(): every handle below is closed

  std::string where() const { return dir.string(); }
  std::filesystem::path shard_dir(int64_t id) const;
  // Why the published rows cannot be read (a shard damaged, or committed with other bytes after
  // its publish): rethrown by reader(); null when they can.
  std::exception_ptr unreadable;

  // Reads the manifest as manifest_store sees it and opens the shards it names, each checked
  // against what the manifest published (check_published). On open (`first`) a shard that
  // fails is recorded in `unreadable` (the handle can still publish); on refresh the error is
  // thrown and the handle keeps its state: it moves to the new manifest only when all pass.
  void load(bool first);
  // The read handle of a shard with published rows; rethrows `unreadable`.
  const TensorDict& reader(int64_t id) const;
  // CorruptionError naming the shard (and key) unless `shard`, opened now, holds what `m`
  // published of shard `id`: at least `rows` rows, every published key with its published
  // spec, and (format 2) the sealed commit, or published rows whose checksums match the seal.
  void check_published(const storage::Manifest& m, int64_t id, int64_t rows,
                       const TensorDict& shard) const;

  // What a value computed now from published key `key` depends on: xxh3 over every shard with
  // published rows of (shard number, published rows, the key's spec_fingerprint in that shard
  // as this handle reads it). A shard's committed but unpublished rows are part of its
  // fingerprint (conservative: such a commit changes it). nullopt when no published row has
  // the key.
  std::optional<uint64_t> fingerprint(const std::string& key) const;
  // The provenance of a Loader row feature over the published rows (deps sorted, each with
  // its fingerprint). KeyError naming the feature and the dep for a dep that is not a
  // published key, or the feature itself; Error for a ragged dep.
  storage::RowFeatureRecord feature_record(const std::string& feature,
                                           const std::vector<std::string>& deps,
                                           const std::string& version) const;
  // <dir>/features: the store of the Loader's row features over the published rows (plain
  // tensors over global rows, docs/FORMAT.md "Datasets"). Read handle, nullopt until it exists.
  std::optional<TensorDict> open_features() const;
  // Write handle, created on first use (built aside and renamed in, so concurrent first users
  // agree); waits up to lock_timeout_ms for another writer (another rank's Loader).
  TensorDict features_for_writing(int64_t lock_timeout_ms) const;
};

namespace detail {
struct DatasetAccess {
  static const Dataset::Impl& impl(const Dataset& d) { return *d.impl_; }
};
}  // namespace detail

}  // namespace tdstore
