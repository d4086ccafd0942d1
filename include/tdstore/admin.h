// Administration of stores without libtorch: what the `tdstore` tool does to a store as a
// whole. Part of the torch-free library libtdstore_storage (pkg-config tdstore-storage), which
// libtdstore builds on. Errors are tdstore::Error subclasses naming the path, the key or the
// record: FormatError (not a store, a newer format), CorruptionError, LockError, IOError,
// KeyError.
//
// Thread safety: a StoreReader's const member functions may be called from several threads at
// once; refresh() needs exclusive access. The free functions open their own handles.
//
// File access is a TensorDict's (tdstore/env.h): the key directory and the arena through the
// Env of StoreReader::open's options (the free functions use Env::posix()), the LMDB catalog
// and the reader table through their own system calls.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tdstore/dtype.h"
#include "tdstore/export.h"
#include "tdstore/formats.h"
#include "tdstore/handle_state.h"
#include "tdstore/options.h"

namespace tdstore {

// A store as `tdstore info` reports it (docs/CLI.md).
struct StoreSummary {
  std::filesystem::path path;
  uint32_t format_version = 0;
  uint64_t generation = 0;
  int64_t committed_at_ns = 0;  // wall clock of the last commit, ns since the Unix epoch
  std::vector<int64_t> batch_size;
  uint64_t keys = 0;                 // keys present (a ragged key's offsets not counted)
  uint64_t key_slots_used = 0;       // directory slots in use: a ragged key takes two
  uint64_t key_capacity = 0;         // entries the directory holds (a ragged key takes two)
  uint64_t tensor_bytes = 0;         // bytes stored for the tensors present (compressed: as stored)
  uint64_t arena_bytes_used = 0;     // arena high-water mark at this generation
  uint64_t arena_bytes_on_disk = 0;  // apparent size of arena.tda
  uint64_t arena_bytes_allocated = 0;  // its disk blocks
  uint64_t arena_bytes_reserved = 0;   // address range the handle reserved
  uint64_t arena_bytes_reusable = 0;   // free and visible to no reader: the next writes use it
  uint64_t arena_bytes_pending = 0;    // freed, still visible to a reader of an older generation
  uint64_t arena_bytes_reclaimable =
      0;                 // used, but by no tensor present: what compact() gives back
  uint32_t readers = 0;  // read handles of other live processes
  uint64_t alignment = 0;
  uint64_t attributes = 0, lazy_properties = 0, compiled_graphs = 0, catalog_entries = 0;
};

// One stored key, read from the key directory without building a tensor.
struct EntryInfo {
  std::string key;
  DType dtype = DType::UInt8;
  std::vector<int64_t> shape;  // as stored; a ragged key: its values, all rows' items concatenated
  uint64_t offset = 0;         // of the bytes in arena.tda (docs/FORMAT.md), e.g. for numpy.memmap
  uint64_t nbytes = 0;         // bytes stored (a compressed key: its blocks and block index)
  uint64_t raw_nbytes = 0;     // the tensor's bytes (shape times dtype size)
  bool compressed = false;     // zstd blocks (docs/FORMAT.md, "Compressed keys"): no memmap
  uint64_t capacity = 0;       // bytes reserved (> nbytes for keys grown by append)
  uint64_t xxh3 = 0;           // content checksum of the bytes
  uint64_t generation = 0;     // the commit that last wrote it
  bool ragged = false;         // values plus int64 offsets [rows + 1] (read_offsets)
  bool lazy = false;           // a lazy property: its provenance is in lazy_properties()
  uint64_t offsets_nbytes = 0, offsets_xxh3 = 0;  // a ragged key's offsets
};

struct VerifyReport {
  uint64_t checked = 0;              // tensors hashed (a ragged key's offsets count)
  uint64_t bytes = 0;                // bytes hashed
  std::vector<std::string> corrupt;  // failing their checksum; offsets as "<key> (offsets)"
  std::vector<std::string>
      damaged_catalog;  // "<record key>: <what is wrong>", records that cannot be decoded
  std::vector<std::string>
      damaged_structure;  // key directory or catalog damage (Store::verify_structure)
  bool ok() const {
    return corrupt.empty() && damaged_catalog.empty() && damaged_structure.empty();
  }
};

// Lazy-property provenance (TensorDict::get_or_compute) as stored, with its validity now.
struct LazyProvenance {
  std::string key;
  std::string version;
  struct Dep {
    std::string key;
    uint64_t fingerprint = 0;  // of its content checksum, dtype, shape and ragged offsets
    uint64_t xxh3 = 0;         // its content checksum at compute time
  };
  std::vector<Dep> deps;
  int64_t computed_at_ns = 0, compute_ns = 0;
  bool valid = false;  // the property and every dependency (recursively) unchanged since
};

// A compiled-graph cache record (docs/FORMAT.md, "graph/"): its key parts and what it reads.
struct GraphEntry {
  std::string key;  // graph/<function>/<code id>/<libtorch version>/<guard hash>
  std::string function, code_id, torch_version, guard;
  uint64_t bytes = 0;
  std::vector<std::string> reads;  // "obs float32[128,784]"; a dynamic dim 0 shows as *
  bool dynamic_dim0 = false;
  // Whether this user's compiled functions would load it (tdstore/trust.h): "trusted" (sealed
  // under a key this user holds), "unsigned" (written before records were sealed), "foreign"
  // (sealed under a key this user does not hold), "altered" (its MAC does not match), "newer"
  // (sealed by a newer build's seal version; never loaded by this one).
  std::string trust;
  std::string signer;  // the sealing key's id; "" when unsigned
};

struct SpecChange {
  std::string key;
  DType a_dtype, b_dtype;
  std::vector<int64_t> a_shape, b_shape;
};

// What differs between two stores, by key (a ragged key's offsets as "<key> (offsets)").
struct StoreDiff {
  std::vector<std::string> added, removed, content_changed;  // sorted
  std::vector<SpecChange> spec_changed;
  uint64_t keys = 0;  // tensors compared in the first store
  bool identical() const {
    return added.empty() && removed.empty() && content_changed.empty() && spec_changed.empty();
  }
};

// A read-only handle on a store's current generation (registered in its reader table like any
// reader, so no writer reuses what it reads).
class TDSTORE_API StoreReader {
 public:
  // FormatError when dir is not a store.
  static StoreReader open(const std::filesystem::path& dir, const StoreOptions& options = {});
  StoreReader(StoreReader&&) noexcept;
  StoreReader& operator=(StoreReader&&) noexcept;
  ~StoreReader();

