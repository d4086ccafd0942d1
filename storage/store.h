// The on-disk engine: a store directory holding a key directory (keys.tdd), a tensor arena
// (arena.tda) and an LMDB catalog (catalog/). It knows bytes, dtype codes and shapes, not
// libtorch. Format: docs/FORMAT.md. Commit protocol: docs/DESIGN.md.
//
// Snapshot semantics: a Store handle reads the generation that was committed when it was
// opened or last refreshed (its storage::Snapshot), or, for the writer, that state plus its own
// staged changes (its storage::WriteTxn). Bytes returned by view() stay valid and unchanged while
// its pin lives (space freed by later commits is reused only when nothing can see it:
// docs/DESIGN.md, "Space reuse").
//
// Thread safety: const member functions may be called from several threads at once (catalog
// reads are serialized on one mutex, since an LMDB read transaction serves one thread at a
// time; the key index is built once under another; what view() exposes is told to the writer's
// allocator under its own; the Snapshot is only read). Writes, commit(), rollback() and
// refresh() need exclusive access; pins from view() may be released on any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "storage/catalog.h"
#include "storage/checksum.h"
#include "storage/directory.h"
#include "storage/dtype.h"
#include "storage/format.h"
#include "storage/free_space.h"
#include "storage/keys.h"
#include "storage/mutex.h"
#include "storage/reader_table.h"
#include "storage/snapshot.h"
#include "storage/write_txn.h"
#include "tdstore/env.h"
#include "tdstore/options.h"

namespace tdstore {
class File;
class FileLock;
}  // namespace tdstore

namespace tdstore::storage {

// One present key as the snapshot sees it.
struct Entry {
  uint64_t slot = 0;  // stable slot index: never changes while the key exists
  DType dtype = DType::UInt8;
  std::vector<int64_t> shape;
  uint64_t offset = 0;        // arena offset of the bytes
  uint64_t nbytes = 0;        // bytes stored at offset (compressed ones: blocks and index)
  uint64_t raw_nbytes = 0;    // the tensor's bytes: its shape times its dtype's size
  uint64_t capacity = 0;      // bytes reserved at offset (>= nbytes)
  uint8_t flags = 0;          // SlotFlags
  uint64_t content_hash = 0;  // xxh3 of the bytes
  uint64_t generation = 0;    // commit that wrote it; 0 while staged
  bool compressed() const { return flags & kSlotCompressed; }
};

// What lazy-property provenance records of a dependency (docs/FORMAT.md, "Lazy-property
// provenance"): xxh3 of its content checksum, dtype, shape and, for a ragged key, the content
// checksum of its offsets.
uint64_t spec_fingerprint(const Entry& e, std::optional<uint64_t> offsets_hash);

// The bytes put() and append() store: nbytes at data, or, when file is set, the same bytes as
// file holds at file_offset (a raw tensor's only). Those are copied file to file in the kernel
// (File::copy_from), then read back from the arena and compared with the file's, piece by
// piece, as they are hashed: CorruptionError naming the key when they differ. data may then be
// null.
struct Payload {
  const void* data = nullptr;
  uint64_t nbytes = 0;
  File* file = nullptr;
  uint64_t file_offset = 0;
};

class Store;
// spec_fingerprint of a present key (its offsets' checksum included for a ragged key); nullopt
// when absent. `checksum` receives its content checksum.
std::optional<uint64_t> key_fingerprint(const Store& store, std::string_view key,
                                        uint64_t* checksum = nullptr);

struct StoreInfo {
  uint32_t format_version;
  uint64_t generation;
  uint64_t commit_time_ns;
  uint64_t key_capacity;
  uint64_t slot_count;
  uint64_t slots_used;  // format 4: slots handed out, in creation order; 0 in format 3
  uint64_t live_keys;
  uint64_t live_bytes;
  uint64_t arena_end;        // bytes of the arena in use (committed)
  uint64_t arena_file_size;  // bytes on disk (apparent size)
  uint64_t arena_reserve;    // address range reserved by this handle
  uint64_t alignment;
  std::vector<int64_t> batch_size;
};

// Arena space (docs/DESIGN.md, "Space reuse").
struct SpaceInfo {
  uint64_t arena_end;        // bytes of the arena in use at this generation (high-water mark)
  uint64_t live_bytes;       // tensor bytes of the keys present
  uint64_t reusable_bytes;   // free, and no reader can see them: the next allocations use them
  uint64_t pending_bytes;    // freed, still visible to a reader at an older generation or a view
  uint64_t allocated_bytes;  // disk blocks of arena.tda (st_blocks x 512)
  uint32_t readers;          // read handles of other live processes registered in the reader table
};

// Longest catalog key (LMDB's limit): "attr/" plus an attribute name, "lazy/" plus a key, ...
inline constexpr size_t kMaxCatalogKeyBytes = 511;
// The catalog namespace of cache entries (compiled graphs).
inline constexpr std::string_view kCachePrefix = "graph/";
// The catalog namespace of store attributes.
inline constexpr std::string_view kAttrPrefix = "attr/";

class Store {
 public:
  // Creates dir (which must not exist, or be an empty directory) holding an empty store at
  // generation 0. Throws IOError, also when dir exists and is not an empty directory.
  static std::unique_ptr<Store> create(const std::filesystem::path& dir,
                                       std::vector<int64_t> batch_size,
                                       const StoreOptions& options);
  // Opens an existing store. ReadWrite takes the writer lock (LockError when held) and rolls
  // back anything a crashed writer left past the committed generation.
  // Throws FormatError (not a store, newer version), CorruptionError, IOError, LockError.
  static std::unique_ptr<Store> open(const std::filesystem::path& dir, OpenMode mode,
                                     const StoreOptions& options);
  ~Store();