  const std::filesystem::path& path() const;
  // O(catalog records) for the counts, O(1) for the rest.
  StoreSummary summary() const;
  // Keys in sorted order, those under prefix ("a/b" lists "a/b/..." and the key "a/b"): O(slots
  // used) on the first call (O(slot count) in format 3), O(log keys + listed) after.
  std::vector<EntryInfo> entries(std::string_view prefix = "") const;
  std::optional<EntryInfo> find(std::string_view key) const;
  // The stored bytes in place (no copy), valid while the Array lives. KeyError when absent.
  Array read(std::string_view key) const;
  // A ragged key's int64 offsets [rows + 1]; KeyError when key is not ragged.
  Array read_offsets(std::string_view key) const;
  // As TensorDict::get returns it: in place, or for a ragged key padded with zeros to
  // [rows, longest item, ...] (a copy).
  Array read_dense(std::string_view key) const;
  // Re-hashes the named keys (all keys and the store's structure when none are named);
  // progress(bytes hashed, total) is called at least every 64 MiB. KeyError for a key that is
  // absent; damage is reported, not thrown.
  VerifyReport verify(const std::vector<std::string>& keys = {},
                      const std::function<void(uint64_t, uint64_t)>& progress = {}) const;
  std::vector<std::string> attribute_names() const;
  std::optional<std::string> attribute(std::string_view name) const;
  // Sorted by key.
  std::vector<LazyProvenance> lazy_properties() const;
  // Graph records of one function ("" for all), sorted by key, as the catalog holds them now;
  // records that cannot be decoded, or whose meta does not parse, go to `damaged` (when
  // given), not into the list.
  std::vector<GraphEntry> graphs(std::string_view function = "",
                                 std::vector<std::string>* damaged = nullptr) const;
  // Moves to the newest committed generation; true when it changed.
  bool refresh();

  struct Impl;