  const std::filesystem::path& path() const { return dir_; }
  bool writable() const { return writable_; }
  uint64_t generation() const { return snap_->header.generation; }
  // The batch size the writer's next commit publishes: the one set_batch_size() staged, if any
  // (as find() reads staged keys, so a second append planned from it extends the first; an
  // append planned from the committed one would commit keys longer than the batch size), else
  // the committed one (a reader's, and info()'s). A copy: a staged one changes until commit.
  std::vector<int64_t> batch_size() const;
  StoreInfo info() const;

  // Reads (snapshot plus, for the writer, staged changes).
  std::optional<Entry> find(std::string_view key) const;
  // Calls fn for every present key, in slot order (creation order in format 4). O(slots used)
  // in format 4, O(slot_count) in format 3.
  void for_each(const std::function<void(std::string_view key, const Entry&)>& fn) const;
  // Every present key (ragged companions included), sorted: for_each()'s cost on the first call at
  // a generation, then kept up to date by put() and erase().
  const std::set<std::string, std::less<>>& key_index() const;
  // Present keys, ragged companions ("<key>\0offsets") left out: O(1) once the index exists.
  uint64_t key_count() const;
  // Whether a present key starts with prefix: O(log keys) once the index exists.
  bool has_prefix(std::string_view prefix) const;
  // An entry's bytes inside the mapping and the pin that keeps them valid and unchanged while
  // it lives (tensor views keep it; it may be released on any thread): the writer never reuses
  // an extent pinned in its process, and no writer reuses what a registered reader's pins see.
  // On a reader the pin holds the handle's generation in the reader table; on the writer, the
  // extent. Runs the handle's pending small writes first. May run concurrently with other const
  // calls (the writer's allocator serializes what it is told), not with writes. CapacityError when
  // the extent lies past this handle's arena reservation.
  struct View {
    const void* data = nullptr;
    std::shared_ptr<const void> pin;
  };
  View view(const Entry& e) const;
  std::shared_ptr<Mapping> mapping() const { return snap_->mapping; }
  // Rows [first, first + count) of key's tensor (entry e: count times its row's bytes) into
  // dst: copied from the mapping, or decompressed from only the blocks holding them (a
  // compressed key). A 0-d tensor is one row. CorruptionError naming the key and the block
  // for a damaged compressed block; IndexError past the rows. May run concurrently with other
  // const calls, as view().
  void read_rows(std::string_view key, const Entry& e, uint64_t first, uint64_t count,
                 void* dst) const;
  // Before allocating what e's shape asks for: a compressed key's block index read and checked
  // (CorruptionError naming the key), which bounds its raw bytes by what its stored bytes can
  // hold (FORMAT.md, "Compressed keys"). Nothing to do for a raw key, whose extent lies in the
  // arena. O(blocks).
  void check_stored(std::string_view key, const Entry& e) const;
  // Where n bytes at p, inside this handle's current mapping, lie in the arena file: the open
  // file (kept open by the pointer) and the offset. nullopt for bytes outside the mapping (an
  // older mapping's, or not the arena's). The file's bytes are the mapping's except where this
  // process wrote a view in place (Env::has_private_pages).
  struct FileBytes {
    std::shared_ptr<File> file;
    uint64_t offset = 0;
  };
  std::optional<FileBytes> arena_bytes(const void* p, size_t n) const;
  // Free, reusable and allocated arena bytes. O(1) on the writer; O(slot_count) plus the
  // history older readers need on a reader.
  SpaceInfo space() const;

  // Writes (REQUIRES: writable()). Staged until commit(); never touch bytes a reader or a
  // view() may see: new bytes go into free space (once no registered reader can see it) or
  // past the tail.
  // put copies nbytes from `src` into fresh arena extents and checksums them. Tensors of at
  // most WriteTxn::kCombineMaxBytes without spare capacity are written together with their
  // neighbours (at the latest by commit()): an IOError writing them surfaces at a later put(),
  // view(), append(), check(), verify() or commit() and breaks the handle; other put()s fail by
  // themselves and leave the handle usable. `capacity` reserves room for appended rows (at least
  // nbytes; a sparse hole until used). flags: SlotFlags; kSlotRagged exempts the tensor from the
  // batch-size rule and allows the reserved companion keys "<key>\0offsets". Returns the flags of
  // the version it replaced, nullopt when the key was absent.
  // With kSlotCompressed in flags, src holds a compressed key's stored bytes (blocks and index,
  // storage/compressed.h), checked against the shape (CorruptionError when they do not match it),
  // and nbytes counts them; FormatError on a format-3 store, which has no compressed keys.
  std::optional<uint8_t> put(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                             const void* src, uint64_t nbytes, uint64_t capacity = 0,
                             uint8_t flags = 0) {
    return put(key, dtype, shape, Payload{src, nbytes}, capacity, flags);
  }
  std::optional<uint8_t> put(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                             const Payload& src, uint64_t capacity = 0, uint8_t flags = 0);
  // put() of the raw tensor at src (nbytes = its shape's bytes) compressed under c
  // (ArgumentError unless check_compression passes): rows in blocks, stored with
  // kSlotCompressed, each block checked to decompress to its rows as it is made
  // (compress_rows). capacity, in raw bytes, reserves room for appended rows at the ratio this
  // tensor compressed to.
  std::optional<uint8_t> put_compressed(std::string_view key, DType dtype,
                                        const std::vector<int64_t>& shape, const void* src,
                                        uint64_t nbytes, const Compression& c,
                                        uint64_t capacity = 0, uint8_t flags = 0) {
    return put_compressed(key, dtype, shape, Payload{src, nbytes}, c, capacity, flags);
  }
  // From a file, its rows are read with File::read_at by the threads compressing them, never
  // through a mapping, each block twice and compared: an IOError naming the file when it is cut
  // short meanwhile, a CorruptionError naming key and file when the two reads differ.
  std::optional<uint8_t> put_compressed(std::string_view key, DType dtype,
                                        const std::vector<int64_t>& shape, const Payload& src,
                                        const Compression& c, uint64_t capacity = 0,
                                        uint8_t flags = 0);
  // Appends nbytes (whole rows of dim 0) to key, whose shape becomes new_shape (a compressed key:
  // its short last block written again with the new rows, new blocks, a new index, all after
  // its stored bytes, under the key's own level and block size). Writes into the
  // extent's unused capacity when it fits; otherwise moves the tensor to an extent of
  // max(needed, 4 x capacity, min_capacity) bytes (unused capacity is a sparse hole). The content
  // checksum is extended, not recomputed (the first append of a key in a session hashes its stored
  // bytes once). KeyError when absent; ShapeError unless new_shape differs from the stored shape in
  // dim 0 only, by exactly nbytes worth of rows.
  void append(std::string_view key, const std::vector<int64_t>& new_shape, const void* src,
              uint64_t nbytes, uint64_t min_capacity = 0) {
    append(key, new_shape, Payload{src, nbytes}, min_capacity);
  }
  // A compressed key's rows from a file are read as put_compressed reads them.
  void append(std::string_view key, const std::vector<int64_t>& new_shape, const Payload& src,
              uint64_t min_capacity = 0);
  // Returns false when the key is absent.
  bool erase(std::string_view key);
  void set_batch_size(std::vector<int64_t> batch_size);
  // Catalog entries (full catalog keys such as "attr/source", "lazy/norm"; FORMAT.md lists
  // the namespaces): staged like tensors, committed atomically with them. nullopt deletes.
  // KeyError, staging nothing, for a key of more than kMaxCatalogKeyBytes.
  void put_meta(std::string_view key, std::optional<std::string> value);
  std::optional<std::string> get_meta(std::string_view key) const;
  // Every present entry whose key starts with prefix, sorted by key.
  std::vector<std::pair<std::string, std::string>> scan_meta(std::string_view prefix) const;
  // Cache entries (kCachePrefix, "graph/..."): written at once in their own catalog transaction, as
  // generation-0 versions visible to every snapshot, outside the commit protocol. Allowed on
  // read-only handles when the catalog's files are writable (IOError otherwise).
  void put_cache(std::string_view key, std::optional<std::string> value);
  // Removes the cache entries named, in one catalog transaction (absent ones are no error).
  void erase_cache(const std::vector<std::string>& keys);
  // Bytes of the catalog's pages in use (records of every namespace). O(1).
  uint64_t catalog_bytes() const;
  // Cache entries under prefix as the catalog holds them now (not this handle's snapshot).
  // Records that cannot be decoded are skipped; their keys go to `damaged` when given.
  std::vector<std::pair<std::string, std::string>> scan_cache(
      std::string_view prefix, std::vector<std::string>* damaged = nullptr) const;
  // As scan_cache, without copies: fn sees each entry's bytes inside one read transaction (no
  // call on this store from fn).
  void visit_cache(std::string_view prefix,
                   const std::function<void(std::string_view, std::string_view)>& fn,
                   std::vector<std::string>* damaged = nullptr) const;
  // Whether put_cache can write (the catalog's files are writable by this process).
  bool cache_writable() const;
  // Store attributes: the kAttrPrefix namespace.
  void put_attr(std::string_view name, std::optional<std::string> value) {
    put_meta(std::string(kAttrPrefix) + std::string(name), std::move(value));
  }
  std::optional<std::string> get_attr(std::string_view name) const {
    return get_meta(std::string(kAttrPrefix) + std::string(name));
  }
  std::vector<std::string> attr_names() const;
  bool has_staged_changes() const;