 private:
  explicit StoreReader(std::unique_ptr<Impl> impl);
  detail::HandleState<std::unique_ptr<Impl>, detail::StoreReaderTag> impl_;
};

TDSTORE_API StoreDiff diff(const std::filesystem::path& a, const std::filesystem::path& b);

// A dataset directory (tdstore/dataset.h; docs/FORMAT.md, "Datasets") as its last publish
// lists it. Each shard is an ordinary store: open it with StoreReader for the rest.
struct DatasetShardInfo {
  int64_t shard = 0;
  int64_t rows = 0;  // published
  std::filesystem::path path;
};
struct DatasetInfo {
  std::filesystem::path path;
  std::vector<int64_t> row_shape;        // batch dims after the row dim
  std::vector<DatasetShardInfo> shards;  // ascending shard numbers
  int64_t rows = 0;                      // published rows over all shards
  // <dir>/features, the store of a Loader's row features over the published rows, once one
  // has been stored (docs/FORMAT.md, "Datasets").
  std::optional<std::filesystem::path> features;
};
// Whether dir holds a dataset (its manifest store). O(1).
TDSTORE_API bool is_dataset(const std::filesystem::path& dir);
// FormatError when dir is not a dataset; CorruptionError naming the manifest when it is damaged.
TDSTORE_API DatasetInfo dataset_info(const std::filesystem::path& dir);

struct CompactOptions {
  // Rebuild the key directory with this capacity: at least the entries in use
  // (StoreInfo::key_slots_used; a ragged key takes two). Unset: keep it.
  std::optional<int64_t> key_capacity;
  // Called as tensor bytes are copied: (bytes copied so far, total). Optional.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Rewrite every key under this compression (none: raw) and record it as the store's default
  // (StoreOptions::compression); content checksums change with the stored bytes, so lazy
  // properties are recomputed on their next use. Unset: every key copied as it is stored
  // (docs/FORMAT.md, "Compressed keys").
  std::optional<Compression> compression;
};

struct CompactResult {
  int64_t keys = 0;                 // live keys copied (ragged offsets count as keys)
  uint64_t arena_bytes_before = 0;  // arena bytes in use before
  uint64_t arena_bytes_after = 0;
  uint64_t generation = 0;  // the compacted store's generation (the old one + 1)
};

// Rewrites the store without holes (and with a new key capacity when asked), every record
// field carried through (flags such as ragged, the spare capacity of appended keys), with its
// attributes, lazy-property provenance and compiled graphs, and swaps it in atomically
// (renameat2(RENAME_EXCHANGE)): a crash at any instant leaves the old store or the new one,
// complete. LockError while another writer holds the store; Error when key_capacity is below
// the live keys or out of range. Handles opened before keep reading the old files; readers
// move to the new store on refresh().
TDSTORE_API CompactResult compact(const std::filesystem::path& dir,
                                  const CompactOptions& options = {});

struct ClearResult {
  uint64_t removed = 0;  // graph records removed
  uint64_t damaged = 0;  // of which could not be decoded or parsed
};
// Removes the compiled graphs of one function ("" for all), damaged records included. Cache
// records sit outside the commit protocol (no new generation); allowed while a writer is
// active. IOError when the catalog cannot be written.
TDSTORE_API ClearResult clear_graphs(const std::filesystem::path& dir,
                                     std::string_view function = "");

// Forgets a lazy property's provenance (the tensor stays) and commits: the next get_or_compute
// recomputes it. Returns false (committing nothing) when key has none. LockError while another
// writer holds the store.
TDSTORE_API bool invalidate_lazy(const std::filesystem::path& dir, std::string_view key);

struct ImportResult {
  uint64_t keys = 0;        // keys written
  int64_t rows = 0;         // rows imported (dim 0 of every array)
  int64_t total_rows = 0;   // batch dim 0 of the store afterwards
  uint64_t generation = 0;  // the commit that holds them
};
// Writes arrays sharing dim 0 into the store at dir (created when absent, batch size [rows]) in
// one commit. append: the rows extend the store's keys instead (created with batch size [0]
// when absent), with TensorDict::append's rules: the same keys (lazy properties and row
// features the arrays do not hold are dropped), the same dtypes and trailing dims. ShapeError,
// KeyError or DTypeError naming the key, writing nothing, when the arrays do not fit.
// compression: of the keys the import creates (a store it creates records it as its default,
// StoreOptions::compression); unset: the store's recorded default, else none. Appended rows take
// their key's.
TDSTORE_API ImportResult
import_arrays(const std::filesystem::path& dir, const std::map<std::string, Array>& arrays,
              bool append = false, const std::optional<Compression>& compression = std::nullopt);

struct ImportOptions {
  bool append = false;                     // as import_arrays
  std::optional<Compression> compression;  // as import_arrays
  uint64_t chunk_bytes = 64 << 20;         // rows copied per commit (at least one row)
  // Without append, an existing store that is not an earlier import of these arrays: replaced
  // (its keys take the arrays in one commit, as `tdstore import` does), or, when true, refused
  // with an IOError that names the store (as tdstore.import_from does), nothing written.
  bool refuse_other = false;
  // Called after each commit: (rows of the arrays in the store, rows of the arrays). Optional.
  std::function<void(int64_t done, int64_t total)> progress;
};
struct ChunkedImportResult : ImportResult {
  int64_t resumed_from = 0;     // rows an earlier, interrupted import had committed
  uint64_t verified_bytes = 0;  // bytes compared with the arrays after the copy
};
// import_arrays in row chunks of about chunk_bytes, one commit each, so that a killed import
// leaves the store at its last commit; then every raw key's stored rows are read back and
// compared byte for byte with the arrays' (CorruptionError naming the key when they differ).
// Arrays with a file (Array::file) are copied from it in the kernel into raw keys and compared
// as they land. A compressed key's blocks are each decompressed and compared with their rows as
// they are made; then its stored blocks are checked against the checksums taken of them
// (CorruptionError naming the key and block), none decompressed again.
// Resumes: without append, a store that holds exactly these keys, dtypes and trailing dims, with
// at most the arrays' rows and those rows equal to the arrays' first rows, is completed from
// there (a complete one is only verified), as is a store of batch size [0] without keys (one
// created by an import killed before its first commit). Without append, another existing store
// takes the arrays in one commit, as import_arrays, unless options.refuse_other.
TDSTORE_API ChunkedImportResult import_arrays_chunked(const std::filesystem::path& dir,
                                                      const std::map<std::string, Array>& arrays,
                                                      const ImportOptions& options = {});

}  // namespace tdstore