  // Makes the next commit generation g instead of generation() + 1, so that a store rebuilt
  // from another (compaction) continues its generations. REQUIRES: generation() == 0, g > 0.
  void continue_generations_from(uint64_t g);

  // Makes every staged change durable and visible at once (docs/DESIGN.md). On IOError the
  // handle is broken: later writes throw, the committed state on disk is the previous one.
  void commit();
  // Drops staged changes.
  void rollback();
  // A group of writes that applies whole or not at all (rows appended to every key, a ragged
  // key and its offsets, a dense value replacing a ragged key): what put(), append(), erase(),
  // set_batch_size() and put_meta() stage after begin_group() is dropped by abort_group(),
  // leaving the staged state exactly as it was at begin_group(); the bytes the group wrote
  // become free space after the next commit. end_group() keeps the group's writes. Groups nest:
  // an inner group joins the outermost one. REQUIRES: writable(). WriteGroup does it by scope.
  void begin_group();
  void end_group();
  void abort_group();
  // Moves a reader to the newest committed generation, also across a compaction that
  // replaced the directory (the handle then reads the new store; views of the old one stay
  // valid). Returns true when it changed.
  bool refresh();

  // What check() found: the keys whose stored bytes fail their checksum (or lie outside the
  // arena), and, when every key was checked, verify_structure()'s problems.
  struct Verification {
    uint64_t checked = 0;  // keys hashed
    uint64_t bytes = 0;    // their bytes
    std::vector<std::string> corrupt;
    std::vector<std::string> structure;
  };
  // The one integrity check of the engine (StoreReader::verify, TensorDict::verify and the CLI
  // all run it). Re-hashes the stored bytes of `keys` (every present key, companions included, when
  // empty; then it also runs verify_structure()): the file's bytes through a shared read-only
  // mapping, not this process's view of them, which in-place writes may have changed.
  // progress(done, total) is called as bytes are hashed, at least every 64 MiB. KeyError for a key
  // not present. Runs the handle's pending small writes first.
  Verification check(const std::vector<std::string>& keys = {},
                     const std::function<void(uint64_t, uint64_t)>& progress = {}) const;
  // check(keys)'s corrupt keys, then its structure problems: empty when all is well.
  std::vector<std::string> verify(const std::vector<std::string>& keys = {}) const;
  // The damage to the store's structure, O(slot_count + catalog records), each named with a
  // leading '/' (never a stored key): "/directory/header copy <k> ..." for a damaged header
  // copy (a writer refuses to open the store); "/directory: <what differs>" when the committed
  // slots do not match what the header says of them (live keys, live bytes, digest: a slot lost or
  // altered); "/directory/slot <n>" for a slot whose committed version fails its checksum
  // (reads use its intact arena copy; a writer's open rewrites it); "/catalog/<record key>"
  // for a catalog record that cannot be decoded; "/catalog: ..." when the data records do not
  // match the header's catalog digest (lost, altered or rolled back).
  std::vector<std::string> verify_structure() const;

 private:
  Store() = default;
  void open_files(OpenMode mode);
  void open_files_once(OpenMode mode);
  bool swapped() const;  // dir_/keys.tdd is no longer the file this handle opened
  bool load_header();
  // The version of `slot` visible to this handle (staged first, when with_staged, then
  // Snapshot::resolve). Sets *damaged when that version had to be restored from its arena copy.
  std::optional<SlotRecord> resolve(uint64_t slot, bool with_staged = true,
                                    bool* damaged = nullptr) const;
  Entry entry_of(uint64_t slot, const SlotRecord& r) const;
  // Looks key up by linear probing from its hash (over the slots in format 3, over the key
  // index in format 4). When absent and insert_slot is given, *insert_slot is where the key
  // would go: a tombstone of another key on its path, the slot that ended the probe, or, in
  // format 4, UINT64_MAX with *insert_position the empty index position for a new slot;
  // *insert_slot is UINT64_MAX and *insert_position too when the directory is full.
  std::optional<std::pair<uint64_t, SlotRecord>> probe(std::string_view key, uint64_t hash,
                                                       uint64_t* insert_slot,
                                                       uint64_t* insert_position = nullptr) const;
  // Format 4: the slot key index position `position` names (staged entries first, for the
  // writer), nullopt when empty; CorruptionError when it names a slot past slot_count.
  std::optional<uint64_t> index_slot(uint64_t position) const;
  // Slots for_each() and the digests visit: [0, slot_count), or in format 4 the slots used at
  // this generation plus the writer's staged new ones.
  uint64_t slot_limit() const;
  // Format 4: the index checks of check_directory() ("" when they hold).
  std::string check_index(const std::vector<std::optional<uint64_t>>& key_hash_of_slot) const;
  // txn_->stage(), told where slot's committed bytes lie.
  void stage(uint64_t slot, const SlotRecord& r, int64_t keys, int64_t bytes,
             bool keep_hash = false);
  // The arena's free and pending space at this generation for a writer whose oldest reader
  // reads `oldest`, derived from the directory (FORMAT.md, "Space reuse"). O(slot_count) plus
  // the history versions readers at `oldest` still need.
  FreeSpace scan_space(uint64_t oldest) const;
  void remap();                   // a fresh arena mapping (see refresh())
  uint64_t mapping_size() const;  // the address range the arena mapping reserves
  void recover();
  // The commit's phases (store_commit.cpp), in order; each is durable before the next begins.
  struct CommitVersions {
    std::vector<SlotRecord> records;                // the new version of each staged slot
    std::vector<std::pair<uint64_t, int>> targets;  // its slot, and the inline version it replaces
    uint64_t digest = 0;                            // the directory digest of the new generation
    uint64_t fresh_from = 0;                        // format 4: first slot new in this commit
  };
  CommitVersions write_slot_versions(uint64_t g);
  void write_inline_versions(const CommitVersions& v);
  void write_header(uint64_t g, uint64_t dir_digest, uint64_t catalog_digest);
  void finish_commit(uint64_t g);
  // What differs between the committed directory and its header ("" when nothing); slots whose
  // visible version had to be restored from the arena go to damaged_slots. O(slot_count).
  std::string check_directory(std::vector<uint64_t>* damaged_slots = nullptr) const;
  uint64_t directory_digest() const;        // over the committed versions; O(slot_count)
  uint64_t catalog_content_digest() const;  // over the data records at this generation; O(records)
  void require_writable(std::string_view what) const;
  // Writes out the writer's small-write buffer (WriteTxn): before commit's arena sync, before
  // anything reads the arena through the mapping (view(), verify, append) and before any other
  // arena write. Const calls may run it concurrently (the buffer has its own lock).
  void flush_pending() const {
    if (txn_) txn_->flush();
  }
  // Writes src at the arena's offset (put, append) and adds its bytes to hash.
  void land(uint64_t offset, const Payload& src, std::string_view key, Xxh3Stream& hash);
  // What every put checks before it writes (key, dtype, dims, the batch-size rule, a byte count
  // within 64 bits; a compressed key's format and rows); *shape_nbytes receives the shape's
  // bytes.
  void check_put(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                 uint8_t flags, uint64_t* shape_nbytes) const;
  // Stages key's new version of nbytes in a fresh extent of `capacity` (>= nbytes) bytes, which
  // write(offset) fills and returns the content checksum of (the extent is given back when it
  // throws). Returns the replaced version's flags, as put() does.
  std::optional<uint8_t> place(std::string_view key, DType dtype, const std::vector<int64_t>& shape,
                               uint64_t nbytes, uint64_t capacity, uint8_t flags,
                               const std::function<uint64_t(uint64_t)>& write);
  void check_catalog_key(std::string_view key) const;  // KeyError unless 1..kMaxCatalogKeyBytes
  [[noreturn]] void corrupt(const std::string& what) const;

  std::filesystem::path dir_;
  std::shared_ptr<Env> env_;
  bool writable_ = false;
  std::unique_ptr<FileLock> lock_;
  std::unique_ptr<File> dir_file_;
  std::shared_ptr<File> arena_file_;  // shared: arena_bytes() hands it out
  // The generation this handle reads (the writer: its last commit). Replaced, never changed, by
  // the calls that need exclusive access (open, refresh, commit); const calls only read it.
  std::shared_ptr<const Snapshot> snap_;
  void publish(Snapshot next) { snap_ = std::make_shared<const Snapshot>(std::move(next)); }
  const Catalog::Snapshot& catalog_snapshot() const REQUIRES(catalog_mu_);
  // catalog_snapshot() for reads of this handle's generation: Error when it no longer holds it.
  const Catalog::Snapshot& versioned_snapshot() const REQUIRES(catalog_mu_);
  mutable std::shared_ptr<Catalog> catalog_;
  // readers: pinned with the header; the writer's: renewed per read.
  mutable std::unique_ptr<Catalog::Snapshot> catalog_snapshot_ GUARDED_BY(catalog_mu_);
  mutable std::unique_ptr<Catalog::Snapshot> writer_snapshot_ GUARDED_BY(catalog_mu_);
  // A forked child's fresh snapshot no longer holds this handle's generation (catalog_snapshot).
  mutable bool catalog_lost_ = false;
  int pid_ = 0;  // process that opened the handle (a writer writes only there)
  mutable int catalog_pid_ GUARDED_BY(catalog_mu_) =
      0;  // process whose catalog environment catalog_ is
  uint64_t arena_size() const { return arena_file_->size(); }  // bytes of the arena file
  uint64_t arena_reserve_ = 0;
  int64_t lock_timeout_ms_ = 0;
  bool shared_readonly_ = false;

  // The writer's transaction (staged changes, allocator, small writes); null on a reader.
  std::unique_ptr<WriteTxn> txn_;
  // A compressed key was staged since the last commit: the next one marks the store version
  // kCompressedFormatVersion (also when the write was rolled back within a group).
  bool compressed_staged_ = false;
  mutable std::optional<std::set<std::string, std::less<>>> key_index_
      GUARDED_BY(index_mu_);                               // see key_index()
  mutable uint64_t companions_ GUARDED_BY(index_mu_) = 0;  // ragged companion keys in key_index_
  void reset_key_index() EXCLUDES(index_mu_);              // rebuilt on next use
  mutable Mutex index_mu_;                                 // guards building key_index_
  mutable Mutex catalog_mu_;  // guards the catalog snapshots and reads through them

  // Space reuse. Readers: their registration and the pin of the generation they read.
  std::shared_ptr<ReaderTable> readers_;
  std::shared_ptr<ReaderPins> pins_;
  std::shared_ptr<const void> current_pin_;
  // Writer: whether freed space is reused, and the extents views in this process hold.
  bool reuse_ = true;
  std::shared_ptr<ExtentPins> extent_pins_;
};

// Begins a write group on construction; aborts it on destruction unless done() ran.
class WriteGroup {
 public:
  explicit WriteGroup(Store& s) : s_(s) { s_.begin_group(); }
  ~WriteGroup() {
    if (!done_) s_.abort_group();
  }
  WriteGroup(const WriteGroup&) = delete;
  WriteGroup& operator=(const WriteGroup&) = delete;
  void done() {
    s_.end_group();
    done_ = true;
  }

 private:
  Store& s_;
  bool done_ = false;
};

}  // namespace tdstore::storage
