// Store: lookup by open addressing over two-version slots, and the commit protocol of
// docs/DESIGN.md. Invariants:
//  - Committed bytes a reader may see (arena extents and copies of versions visible at the
//    committed generation or at any registered reader's, the inline slot version visible at
//    the committed generation, the header copy holding it) are never written; other arena
//    bytes below arena_end are free space (storage/space.cpp).
//  - A commit writes only into pages that hold no live bytes of an earlier commit (the tail
//    starts on a fresh page, free space is handed out in whole pages), and a reader maps the
//    arena afresh when it moves, so a page it copied-on-write never hides newer bytes.
//  - Within a commit, an extent never shares a page with an extent already handed out
//    through data() (exposed_end_), for the same reason in the writer's own process.
#include "storage/store.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "storage/catalog.h"
#include "storage/checksum.h"
#include "storage/compact.h"
#include "storage/directory.h"
#include "storage/durable_dirs.h"
#include "storage/graph_record.h"
#include "storage/messages.h"
#include "storage/process.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace fs = std::filesystem;

struct Store::Staged {
  std::unordered_map<uint64_t, SlotRecord> records;  // slot -> new version
  std::unordered_map<uint64_t, uint64_t>
      index;  // format 4: key index position -> the new slot it names
  std::map<std::string, std::optional<std::string>> meta;  // catalog key -> value (nullopt: delete)
  std::optional<std::vector<int64_t>> batch_size;
  int64_t keys_delta = 0;
  int64_t bytes_delta = 0;
  bool empty() const { return records.empty() && meta.empty() && !batch_size; }
};

namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

void validate_batch(const fs::path& dir, const std::vector<int64_t>& b) {
  if (b.size() > kMaxBatchDims)
    throw ShapeError(dir.string() + ": batch size has " + std::to_string(b.size()) +
                     " dims; at most " + std::to_string(kMaxBatchDims) + " are supported");
  for (int64_t d : b)
    if (d < 0) throw ShapeError(dir.string() + ": negative batch dimension " + std::to_string(d));
}

}  // namespace

uint64_t spec_fingerprint(const Entry& e, std::optional<uint64_t> offsets_hash) {
  // content_hash u64 | dtype u8 | ndim u8 | ragged u8 | shape int64 x ndim | offsets hash u64
  std::string b(reinterpret_cast<const char*>(&e.content_hash), 8);
  b.push_back(static_cast<char>(e.dtype));
  b.push_back(static_cast<char>(e.shape.size()));
  b.push_back(offsets_hash ? 1 : 0);
  b.append(reinterpret_cast<const char*>(e.shape.data()), e.shape.size() * 8);
  if (offsets_hash) b.append(reinterpret_cast<const char*>(&*offsets_hash), 8);
  return xxh3(b);
}

std::optional<uint64_t> key_fingerprint(const Store& store, std::string_view key,
                                        uint64_t* checksum) {
  auto e = store.find(key);
  if (!e) return std::nullopt;
  if (checksum) *checksum = e->content_hash;
  std::optional<uint64_t> offsets;
  if (e->flags & kSlotRagged)
    if (auto o = store.find(ragged_offsets_key(key))) offsets = o->content_hash;
  return spec_fingerprint(*e, offsets);
}

// ---------------------------------------------------------------------------- create / open

std::unique_ptr<Store> Store::create(const fs::path& dir, std::vector<int64_t> batch_size,
                                     const StoreOptions& options) {
  auto env = options.env ? options.env : Env::posix();
  validate_batch(dir, batch_size);
  if (options.key_capacity <= 0 || options.key_capacity > (int64_t{1} << 32))
    throw Error(dir.string() + ": key_capacity must be in [1, 2^32], got " +
                std::to_string(options.key_capacity));
  if (options.format_version != kHashedFormatVersion &&
      options.format_version != kIndexedFormatVersion)
    throw Error(dir.string() + ": format_version must be " + std::to_string(kHashedFormatVersion) +
                " or " + std::to_string(kIndexedFormatVersion) + ", got " +
                std::to_string(options.format_version));
  if (options.alignment < 64 || options.alignment > (1 << 20) ||
      !std::has_single_bit(static_cast<uint64_t>(options.alignment)))
    throw Error(dir.string() + ": alignment must be a power of two in [64, 1 MiB], got " +
                std::to_string(options.alignment));
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec)))
    throw Error(dir.string() +
                ": cannot create a store here: the path exists and is not an "
                "empty directory");

  // Build in a sibling directory and rename it into place: a crash leaves no half store.
  fs::path tmp = dir;
  tmp += ".creating." + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  create_directories_durably(*env, tmp.parent_path());  // the store's parent, when missing
  if (!fs::create_directory(tmp, ec))
    throw IOError(tmp.string() + ": cannot create directory: " + ec.message());
  try {
    uint64_t slots = slot_count_for(static_cast<uint64_t>(options.key_capacity));
    DirHeader h{};
    std::memcpy(h.magic, kDirMagic, 8);
    h.format_version = static_cast<uint32_t>(options.format_version);
    h.header_size = sizeof(DirHeader);
    h.generation = 0;
    h.key_capacity = static_cast<uint64_t>(options.key_capacity);
    h.slot_count = slots;
    h.slot_record_size = sizeof(SlotRecord);
    h.alignment = static_cast<uint32_t>(options.alignment);
    h.arena_end = kArenaDataOffset;
    h.commit_time_ns = now_ns();
    h.batch_ndim = static_cast<uint32_t>(batch_size.size());
    std::copy(batch_size.begin(), batch_size.end(), h.batch_size);
    h.dir_digest = 0;   // no slot is written
    h.catalog_txn = 0;  // the catalog is created below, empty
    h.catalog_digest = 0;
    seal(h);
    auto df = env->open(tmp / kDirectoryFile, Env::Access::Create);
    // Sparse, except where reading a hole through the mapping allocates (tmpfs): there a full
    // file system would fault (SIGBUS) at open instead of failing here.
    if (env->holes_allocate_on_read(tmp))
      df->allocate(slot_layout(h.format_version, slots).end());
    else
      df->truncate(slot_layout(h.format_version, slots).end());
    df->write_at(kHeaderCopyOffset[0], &h, sizeof h);
    df->write_at(kHeaderCopyOffset[1], &h, sizeof h);
    df->sync();

    ArenaHeader a{};
    std::memcpy(a.magic, kArenaMagic, 8);
    a.format_version = h.format_version;
    a.alignment = static_cast<uint32_t>(options.alignment);
    a.checksum = xxh3(&a, offsetof(ArenaHeader, checksum));
    auto af = env->open(tmp / kArenaFile, Env::Access::Create);
    af->write_at(0, &a, sizeof a);
    af->truncate(kArenaDataOffset);
    af->sync();
    { auto cat = Catalog::open(tmp / kCatalogDir, true, true); }
    env->sync_dir(tmp / kCatalogDir);  // data.mdb and lock.mdb: durable names
    env->sync_dir(tmp);
    env->rename(tmp, dir);
    env->sync_dir(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return open(dir, OpenMode::ReadWrite, options);
}

std::unique_ptr<Store> Store::open(const fs::path& dir, OpenMode mode,
                                   const StoreOptions& options) {
  raise_open_file_limit();
  std::unique_ptr<Store> s(new Store);
  s->dir_ = dir;
  s->env_ = options.env ? options.env : Env::posix();
  s->arena_reserve_ = static_cast<uint64_t>(options.arena_reserve);
  s->lock_timeout_ms_ = options.lock_timeout_ms;
  s->shared_readonly_ = options.shared_readonly;
  s->reuse_ = options.reuse_space;
  if (options.shared_readonly && mode != OpenMode::ReadOnly)
    throw Error(dir.string() + ": shared_readonly applies to ReadOnly opens only");
  s->open_files(mode);
  return s;
}

// Opens the store's files by path, one after the other. A compaction can swap the directory
// in between (rename(RENAME_EXCHANGE)); the directory's identity is compared before and after,
// and the whole open is retried when it changed, so that the lock, the key directory, the
// arena and the catalog always belong to one store.
void Store::open_files(OpenMode mode) {
  for (int attempt = 0;; ++attempt) {
    const std::optional<FileIdentity> before = env_->identity(dir_);
    auto same = [&] {
      if (!before) return true;
      const std::optional<FileIdentity> after = env_->identity(dir_);
      return !after || *after == *before;
    };
    try {
      open_files_once(mode);
      if (same()) return;
    } catch (const Error&) {
      // A file of the swapped-out directory vanished under us (it is being deleted): that is
      // the swap, not an error of this store.
      if (same() || attempt == 8) throw;
    }
    if (attempt == 8)
      throw IOError(dir_.string() + ": the store directory kept changing while it was opened");
    dir_region_.reset();
    dir_map_ = nullptr;
    {
      MutexLock lock(&catalog_mu_);
      catalog_snapshot_.reset();
    }
    catalog_.reset();
    lock_.reset();
    current_pin_.reset();
    pins_.reset();
    readers_.reset();
    header_ = DirHeader{};
  }
}

void Store::open_files_once(OpenMode mode) {
  std::error_code ec;
  // A directory or file that cannot be looked up (permissions) is said so, not taken for absent.
  const auto absent = [&ec] { return !ec || ec == std::errc::no_such_file_or_directory; };
  if (!fs::is_directory(dir_, ec))
    throw IOError(dir_.string() + (absent()
                                       ? std::string(": no such store directory")
                                       : ": cannot access the store directory: " + ec.message()));
  if (!fs::exists(dir_ / kDirectoryFile, ec)) {
    if (!absent())
      throw IOError(dir_.string() + ": cannot access " + kDirectoryFile + ": " + ec.message());
    throw FormatError(dir_.string() + ": not a tdstore store (no " + kDirectoryFile + ")");
  }
  writable_ = mode == OpenMode::ReadWrite;
  pid_ = process_id();
  if (writable_) {
    std::string holder;
    lock_ = env_->try_lock(dir_ / kLockFile, &holder);
    for (auto waited = std::chrono::milliseconds(0);
         !lock_ && waited < std::chrono::milliseconds(lock_timeout_ms_);
         waited += std::chrono::milliseconds(5)) {
      env_->sleep_for(std::chrono::milliseconds(5));
      lock_ = env_->try_lock(dir_ / kLockFile, &holder);
    }
    if (!lock_)
      throw LockError(dir_.string() + ": another writer holds the store (" +
                      (holder.empty() ? std::string("unknown holder") : holder) +
                      "); open it ReadOnly or wait for that writer to close");
    remove_dead_siblings(dir_);  // under the lock: no compaction of this store is running
  }
  auto access = writable_ ? Env::Access::ReadWrite : Env::Access::ReadOnly;
  dir_file_ = env_->open(dir_ / kDirectoryFile, access);
  uint64_t dsize = dir_file_->size();
  if (dsize < kSlotsOffset)
    throw CorruptionError((dir_ / kDirectoryFile).string() +
                          ": truncated: " + std::to_string(dsize) +
                          " bytes, a key directory has at least " + std::to_string(kSlotsOffset));
  dir_region_ = env_->map(*dir_file_, dsize, Env::MapMode::SharedRead);
  dir_map_ = dir_region_->data();
  dir_map_size_ = dsize;

  arena_file_ = env_->open(dir_ / kArenaFile, access);
  ArenaHeader a{};
  arena_file_->read_at(0, &a, sizeof a);
  if (std::memcmp(a.magic, kArenaMagic, 8) != 0 ||
      a.checksum != xxh3(&a, offsetof(ArenaHeader, checksum)))
    throw CorruptionError((dir_ / kArenaFile).string() + ": bad arena header");
  if (!fs::is_directory(dir_ / kCatalogDir, ec))
    throw CorruptionError((dir_ / kCatalogDir).string() + ": the store's catalog is missing");
  catalog_ = Catalog::open(dir_ / kCatalogDir, writable_, false, shared_readonly_);
  {
    MutexLock lock(&catalog_mu_);
    catalog_pid_ = process_id();
  }
  if (!shared_readonly_) {
    // A reader registers before it reads the header (FORMAT.md, "Reader table").
    readers_ = ReaderTable::open(dir_, !writable_);
    if (!writable_ && readers_)
      pins_ = readers_->pins();  // this process's slot, shared by its handles
  }
  load_header();
  if (header_.arena_end > arena_reserve_)
    throw CapacityError(dir_.string() + ": arena holds " + std::to_string(header_.arena_end) +
                        " bytes, more than arena_reserve " + std::to_string(arena_reserve_) +
                        "; open with a larger StoreOptions::arena_reserve");
  mapping_ = std::make_shared<Mapping>(*env_, *arena_file_, mapping_size());
  if (pins_) current_pin_ = pins_->pin(header_.generation, mapping_);
  if (header_.format_version >= 2 && catalog_->last_txnid() < header_.catalog_txn)
    throw CorruptionError(
        (dir_ / kCatalogDir).string() + ": the catalog is at transaction " +
        std::to_string(catalog_->last_txnid()) + ", generation " +
        std::to_string(header_.generation) + " committed it at transaction " +
        std::to_string(header_.catalog_txn) +
        " (deleted, truncated or replaced: attributes and provenance would be lost)");
  if (writable_) {
    recover();
    extent_pins_ = std::make_shared<ExtentPins>();
    if (reuse_)
      free_ = std::make_unique<FreeSpace>(scan_space(readers_->oldest(header_.generation)));
  }
}

std::unique_ptr<Store> Store::open_memory(std::string_view directory, std::string_view arena) {
  std::unique_ptr<Store> s(new Store);
  s->dir_ = "<memory>";
  s->in_memory_ = true;
  if (directory.size() < kSlotsOffset)
    throw CorruptionError("<memory>/keys.tdd: truncated: " + std::to_string(directory.size()) +
                          " bytes");
  s->dir_map_ = reinterpret_cast<const uint8_t*>(directory.data());
  s->dir_map_size_ = directory.size();
  ArenaHeader a{};
  if (arena.size() < sizeof a) throw CorruptionError("<memory>/arena.tda: truncated");
  std::memcpy(&a, arena.data(), sizeof a);
  if (std::memcmp(a.magic, kArenaMagic, 8) != 0 ||
      a.checksum != xxh3(&a, offsetof(ArenaHeader, checksum)))
    throw CorruptionError("<memory>/arena.tda: bad arena header");
  s->memory_arena_size_ = arena.size();
  s->mapping_ =
      std::make_shared<Mapping>(reinterpret_cast<const uint8_t*>(arena.data()), arena.size());
  s->arena_reserve_ = arena.size();
  s->load_header();
  return s;
}

uint64_t Store::arena_size() const { return in_memory_ ? memory_arena_size_ : arena_file_->size(); }

Store::~Store() = default;

// Reads both header copies and adopts the valid one with the highest generation, with a
// catalog snapshot taken between two reads of the same generation (so the catalog holds
// every version the generation needs).
bool Store::load_header() {
  const uint64_t before = header_.generation;
  // keys.tdd never shrinks: a shorter file (damage) would turn reads of the mapping into SIGBUS.
  if (dir_file_ && dir_file_->size() < dir_map_size_)
    throw CorruptionError((dir_ / kDirectoryFile).string() +
                          ": truncated under an open handle: " + std::to_string(dir_file_->size()) +
                          " bytes, " + std::to_string(dir_map_size_) + " when opened");
  for (;;) {
    DirHeader copies[2];
    std::memcpy(&copies[0], dir_map_ + kHeaderCopyOffset[0], sizeof(DirHeader));
    std::memcpy(&copies[1], dir_map_ + kHeaderCopyOffset[1], sizeof(DirHeader));
    const DirHeader* best = nullptr;
    bool magic = false;
    damaged_header_ = -1;
    for (int c = 0; c < 2; ++c)
      if (!header_valid(copies[c])) damaged_header_ = c;
    for (const auto& h : copies) {
      if (std::memcmp(h.magic, kDirMagic, 8) != 0) continue;
      magic = true;
      if (h.format_version > kFormatVersion && header_valid(h))
        throw FormatError((dir_ / kDirectoryFile).string() + ": format version " +
                          std::to_string(h.format_version) + " is newer than this build reads (" +
                          std::to_string(kFormatVersion) + ")");
      if (header_valid(h) && (!best || h.generation > best->generation)) best = &h;
    }
    if (!magic)
      throw FormatError((dir_ / kDirectoryFile).string() +
                        ": not a tdstore key directory (bad magic)");
    if (!best)
      throw CorruptionError((dir_ / kDirectoryFile).string() +
                            ": both header copies fail their checksum");
    const DirHeader& h = *best;
    auto file = (dir_ / kDirectoryFile).string();
    if (h.format_version < kOldestFormatVersion || h.header_size != sizeof(DirHeader) ||
        h.slot_record_size != sizeof(SlotRecord) || !std::has_single_bit(h.slot_count) ||
        h.slot_count < h.key_capacity || h.slot_count > kMaxSlotCount ||
        h.batch_ndim > kMaxBatchDims || h.alignment < 64 || !std::has_single_bit(h.alignment) ||
        h.arena_end < kArenaDataOffset)
      throw CorruptionError(file + ": header fields out of range");
    for (uint32_t d = 0; d < h.batch_ndim; ++d)
      if (h.batch_size[d] < 0)
        throw CorruptionError(file + ": header batch size has negative dimension " +
                              std::to_string(h.batch_size[d]));
    if (h.format_version >= kIndexedFormatVersion && h.slots_used > h.slot_count)
      throw CorruptionError(file + ": header counts " + std::to_string(h.slots_used) +
                            " slots used of " + std::to_string(h.slot_count));
    // slot_count is a power of two of at most 2^40; the file must hold the key index (format
    // 4) and all the slots (no overflow: checked as a division).
    const uint64_t slots_at = slot_layout(h.format_version, h.slot_count).base;
    if (dir_map_size_ < slots_at ||
        (dir_map_size_ - slots_at) / (2 * sizeof(SlotRecord)) < h.slot_count)
      throw CorruptionError(file + ": truncated: " + std::to_string(dir_map_size_) + " bytes for " +
                            std::to_string(h.slot_count) + " slots");
    uint64_t asize = arena_size();
    if (asize < h.arena_end)
      throw CorruptionError((dir_ / kArenaFile).string() + ": truncated: " + std::to_string(asize) +
                            " bytes, generation " + std::to_string(h.generation) + " uses " +
                            std::to_string(h.arena_end));
    if (writable_) {
      // A header copy is one write inside one sector, synced: it is never torn, so an invalid
      // copy is damage, and it may have held the newest commit. A writer would overwrite it and
      // make a rollback permanent.
      if (damaged_header_ >= 0)
        throw CorruptionError(file + ": header copy " + std::to_string(damaged_header_) +
                              " is damaged; it may have held the newest commit (generation " +
                              std::to_string(h.generation + 1) +
                              "), so the store is not opened for writing");
      header_ = h;
      break;
    }
    if (in_memory_) {
      header_ = h;
      break;
    }
    if (MutexLock lock(&catalog_mu_); !catalog_snapshot_ || process_id() != catalog_pid_) {
      catalog_ = Catalog::open(dir_ / kCatalogDir, false, false, shared_readonly_);
      catalog_snapshot_ = catalog_->snapshot();
      catalog_pid_ = process_id();
    } else {
      catalog_snapshot_->renew();
    }
    catalog_lost_ = false;  // taken with the header it is pinned with
    // The snapshot holds every catalog version generation h needs only if no later header
    // was written before it was taken: the newest valid copy must still be h.
    uint64_t newest = 0;
    for (uint64_t off : kHeaderCopyOffset) {
      DirHeader again;
      std::memcpy(&again, dir_map_ + off, sizeof again);
      if (header_valid(again)) newest = std::max(newest, again.generation);
    }
    if (newest == h.generation) {
      header_ = h;
      break;
    }
  }
  batch_size_.assign(header_.batch_size, header_.batch_size + header_.batch_ndim);
  indexed_ = header_.format_version >= kIndexedFormatVersion;
  layout_ = slot_layout(header_.format_version, header_.slot_count);
  if (writable_) tail_ = align_up(header_.arena_end, kPageSize);
  return header_.generation != before;
}

// Undoes what a writer that died mid-commit left past the committed generation: slot
// versions newer than it (or torn), arena bytes past arena_end, catalog versions. A committed
// version that fails its checksum is rewritten from its intact arena copy (resolve() finds it)
// or the open fails with CorruptionError; then the directory must match the header (live keys,
// live bytes and, from format version 2, the digest of every slot), so that a lost slot is
// reported instead of silently inviting a second copy of its key.
void Store::recover() {
  const uint64_t g = header_.generation;
  bool dirty = false;
  static const SlotRecord zero{};
  for (uint64_t s = 0; s < header_.slot_count; ++s) {
    for (int v = 0; v < 2; ++v) {
      const SlotRecord& r = inline_record(s, v);
      if (record_zero(r)) continue;
      const bool valid = record_valid(r);
      if (valid && r.generation <= g) continue;
      if (valid || r.generation > g) {
        // Uncommitted (newer than g, whole or torn by a crash): zeroed, generation field last,
        // so that a concurrent reader sees a newer generation until the record is all zero.
        dir_file_->write_at(slot_at(s, v) + 8, reinterpret_cast<const char*>(&zero) + 8,
                            sizeof zero - 8);
        dir_file_->write_at(slot_at(s, v), &zero, 8);
        dirty = true;
        continue;
      }
      // Fails its checksum and claims a committed generation: restore it.
      SlotRecord pair[2] = {inline_record(s, 0), inline_record(s, 1)};
      std::optional<SlotRecord> copy = arena_copy(r.self, g);
      const SlotRecord& other = pair[1 - v];
      if (!copy && record_valid(other) && other.prev != 0)
        if (auto c = arena_copy(other.prev, g); c && c->generation < other.generation) copy = c;
      if (!copy)
        corrupt(fmt_slot(s, v) + " fails its checksum and claims committed generation " +
                std::to_string(r.generation) +
                "; no intact copy of it is left (tdstore verify lists the damage)");
      dir_file_->write_at(slot_at(s, v), &*copy, sizeof *copy);
      dirty = true;
    }
  }
  // Format 4: index entries naming a slot a commit in progress was handing out, at or past
  // slots_used (the slots' versions are zeroed above). An entry past slot_count is damage,
  // left for check_directory() to report.
  for (uint64_t p = 0; indexed_ && p < header_.slot_count; ++p) {
    const uint64_t e = load_index_entry(p);
    if (e > header_.slots_used && e <= header_.slot_count) {
      const uint64_t zero_entry = 0;
      dir_file_->write_at(index_entry_offset(p), &zero_entry, sizeof zero_entry);
      dirty = true;
    }
  }
  if (dirty) dir_file_->sync();
  if (std::string why = check_directory(); !why.empty()) corrupt(why);
  if (arena_file_->size() > align_up(header_.arena_end, kPageSize)) {
    arena_file_->truncate(align_up(header_.arena_end, kPageSize));
    arena_file_->sync();
  }
  catalog_->recover(g, kCachePrefix);
  if (header_.format_version >= 2 && catalog_content_digest() != header_.catalog_digest)
    throw CorruptionError((dir_ / kCatalogDir).string() +
                          ": the catalog's records do not match generation " + std::to_string(g) +
                          "'s digest (records lost, altered or rolled back)");
}

namespace {
// DirHeader::catalog_digest as `snapshot` shows generation `gen`: the xor of content_digest()
// over the data records visible there (cache records are not versioned and not part of it).
uint64_t digest_at(const Catalog::Snapshot& snapshot, uint64_t gen) {
  uint64_t digest = 0;
  snapshot.scan(
      "", gen,
      [&](std::string_view k, std::string_view v) {
        if (k.substr(0, kCachePrefix.size()) != kCachePrefix) digest ^= content_digest(k, v);
      },
      [&](std::string_view k, const std::string& why) {  // damaged cache records are skipped
        if (k.substr(0, kCachePrefix.size()) != kCachePrefix) throw CorruptionError(why);
      });
  return digest;
}
}  // namespace

uint64_t Store::catalog_content_digest() const {
  MutexLock lock(&catalog_mu_);
  return digest_at(versioned_snapshot(), header_.generation);
}

uint64_t Store::directory_digest() const {
  uint64_t digest = 0;
  for (uint64_t s = 0; s < slot_limit(); ++s) {
    if (record_zero(inline_record(s, 0)) && record_zero(inline_record(s, 1))) continue;
    if (auto r = resolve(s, false)) digest ^= slot_digest(s, *r);
  }
  return digest;
}

// Compares the committed directory with what the header says of it: live keys, live bytes
// and (format version 2) the digest of every visible slot version. Empty when they agree.
std::string Store::check_directory(std::vector<uint64_t>* damaged_slots) const {
  uint64_t keys = 0, bytes = 0, digest = 0;
  std::vector<std::optional<uint64_t>> key_hash_of_slot(indexed_ ? header_.slots_used : 0);
  for (uint64_t s = 0; s < header_.slot_count; ++s) {
    if (record_zero(inline_record(s, 0)) && record_zero(inline_record(s, 1))) continue;
    bool damaged = false;
    auto r = resolve(s, false, &damaged);
    if (damaged && damaged_slots) damaged_slots->push_back(s);
    if (!r) continue;
    if (indexed_ && s >= header_.slots_used)
      return "slot " + std::to_string(s) + " holds a version of generation " +
             std::to_string(r->generation) + " but only " + std::to_string(header_.slots_used) +
             " slots are in use at generation " + std::to_string(header_.generation) +
             " (slots altered)";
    if (indexed_) key_hash_of_slot[s] = r->key_hash;
    digest ^= slot_digest(s, *r);
    if (r->state == static_cast<uint8_t>(SlotState::Live)) {
      ++keys;
      bytes += r->data_nbytes;
    }
  }
  const std::string g = " at generation " + std::to_string(header_.generation);
  if (keys != header_.live_keys)
    return "the header counts " + std::to_string(header_.live_keys) + " live keys" + g +
           ", the slots hold " + std::to_string(keys) + " (slots lost or altered)";
  if (bytes != header_.live_bytes)
    return "the header counts " + std::to_string(header_.live_bytes) + " live bytes" + g +
           ", the slots hold " + std::to_string(bytes) + " (slots lost or altered)";
  if (header_.format_version >= 2 && digest != header_.dir_digest)
    return "the slots do not match the directory digest" + g + " (slots lost or altered)";
  return indexed_ ? check_index(key_hash_of_slot) : "";
}

// Format 4: every slot in use is named by exactly one index entry, no entry names a slot past
// slot_count, and each slot's key reaches its entry by probing (no empty position between the
// key's home position and the entry). Entries naming slots at or past slots_used belong to a
// newer commit (a reader's view) and count as empty.
std::string Store::check_index(const std::vector<std::optional<uint64_t>>& key_hash_of_slot) const {
  const uint64_t n = header_.slot_count, mask = n - 1, used = header_.slots_used;
  std::vector<uint64_t> position_of(used, UINT64_MAX);
  std::vector<uint64_t> entries(n);
  for (uint64_t p = 0; p < n; ++p) entries[p] = load_index_entry(p);
  uint64_t named = 0;
  for (uint64_t p = 0; p < n; ++p) {
    uint64_t e = entries[p];
    if (e == 0) continue;
    if (e > n)
      return "key index position " + std::to_string(p) + " names slot " + std::to_string(e - 1) +
             ", past the " + std::to_string(n) + " slots (index altered)";
    if (e > used) {
      entries[p] = 0;
      continue;
    }
    if (position_of[e - 1] != UINT64_MAX)
      return "key index positions " + std::to_string(position_of[e - 1]) + " and " +
             std::to_string(p) + " both name slot " + std::to_string(e - 1) + " (index altered)";
    position_of[e - 1] = p;
    ++named;
  }
  if (named != used)
    return "the key index names " + std::to_string(named) + " of the " + std::to_string(used) +
           " slots in use at generation " + std::to_string(header_.generation) +
           " (index entries lost)";
  // run[p]: occupied positions ending at p (probing from any of them reaches p).
  uint64_t start = 0;
  while (start < n && entries[start] != 0) ++start;
  if (start == n) return "";  // a full index: every probe visits every position
  std::vector<uint64_t> run(n, 0);
  for (uint64_t i = 1; i <= n; ++i) {
    uint64_t p = (start + i) & mask;
    run[p] = entries[p] ? run[(p - 1) & mask] + 1 : 0;
  }
  for (uint64_t s = 0; s < used; ++s) {
    const uint64_t p = position_of[s];
    if (!key_hash_of_slot[s]) continue;  // empty at this generation (lost slots are reported above)
    if (((p - *key_hash_of_slot[s]) & mask) >= run[p])
      return "key index position " + std::to_string(p) + " names slot " + std::to_string(s) +
             ", which its key's probe from position " +
             std::to_string(*key_hash_of_slot[s] & mask) + " never reaches (index altered)";
  }
  return "";
}

// ---------------------------------------------------------------------------- lookup

const SlotRecord& Store::inline_record(uint64_t slot, int version) const {
  return *reinterpret_cast<const SlotRecord*>(dir_map_ + slot_at(slot, version));
}

// The committed arena copy of an inline version that fails its checksum: the record at
// `offset` when it is valid, sane, has `self == offset` and a generation <= g.
std::optional<SlotRecord> Store::arena_copy(uint64_t offset, uint64_t g) const {
  const uint64_t end = header_.arena_end;
  if (offset < kArenaDataOffset || offset > end || end - offset < sizeof(SlotRecord))
    return std::nullopt;
  SlotRecord r;
  std::memcpy(&r, mapping_->base() + offset, sizeof r);
  if (!record_valid(r) || !record_sane(r) || r.self != offset || r.generation > g)
    return std::nullopt;
  return r;
}

std::optional<SlotRecord> Store::resolve(uint64_t slot, bool with_staged, bool* damaged) const {
  if (with_staged && staged_) {
    if (auto it = staged_->records.find(slot); it != staged_->records.end()) return it->second;
  }
  const uint64_t g = header_.generation;
  // A writer may be rewriting either version while we read. Copy the pair twice until both
  // copies agree (a double collect): the two versions then coexisted at one instant, so the
  // newer is current and the older is its predecessor. Reading them at different times could
  // pair a version with a much newer one and skip the version in between.
  // The writer's own process is the only one writing the directory, and not while it reads.
  SlotRecord r[2], again[2];
  const uint8_t* at[2] = {dir_map_ + slot_at(slot, 0), dir_map_ + slot_at(slot, 1)};
  std::memcpy(&r[0], at[0], sizeof r[0]);
  std::memcpy(&r[1], at[1], sizeof r[1]);
  const bool alone = writable_ && process_id() == pid_;
  while (!alone) {
    std::memcpy(&again[0], at[0], sizeof again[0]);
    std::memcpy(&again[1], at[1], sizeof again[1]);
    if (std::memcmp(r, again, sizeof r) == 0) break;
    std::memcpy(r, again, sizeof r);
  }
  // An inline version that fails its checksum is either a commit in progress or interrupted
  // (it overwrites the older version, starting with its generation field, which is then newer
  // than any committed one), or damage. Committed versions were synced before the header that
  // committed them and are never torn, so a damaged one is restored from its arena copy (at
  // its `self`, or at the other version's `prev`) or reported, never taken as absent.
  bool valid[2] = {false, false}, restored[2] = {false, false};
  for (int v = 0; v < 2; ++v) {
    if (record_valid(r[v])) {
      if (!record_sane(r[v]))
        corrupt(fmt_slot(slot, v) + " has fields out of range (key_len, ndim or state)");
      valid[v] = true;
    }
  }
  for (int v = 0; v < 2; ++v) {
    if (valid[v] || record_zero(r[v])) continue;
    std::optional<SlotRecord> copy = arena_copy(r[v].self, g);
    const SlotRecord& other = r[1 - v];
    if (!copy && valid[1 - v] && other.prev != 0)
      if (auto c = arena_copy(other.prev, g); c && c->generation < other.generation) copy = c;
    if (copy) {
      r[v] = *copy;
      valid[v] = restored[v] = true;
    } else if (r[v].generation <= g) {
      corrupt(fmt_slot(slot, v) + " fails its checksum and claims committed generation " +
              std::to_string(r[v].generation) + "; no intact copy of it is left");
    }
  }
  int best = -1, newer = -1;
  for (int v = 0; v < 2; ++v) {
    if (!valid[v]) continue;
    if (r[v].generation <= g) {
      if (best < 0 || r[v].generation > r[best].generation) best = v;
    } else if (newer < 0 || r[v].generation < r[newer].generation) {
      newer = v;
    }
  }
  if (best >= 0) {
    if (damaged && restored[best]) *damaged = true;
    return r[best];
  }
  if (newer < 0) return std::nullopt;
  // Both inline versions are newer than this snapshot: walk the history kept in the arena.
  // Generations strictly decrease along prev, which bounds the walk.
  SlotRecord cur = r[newer];
  const uint64_t limit = arena_size();
  while (cur.prev != 0) {
    if (cur.prev < kArenaDataOffset || cur.prev > limit || limit - cur.prev < sizeof(SlotRecord))
      corrupt("slot " + std::to_string(slot) + " history points outside the arena");
    const uint64_t later = cur.generation;
    // Copies of versions newer than this generation may lie past a reader's mapping.
    if (cur.prev + sizeof cur <= mapping_->size())
      std::memcpy(&cur, mapping_->base() + cur.prev, sizeof cur);
    else
      arena_file_->read_at(cur.prev, &cur, sizeof cur);
    if (!record_valid(cur) || !record_sane(cur))
      corrupt("slot " + std::to_string(slot) + " history record fails its checksum");
    if (cur.generation >= later)
      corrupt("slot " + std::to_string(slot) + " history does not go back in generations");
    if (cur.generation <= g) return cur;
  }
  return std::nullopt;
}

// Entries are aligned 8-byte words that a commit changes only from 0 to their final value:
// one atomic load reads either.
uint64_t Store::load_index_entry(uint64_t position) const {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(dir_map_ + index_entry_offset(position)),
                         __ATOMIC_ACQUIRE);
}

std::optional<uint64_t> Store::index_slot(uint64_t position) const {
  if (staged_)
    if (auto it = staged_->index.find(position); it != staged_->index.end()) return it->second;
  const uint64_t e = load_index_entry(position);
  if (e == 0) return std::nullopt;
  if (e > header_.slot_count)
    corrupt("key index position " + std::to_string(position) + " names slot " +
            std::to_string(e - 1) + ", past the " + std::to_string(header_.slot_count) + " slots");
  return e - 1;
}

// Format 4 probes the key index: position p stands for the slot its entry names, or for an
// empty slot when it has none (entries only ever fill empty positions, and a slot an entry
// names that is empty at this generation was first written after it: its position was empty
// then too). The rules are otherwise those of format 3.
std::optional<std::pair<uint64_t, SlotRecord>> Store::probe(std::string_view key, uint64_t hash,
                                                            uint64_t* insert_slot,
                                                            uint64_t* insert_position) const {
  const uint64_t mask = header_.slot_count - 1;
  std::optional<uint64_t> tomb;
  if (insert_position) *insert_position = UINT64_MAX;
  for (uint64_t i = 0; i <= mask; ++i) {
    uint64_t s = (hash + i) & mask;
    if (indexed_) {
      auto named = index_slot(s);
      if (!named) {
        if (insert_slot) *insert_slot = tomb.value_or(UINT64_MAX);
        if (insert_position && !tomb) *insert_position = s;
        return std::nullopt;
      }
      s = *named;
    }
    auto r = resolve(s);
    if (!r) {
      if (insert_slot) *insert_slot = tomb.value_or(s);
      return std::nullopt;
    }
    bool same = r->key_hash == hash && record_key(*r) == key;
    if (r->state == static_cast<uint8_t>(SlotState::Live)) {
      if (same) return std::make_pair(s, *r);
    } else if (same) {  // the key's own tombstone: it comes back in the same slot
      if (insert_slot) *insert_slot = s;
      return std::nullopt;
    } else if (!tomb) {
      tomb = s;
    }
  }
  if (insert_slot) *insert_slot = tomb.value_or(UINT64_MAX);
  return std::nullopt;
}

std::optional<Entry> Store::find(std::string_view key) const {
  auto found = probe(key, xxh3(key), nullptr);
  if (!found) return std::nullopt;
  return entry_of(found->first, found->second);
}

// The entry a live slot version describes, after checking it against the arena.
Entry Store::entry_of(uint64_t slot, const SlotRecord& r) const {
  std::string_view key = record_key(r);
  if (!dtype_valid(r.dtype) || r.ndim > kMaxDims)
    corrupt("key " + in_quotes(key) + ": invalid dtype code or rank");
  Entry e;
  e.slot = slot;
  e.dtype = static_cast<DType>(r.dtype);
  e.shape.assign(r.shape, r.shape + r.ndim);
  e.offset = r.data_offset;
  e.nbytes = r.data_nbytes;
  e.content_hash = r.content_hash;
  e.capacity = r.data_capacity;
  e.flags = r.flags;
  e.generation = r.generation;
  for (int64_t d : e.shape)
    if (d < 0) corrupt("key " + in_quotes(key) + ": negative dimension");
  const auto n = shape_bytes(e.shape.data(), e.shape.size(), dtype_size(e.dtype));
  uint64_t end = writable_ ? tail_ : header_.arena_end;
  // Checked as differences: offset + nbytes may wrap past 2^64 in a crafted record.
  if (!n || *n != e.nbytes || e.capacity < e.nbytes || e.offset < kArenaDataOffset ||
      e.offset > end || end - e.offset < e.nbytes)
    corrupt("key " + in_quotes(key) + ": extent [" + std::to_string(e.offset) + ", +" +
            std::to_string(e.nbytes) + ") does not fit shape " + shape_text({r.shape, r.ndim}) +
            " or the arena (" + std::to_string(end) + " bytes)");
  return e;
}

uint64_t Store::slot_limit() const {
  if (!indexed_) return header_.slot_count;
  return header_.slots_used + (staged_ ? staged_->index.size() : 0);
}

void Store::for_each(const std::function<void(std::string_view, const Entry&)>& fn) const {
  for (uint64_t s = 0; s < slot_limit(); ++s) {
    bool staged = staged_ && staged_->records.count(s);
    if (!staged && inline_record(s, 0).generation == 0 && inline_record(s, 1).generation == 0)
      continue;
    auto r = resolve(s);
    if (!r || r->state != static_cast<uint8_t>(SlotState::Live)) continue;
    fn(record_key(*r), entry_of(s, *r));  // a key is live in one slot only
  }
}

const void* Store::data(const Entry& e) {
  flush_pending();
  if (e.offset > mapping_->size() || mapping_->size() - e.offset < e.nbytes)
    throw CapacityError(dir_.string() + ": extent ends at " + std::to_string(e.offset + e.nbytes) +
                        ", past this handle's arena_reserve " + std::to_string(mapping_->size()) +
                        "; reopen with a larger StoreOptions::arena_reserve");
  exposed_end_ = std::max(exposed_end_, e.offset + e.nbytes);
  if (e.offset >= run_start_ &&
      e.offset < run_end_) {  // later extents of the run start on a fresh page
    uint64_t next =
        std::min(run_end_, std::max(run_cur_, align_up(e.offset + e.nbytes, kPageSize)));
    free_->add_free(run_cur_, next - run_cur_);
    run_cur_ = next;
  }
  return mapping_->base() + e.offset;
}

std::shared_ptr<const void> Store::hold(const Entry& e) const {
  if (extent_pins_) return extent_pins_->pin(e.offset, mapping_);
  if (current_pin_) return current_pin_;
  return mapping_;
}

StoreInfo Store::info() const {
  StoreInfo i;
  i.format_version = header_.format_version;
  i.generation = header_.generation;
  i.commit_time_ns = header_.commit_time_ns;
  i.key_capacity = header_.key_capacity;
  i.slot_count = header_.slot_count;
  i.slots_used = indexed_ ? header_.slots_used : 0;
  i.live_keys = header_.live_keys;
  i.live_bytes = header_.live_bytes;
  i.arena_end = header_.arena_end;
  i.arena_file_size = arena_size();
  i.arena_reserve = mapping_->size();
  i.alignment = header_.alignment;
  i.batch_size = batch_size_;
  return i;
}

std::vector<std::string> Store::verify(const std::vector<std::string>& keys) const {
  flush_pending();
  std::vector<std::string> bad;
  // The stored bytes, not this process's view of them: the handle's mapping is private, and an
  // in-place write to a view (copy on write) changes only this process's pages. A shared,
  // read-only mapping of the file sees the page cache, i.e. what the file holds.
  const uint8_t* base = mapping_->base();
  size_t shared_size = 0;
  std::unique_ptr<Region> shared;
  if (!in_memory_) {
    shared_size = static_cast<size_t>(std::min<uint64_t>(arena_size(), mapping_->size()));
    if (shared_size) {
      shared = env_->map(*arena_file_, shared_size, Env::MapMode::SharedRead);
      base = shared->data();
    }
  }
  auto check = [&](std::string_view key, const Entry& e) {
    const uint64_t limit = shared ? shared_size : mapping_->size();
    if (e.offset > limit || limit - e.offset < e.nbytes ||
        xxh3(base + e.offset, e.nbytes) != e.content_hash)
      bad.emplace_back(key);
  };
  if (keys.empty()) {
    for_each(check);
    for (auto& problem : verify_structure()) bad.push_back(std::move(problem));
  } else {
    for (const auto& k : keys) {
      auto e = find(k);
      if (!e) throw KeyError(dir_.string() + ": key " + in_quotes(k) + " not found");
      check(k, *e);
    }
  }
  return bad;
}

std::string Store::fmt_slot(uint64_t slot, int version) const {
  return "slot " + std::to_string(slot) + " version " + std::to_string(version);
}

std::vector<std::string> Store::verify_structure() const {
  std::vector<std::string> bad;
  std::vector<uint64_t> damaged;
  if (damaged_header_ >= 0)
    bad.push_back("/directory/header copy " + std::to_string(damaged_header_) +
                  " fails its checksum (it may have held a newer commit than generation " +
                  std::to_string(header_.generation) + ")");
  if (std::string why = check_directory(&damaged); !why.empty())
    bad.push_back("/directory: " + why);
  for (uint64_t s : damaged) bad.push_back("/directory/slot " + std::to_string(s));
  if (in_memory_) return bad;
  uint64_t digest = 0;
  MutexLock lock(&catalog_mu_);
  versioned_snapshot().scan(  // a reader's snapshot pinned with its header: it holds generation's
                              // versions
      "", header_.generation,
      [&](std::string_view k, std::string_view v) {
        if (k.substr(0, kCachePrefix.size()) != kCachePrefix) {
          digest ^= content_digest(k, v);
          return;
        }
        try {  // the framing only: whether libtorch accepts the archive is the loader's question
          decode_graph_record(v, std::string(k));
        } catch (const CorruptionError& e) {
          bad.push_back("/catalog/" + std::string(k) + ": " + e.what());
        }
      },
      [&](std::string_view k, const std::string&) { bad.push_back("/catalog/" + std::string(k)); });
  if (header_.format_version >= 2 && digest != header_.catalog_digest && bad.empty())
    bad.push_back("/catalog: its records do not match generation " +
                  std::to_string(header_.generation) +
                  "'s digest (records lost, altered or rolled back)");
  return bad;
}

void Store::corrupt(const std::string& what) const {
  throw CorruptionError((dir_ / kDirectoryFile).string() + ": " + what);
}

// ---------------------------------------------------------------------------- writes

void Store::require_writable(std::string_view what) const {
  if (!writable_)
    throw ReadOnlyError(dir_.string() + ": " + std::string(what) +
                        " on a store opened ReadOnly; open it with OpenMode::ReadWrite");
  if (process_id() != pid_)
    throw Error(dir_.string() + ": " + std::string(what) +
                " through a writer handle inherited across fork; open the store in the child");
  if (broken_)
    throw IOError(dir_.string() + ": " + std::string(what) +
                  " refused: an earlier commit failed; reopen the store (the last committed "
                  "state is intact)");
}

uint64_t Store::allocate(uint64_t nbytes, uint64_t align) {
  if (!align) align = header_.alignment;
  if (free_ && nbytes) {
    if (!released_) {  // once per transaction: the readers' oldest generation only grows
      free_->release(readers_->oldest(header_.generation), extent_pins_.get());
      released_ = true;
    }
    uint64_t at = align_up(run_cur_, align);
    if (run_end_ > at && run_end_ - at >= nbytes) {
      free_->add_free(run_cur_, at - run_cur_);  // padding stays free (whole pages only are reused)
      run_cur_ = at + nbytes;
      txn_runs_.emplace_back(at, nbytes);
      if (undo_) undo_->allocated.emplace_back(at, nbytes);
      return at;
    }
    if (auto run = free_->take(nbytes)) {
      end_run();
      run_start_ = run->first;
      run_end_ = run->first + run->second;
      // This process's private (copy-on-write) pages of the run, left by views that died,
      // would hide the bytes written now: drop them.
      ::madvise(const_cast<uint8_t*>(mapping_->base()) + run_start_, run->second, MADV_DONTNEED);
      run_cur_ = run_start_ + nbytes;
      txn_runs_.emplace_back(run_start_, nbytes);
      if (undo_) undo_->allocated.emplace_back(run_start_, nbytes);
      return run_start_;
    }
  }
  uint64_t start = align_up(tail_, align);
  if (exposed_end_ > (start & ~(kPageSize - 1)))
    start = std::max(start, align_up(exposed_end_, kPageSize));
  if (start + nbytes > mapping_->size() || start + nbytes < start)
    throw CapacityError(dir_.string() + ": arena full: " + std::to_string(nbytes) +
                        " more bytes at offset " + std::to_string(start) +
                        " exceed arena_reserve " + std::to_string(mapping_->size()) +
                        "; reopen with a larger StoreOptions::arena_reserve or compact");
  if (free_) free_->add_free(tail_, start - tail_);
  tail_ = start + nbytes;
  if (undo_) undo_->allocated.emplace_back(start, nbytes);
  return start;
}

void Store::unallocate(uint64_t offset, uint64_t length, uint64_t saved_tail) {
  if (offset >= run_start_ && offset < run_end_) {
    txn_retired_.emplace_back(offset, length);
  } else {
    tail_ = saved_tail;
    if (free_) free_->trim(tail_);  // padding freed past the tail is tail again
  }
}

void Store::end_run() {
  if (!free_) return;
  if (run_end_ > run_cur_) free_->add_free(run_cur_, run_end_ - run_cur_);
  run_start_ = run_cur_ = run_end_ = 0;
}

void Store::supersede(uint64_t slot, const SlotRecord& replacement) {
  auto it = staged_->records.find(slot);
  if (it == staged_->records.end()) return;
  // A staged extent shared with the committed version is retired by commit(), not here.
  auto committed = resolve(slot, false);
  if (committed && committed->state == static_cast<uint8_t>(SlotState::Live) &&
      committed->data_offset == it->second.data_offset)
    return;
  retire(it->second, &replacement);
}

void Store::retire(const SlotRecord& old, const SlotRecord* replacement) {
  if (!free_ || old.state != static_cast<uint8_t>(SlotState::Live) || old.data_capacity == 0)
    return;
  if (replacement && replacement->state == static_cast<uint8_t>(SlotState::Live) &&
      replacement->data_offset == old.data_offset)
    return;  // appended in place
  txn_retired_.emplace_back(old.data_offset, old.data_capacity);
}

std::optional<uint8_t> Store::put(std::string_view key, DType dtype,
                                  const std::vector<int64_t>& shape, const void* src,
                                  uint64_t nbytes, uint64_t capacity, uint8_t flags) {
  require_writable("put " + in_quotes(key));
  const bool ragged = flags & kSlotRagged;
  std::string_view owner = ragged ? ragged_owner(key) : std::string_view();
  check_key(owner.empty() ? key : owner, dir_.string(), ragged);
  if (!dtype_valid(static_cast<uint8_t>(dtype)))
    throw DTypeError(dir_.string() + ": key " + in_quotes(key) + ": dtype code " +
                     std::to_string(static_cast<int>(dtype)) + " is not in the registry");
  if (shape.size() > kMaxDims)
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + " has " +
                     std::to_string(shape.size()) + " dims; at most " + std::to_string(kMaxDims));
  const auto& batch = staged_ && staged_->batch_size ? *staged_->batch_size : batch_size_;
  if (!ragged &&
      (shape.size() < batch.size() || !std::equal(batch.begin(), batch.end(), shape.begin())))
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": shape " + shape_text(shape) +
                     " does not start with batch size " + shape_text(batch));
  const auto expect = shape_bytes(shape.data(), shape.size(), dtype_size(dtype));
  if (!expect)
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": shape " + shape_text(shape) +
                     " has a negative dimension or a byte count past 64 bits");
  if (*expect != nbytes)
    throw ShapeError(dir_.string() + ": key " + in_quotes(key) + ": " + std::to_string(nbytes) +
                     " bytes given, shape needs " + std::to_string(*expect));

  uint64_t hash = xxh3(key);
  uint64_t slot = UINT64_MAX, position = UINT64_MAX;
  auto old = probe(key, hash, &slot, &position);
  if (old) slot = old->first;
  int64_t live = static_cast<int64_t>(header_.live_keys) + (staged_ ? staged_->keys_delta : 0);
  if (!old && ((slot == UINT64_MAX && position == UINT64_MAX) ||
               live >= static_cast<int64_t>(header_.key_capacity)))
    throw CapacityError(
        dir_.string() + ": key directory full (" + std::to_string(live) + " of " +
        std::to_string(header_.key_capacity) + " keys) adding " + in_quotes(key) +
        "; rebuild it larger with `tdstore compact " + dir_.string() +
        " --key-capacity N` (tdstore::compact), or create the store with a larger key_capacity");

  capacity = std::max(capacity, nbytes);
  const uint64_t saved_tail = tail_;
  uint64_t offset = capacity ? allocate(capacity) : align_up(tail_, header_.alignment);
  try {
    if (nbytes && nbytes <= kCombineMaxBytes && capacity == nbytes) {
      write_small(offset, src, nbytes);
    } else if (nbytes) {
      flush_pending();
      arena_file_->write_at(offset, src, nbytes);
    }
  } catch (...) {
    if (capacity)
      unallocate(offset, capacity, saved_tail);  // free again; nothing committed was touched
    throw;
  }
  SlotRecord r{};
  r.data_offset = offset;
  r.data_nbytes = nbytes;
  r.data_capacity = capacity;
  r.content_hash = xxh3(src, nbytes);
  r.state = static_cast<uint8_t>(SlotState::Live);
  r.flags = flags;
  r.dtype = static_cast<uint8_t>(dtype);
  r.ndim = static_cast<uint8_t>(shape.size());
  r.key_len = static_cast<uint16_t>(key.size());
  r.key_hash = hash;
  std::copy(shape.begin(), shape.end(), r.shape);
  std::memcpy(r.key, key.data(), key.size());
  if (!staged_) staged_ = std::make_unique<Staged>();
  if (slot == UINT64_MAX) {  // format 4, a new slot: the next in creation order
    slot = header_.slots_used + staged_->index.size();
    if (slot >= header_.slot_count)
      corrupt("the key index has an empty position but every slot is in use");
    staged_->index[position] = slot;
    if (undo_) undo_->positions.push_back(position);
  }
  remember_slot(slot);
  supersede(slot, r);
  staged_->records[slot] = r;
  append_hashes_.erase(slot);
  if (MutexLock lock(&index_mu_); !old && key_index_) {
    key_index_->emplace(key);
    companions_ += key.find('\0') != std::string_view::npos;
  }
  staged_->keys_delta += old ? 0 : 1;
  staged_->bytes_delta +=
      static_cast<int64_t>(nbytes) - (old ? static_cast<int64_t>(old->second.data_nbytes) : 0);
  if (!old) return std::nullopt;
  return old->second.flags;
}

void Store::write_small(uint64_t offset, const void* src, uint64_t nbytes) {
  MutexLock lock(&pending_mu_);  // uncontended: const calls flushing it are not concurrent here
  const uint64_t end = pending_offset_ + pending_.size();
  if (!pending_.empty() && (offset < end || offset - end >= header_.alignment ||
                            pending_.size() + (offset - end) + nbytes > kCombineBufferBytes))
    flush_pending_locked();
  if (pending_.empty()) pending_offset_ = offset;
  pending_.append(offset - (pending_offset_ + pending_.size()), '\0');
  pending_.append(static_cast<const char*>(src), nbytes);
  has_pending_.store(true, std::memory_order_release);
}

void Store::flush_pending() const {
  if (!has_pending_.load(std::memory_order_acquire)) return;
  MutexLock lock(&pending_mu_);
  flush_pending_locked();
}

void Store::flush_pending_locked() const {
  if (pending_.empty()) return;  // another const call flushed it
  try {
    arena_file_->write_at(pending_offset_, pending_.data(), pending_.size());
  } catch (...) {
    // Staged records point at bytes that never landed: nothing staged can be committed.
    pending_.clear();
    has_pending_.store(false, std::memory_order_release);
    broken_ = true;
    throw;
  }
  pending_.clear();
  has_pending_.store(false, std::memory_order_release);
}

void Store::append(std::string_view key, const std::vector<int64_t>& new_shape, const void* src,
                   uint64_t nbytes, uint64_t min_capacity) {
  require_writable("append to " + in_quotes(key));
  flush_pending();  // the stored bytes are read through the mapping, and written next to
  uint64_t hash = xxh3(key);
  auto found = probe(key, hash, nullptr);
  if (!found)
    throw KeyError(dir_.string() + ": cannot append to key " + in_quotes(key) + ": not found");
  auto [slot, old] = *found;
  auto e = find(key);
  uint64_t row_elems = 1;
  for (size_t d = 1; d < e->shape.size(); ++d) row_elems *= static_cast<uint64_t>(e->shape[d]);
  uint64_t row_bytes = row_elems * dtype_size(e->dtype);
  bool same_rows = e->shape.size() == new_shape.size() && !new_shape.empty() &&
                   std::equal(e->shape.begin() + 1, e->shape.end(), new_shape.begin() + 1) &&
                   new_shape[0] >= e->shape[0] &&
                   shape_bytes(new_shape.data(), new_shape.size(), dtype_size(e->dtype)) &&
                   static_cast<uint64_t>(new_shape[0] - e->shape[0]) * row_bytes == nbytes;
  if (!same_rows)
    throw ShapeError(dir_.string() + ": cannot append to key " + in_quotes(key) + " of shape " +
                     shape_text(e->shape) + ": rows of shape " + shape_text(new_shape) + " and " +
                     std::to_string(nbytes) + " bytes do not extend dim 0");
  SlotRecord r = old;
  auto& running = append_hashes_[slot];
  if (!running) {  // first append of this key in the session: hash what is stored, once
    running = std::make_unique<Xxh3Stream>();
    running->update(mapping_->base() + e->offset, e->nbytes);
  }
  const uint64_t saved_tail = tail_;
  uint64_t moved_to = 0, moved_cap = 0;
  try {
    if (e->capacity - e->nbytes >= nbytes) {
      if (nbytes) arena_file_->write_at(e->offset + e->nbytes, src, nbytes);
    } else {
      moved_cap = std::max({e->nbytes + nbytes, 4 * e->capacity, min_capacity});
      moved_to = allocate(moved_cap);
      if (e->nbytes) arena_file_->write_at(moved_to, mapping_->base() + e->offset, e->nbytes);
      if (nbytes) arena_file_->write_at(moved_to + e->nbytes, src, nbytes);
      r.data_offset = moved_to;
      r.data_capacity = moved_cap;
    }
  } catch (...) {
    if (moved_cap) unallocate(moved_to, moved_cap, saved_tail);
    append_hashes_.erase(slot);  // its state may already include rows that never landed
    throw;
  }
  running->update(src, nbytes);
  r.data_nbytes = e->nbytes + nbytes;
  r.content_hash = running->digest();
  std::copy(new_shape.begin(), new_shape.end(), r.shape);
  if (!staged_) staged_ = std::make_unique<Staged>();
  remember_slot(slot);
  supersede(slot, r);
  staged_->records[slot] = r;
  staged_->bytes_delta += static_cast<int64_t>(nbytes);
}

bool Store::erase(std::string_view key) {
  require_writable("erase " + in_quotes(key));
  uint64_t hash = xxh3(key);
  auto old = probe(key, hash, nullptr);
  if (!old) return false;
  SlotRecord r = old->second;
  r.state = static_cast<uint8_t>(SlotState::Erased);
  r.flags = 0;
  r.data_offset = r.data_nbytes = r.data_capacity = r.content_hash = 0;
  r.ndim = 0;
  r.dtype = static_cast<uint8_t>(DType::UInt8);
  std::fill(std::begin(r.shape), std::end(r.shape), 0);
  if (!staged_) staged_ = std::make_unique<Staged>();
  remember_slot(old->first);
  supersede(old->first, r);
  staged_->records[old->first] = r;
  append_hashes_.erase(old->first);
  if (MutexLock lock(&index_mu_); key_index_)
    if (auto it = key_index_->find(key); it != key_index_->end()) {
      key_index_->erase(it);
      companions_ -= key.find('\0') != std::string_view::npos;
    }
  staged_->keys_delta -= 1;
  staged_->bytes_delta -= static_cast<int64_t>(old->second.data_nbytes);
  return true;
}

void Store::set_batch_size(std::vector<int64_t> batch_size) {
  require_writable("set_batch_size");
  validate_batch(dir_, batch_size);
  if (!staged_) staged_ = std::make_unique<Staged>();
  if (undo_ && !undo_->batch_size) undo_->batch_size = staged_->batch_size;
  staged_->batch_size = std::move(batch_size);
}

// The catalog snapshot reads go through. A handle used in a forked child must not touch the
// parent's LMDB environment: the child opens its own and pins a new snapshot (versions are
// filtered by this handle's generation, so it reads the same values unless the writer has
// replaced a value twice since).
const Catalog::Snapshot& Store::catalog_snapshot() const {
  if (in_memory_) throw Error("<memory>: an in-memory store has no catalog");
  const bool forked = process_id() != catalog_pid_;
  if (forked) {  // the parent's environment is left alone (Catalog's destructors skip it)
    catalog_ = Catalog::open(dir_ / kCatalogDir, false, false, shared_readonly_);
    catalog_pid_ = process_id();
  }
  if (writable_) {
    writer_snapshot_ = catalog_->snapshot();
    return *writer_snapshot_;
  }
  if (forked) {
    catalog_snapshot_ = catalog_->snapshot();
    // The new snapshot holds the newest two versions of each record: this handle's generation
    // is still readable unless a writer replaced a value twice since. The header's digest tells.
    catalog_lost_ = header_.format_version >= 2 &&
                    digest_at(*catalog_snapshot_, header_.generation) != header_.catalog_digest;
  }
  return *catalog_snapshot_;
}

const Catalog::Snapshot& Store::versioned_snapshot() const {
  const Catalog::Snapshot& s = catalog_snapshot();
  if (catalog_lost_)
    throw Error(dir_.string() + ": this handle reads generation " +
                std::to_string(header_.generation) +
                " and was inherited by a forked process, whose catalog no longer holds that "
                "generation's attributes (a writer replaced them since): refresh() the handle in "
                "this process");
  return s;
}

void Store::check_catalog_key(std::string_view key) const {
  if (key.empty()) throw KeyError(dir_.string() + ": empty catalog key");
  if (key.size() > kMaxCatalogKeyBytes)
    throw KeyError(dir_.string() + ": catalog key " + in_quotes(key.substr(0, 40)) + "... is " +
                   std::to_string(key.size()) + " bytes; the catalog holds keys of at most " +
                   std::to_string(kMaxCatalogKeyBytes) + " (attribute names at most " +
                   std::to_string(kMaxCatalogKeyBytes - 5) + ")");
}

void Store::put_meta(std::string_view key, std::optional<std::string> value) {
  require_writable("put_meta " + in_quotes(key));
  check_catalog_key(key);
  if (!staged_) staged_ = std::make_unique<Staged>();
  remember_meta(std::string(key));
  staged_->meta[std::string(key)] = std::move(value);
}

std::optional<std::string> Store::get_meta(std::string_view key) const {
  if (staged_) {
    if (auto it = staged_->meta.find(std::string(key)); it != staged_->meta.end())
      return it->second;
  }
  MutexLock lock(&catalog_mu_);
  return versioned_snapshot().get(key, header_.generation);
}

std::vector<std::pair<std::string, std::string>> Store::scan_meta(std::string_view prefix) const {
  std::map<std::string, std::optional<std::string>> found;
  {
    MutexLock lock(&catalog_mu_);
    versioned_snapshot().scan(
        prefix, header_.generation,
        [&](std::string_view k, std::string_view v) { found[std::string(k)] = std::string(v); });
  }
  if (staged_)
    for (auto it = staged_->meta.lower_bound(std::string(prefix));
         it != staged_->meta.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
      found[it->first] = it->second;
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [k, v] : found)
    if (v) out.emplace_back(k, std::move(*v));
  return out;
}

void Store::put_cache(std::string_view key, std::optional<std::string> value) {
  check_catalog_key(key);
  MutexLock lock(&catalog_mu_);
  catalog_snapshot();  // reopens the environment in a forked child
  catalog_->write({{std::string(key), std::move(value)}}, 0);
}

std::vector<std::pair<std::string, std::string>> Store::scan_cache(
    std::string_view prefix, std::vector<std::string>* damaged) const {
  MutexLock lock(&catalog_mu_);
  catalog_snapshot();
  std::vector<std::pair<std::string, std::string>> out;
  catalog_->snapshot()->scan(
      prefix, 0,
      [&](std::string_view k, std::string_view v) {
        out.emplace_back(std::string(k), std::string(v));
      },
      [&](std::string_view k, const std::string&) {
        if (damaged) damaged->emplace_back(k);
      });
  return out;
}

std::vector<std::string> Store::attr_names() const {
  std::vector<std::string> out;
  for (auto& [k, v] : scan_meta(kAttrPrefix)) out.push_back(k.substr(kAttrPrefix.size()));
  return out;
}

bool Store::has_staged_changes() const { return staged_ && !staged_->empty(); }

void Store::begin_group() {
  require_writable("begin a write group");
  if (undo_) {
    ++undo_->depth;
    return;
  }
  undo_ = std::make_unique<Undo>();
  undo_->depth = 1;
  undo_->had_staged = staged_ != nullptr;
  undo_->keys_delta = staged_ ? staged_->keys_delta : 0;
  undo_->bytes_delta = staged_ ? staged_->bytes_delta : 0;
  undo_->retired = txn_retired_.size();
}

void Store::end_group() {
  if (undo_ && --undo_->depth == 0) undo_.reset();
}

void Store::remember_slot(uint64_t slot) {
  if (!undo_ || undo_->records.count(slot)) return;
  std::optional<SlotRecord> before;
  if (staged_)
    if (auto it = staged_->records.find(slot); it != staged_->records.end()) before = it->second;
  undo_->records.emplace(slot, before);
}

void Store::remember_meta(const std::string& key) {
  if (!undo_ || undo_->meta.count(key)) return;
  std::optional<std::optional<std::string>> before;
  if (staged_)
    if (auto it = staged_->meta.find(key); it != staged_->meta.end()) before = it->second;
  undo_->meta.emplace(key, before);
}

void Store::abort_group() {
  if (!undo_ || --undo_->depth > 0) return;  // an inner group: the outermost one undoes
  Undo u = std::move(*undo_);
  undo_.reset();
  if (staged_) {
    for (auto& [slot, before] : u.records) {
      if (before)
        staged_->records[slot] = *before;
      else
        staged_->records.erase(slot);
      append_hashes_.erase(slot);  // its running hash may hold the group's rows
    }
    for (uint64_t p : u.positions) staged_->index.erase(p);
    for (auto& [key, before] : u.meta) {
      if (before)
        staged_->meta[key] = *before;
      else
        staged_->meta.erase(key);
    }
    if (u.batch_size) staged_->batch_size = *u.batch_size;
    staged_->keys_delta = u.keys_delta;
    staged_->bytes_delta = u.bytes_delta;
    if (!u.had_staged && staged_->empty()) staged_.reset();
  }
  reset_key_index();
  // The records the group replaced are staged again: what it retired is not free. What it
  // allocated is unreferenced: free after the next commit, like a replaced staged extent (a
  // view of it, taken inside the group, keeps it pinned meanwhile).
  txn_retired_.resize(std::min(txn_retired_.size(), u.retired));
  if (free_)
    for (auto [offset, length] : u.allocated)
      if (offset < tail_) txn_retired_.emplace_back(offset, length);
}

void Store::rollback() {
  undo_.reset();  // a group around it has nothing left to undo
  {
    MutexLock lock(&pending_mu_);
    pending_.clear();
    has_pending_.store(false, std::memory_order_release);
  }
  staged_.reset();
  reset_key_index();
  append_hashes_.clear();
  // What this transaction took from free runs may be held by views made of staged extents.
  end_run();
  if (free_)
    for (auto [offset, length] : txn_runs_)
      free_->add_pending(offset, length, header_.generation + 1);
  txn_runs_.clear();
  txn_retired_.clear();
  released_ = false;
  tail_ = std::max(align_up(header_.arena_end, kPageSize), align_up(exposed_end_, kPageSize));
  if (free_) free_->trim(tail_);  // padding freed past the tail is tail again
}

// ---------------------------------------------------------------------------- commit

void Store::commit() {
  require_writable("commit");
  if (undo_) throw Error(dir_.string() + ": commit inside a write group");
  if (!has_staged_changes()) return;
  {
    // The writer's last read transaction would pin every catalog page freed from now on.
    MutexLock lock(&catalog_mu_);
    writer_snapshot_.reset();
  }
  try {
    const uint64_t g = header_.generation + 1;
    Staged& st = *staged_;
    flush_pending();

    // 1. Arena: tensor bytes are already written by put(); append every new slot version,
    //    linked to the version it replaces, then make the arena durable.
    std::vector<std::pair<uint64_t, int>> targets;  // slot, inline version to overwrite
    std::vector<SlotRecord> recs;
    // The digest of generation g: the committed one with each changed slot's visible version
    // swapped for its new one (computed in full once, when upgrading a version-1 store).
    uint64_t digest = header_.format_version >= 2 ? header_.dir_digest : directory_digest();
    targets.reserve(st.records.size());
    recs.reserve(st.records.size());
    // Format 4: slots at or past slots_used are new in this commit, all zero on disk (recovery
    // zeroed what a failed commit left): neither read nor rewritten from the mapping.
    const uint64_t fresh_from = indexed_ ? header_.slots_used : UINT64_MAX;
    for (auto& [slot, rec] : st.records) {
      int visible = -1;
      for (int v = 0; v < 2 && slot < fresh_from; ++v) {
        const SlotRecord& r = inline_record(slot, v);
        if (record_valid(r) && r.generation <= header_.generation &&
            (visible < 0 || r.generation > inline_record(slot, visible).generation))
          visible = v;
      }
      if (visible >= 0) {
        retire(inline_record(slot, visible), &rec);  // its bytes, unless rec keeps them
        const SlotRecord& overwritten = inline_record(slot, 1 - visible);
        if (free_ && record_valid(overwritten) && overwritten.generation <= header_.generation)
          txn_retired_.emplace_back(overwritten.self, sizeof(SlotRecord));  // its arena copy
      }
      SlotRecord r = rec;
      r.generation = g;
      r.prev = visible >= 0 ? inline_record(slot, visible).self : 0;
      // Copies are cut one by one (contiguous in a fresh run or the tail), so that small
      // free runs between live copies are reused too.
      r.self = allocate(sizeof(SlotRecord), alignof(SlotRecord) > 64 ? alignof(SlotRecord) : 64);
      seal(r);
      if (visible >= 0) digest ^= slot_digest(slot, inline_record(slot, visible));
      digest ^= slot_digest(slot, r);
      recs.push_back(r);
      targets.emplace_back(slot, visible >= 0 ? 1 - visible : 0);
    }
    for (size_t i = 0, j; i < recs.size(); i = j) {  // one write per contiguous group
      for (j = i + 1; j < recs.size() && recs[j].self == recs[j - 1].self + sizeof(SlotRecord);
           ++j) {
      }
      arena_file_->write_at(recs[i].self, &recs[i], (j - i) * sizeof(SlotRecord));
    }
    // The file must cover arena_end even when this commit wrote no bytes at its end (only
    // catalog changes, zero-byte tensors): readers treat a shorter arena as truncated.
    if (arena_file_->size() < tail_) arena_file_->truncate(tail_);
    arena_file_->sync();

    // 2. Catalog versions of generation g (one durable LMDB transaction).
    uint64_t catalog_digest =
        header_.format_version >= 2 ? header_.catalog_digest : catalog_content_digest();
    catalog_digest ^= catalog_->write(st.meta, g);

    // 3. Inline slot versions, never the one visible at the committed generation. Versions at
    //    most kMaxGapBytes apart go out as one write of their range, the versions in between
    //    rewritten with the bytes they hold (unchanged bytes stay unchanged even when a crash
    //    tears the write), so a commit of many keys costs few writes.
    constexpr uint64_t kMaxGapBytes = 4096;
    std::vector<std::pair<uint64_t, size_t>> writes;  // offset in keys.tdd, index into recs
    writes.reserve(recs.size());
    for (size_t i = 0; i < recs.size(); ++i)
      writes.emplace_back(slot_at(targets[i].first, targets[i].second), i);
    std::sort(writes.begin(), writes.end());
    std::string range;
    for (size_t i = 0, j; i < writes.size(); i = j) {
      for (j = i + 1; j < writes.size() &&
                      writes[j].first - writes[j - 1].first - sizeof(SlotRecord) <= kMaxGapBytes;
           ++j) {
      }
      const uint64_t begin = writes[i].first, end = writes[j - 1].first + sizeof(SlotRecord);
      range.assign(end - begin, '\0');
      for (uint64_t o = begin; o < end; o += sizeof(SlotRecord))
        if (layout_.slot_of(o).first < fresh_from)
          std::memcpy(range.data() + (o - begin), dir_map_ + o, sizeof(SlotRecord));
      for (size_t k = i; k < j; ++k)
        std::memcpy(range.data() + (writes[k].first - begin), &recs[writes[k].second],
                    sizeof(SlotRecord));
      dir_file_->write_at(begin, range.data(), range.size());
    }
    // Format 4: the new index entries, a page range at a time (the entries in between
    // rewritten with the values they hold).
    std::vector<std::pair<uint64_t, uint64_t>> entries(st.index.begin(), st.index.end());
    std::sort(entries.begin(), entries.end());
    for (auto it = entries.begin(); it != entries.end();) {
      const uint64_t first_page = index_entry_offset(it->first) / kPageSize;
      uint64_t last_page = first_page;
      auto end = it;
      for (; end != entries.end() && index_entry_offset(end->first) / kPageSize <= last_page + 1;
           ++end)
        last_page = index_entry_offset(end->first) / kPageSize;
      const uint64_t begin = first_page * kPageSize;
      const uint64_t stop = std::min((last_page + 1) * kPageSize, layout_.base);
      range.assign(reinterpret_cast<const char*>(dir_map_) + begin, stop - begin);
      for (; it != end; ++it) {
        const uint64_t e = it->second + 1;
        std::memcpy(range.data() + (index_entry_offset(it->first) - begin), &e, sizeof e);
      }
      dir_file_->write_at(begin, range.data(), range.size());
    }
    dir_file_->sync();

    // 4. The header copy not holding the committed generation: the commit point.
    DirHeader h = header_;
    h.format_version = indexed_ ? kIndexedFormatVersion : kHashedFormatVersion;  // 1 and 2 become 3
    if (indexed_) h.slots_used += st.index.size();
    h.generation = g;
    h.dir_digest = digest;
    h.catalog_txn = catalog_->last_txnid();
    h.catalog_digest = catalog_digest;
    h.arena_end = tail_;
    h.commit_time_ns = now_ns();
    h.live_keys = static_cast<uint64_t>(static_cast<int64_t>(h.live_keys) + st.keys_delta);
    h.live_bytes = static_cast<uint64_t>(static_cast<int64_t>(h.live_bytes) + st.bytes_delta);
    if (st.batch_size) {
      h.batch_ndim = static_cast<uint32_t>(st.batch_size->size());
      std::fill(std::begin(h.batch_size), std::end(h.batch_size), 0);
      std::copy(st.batch_size->begin(), st.batch_size->end(), h.batch_size);
    }
    seal(h);
    dir_file_->write_at(kHeaderCopyOffset[g % 2], &h, sizeof h);
    dir_file_->sync();

    header_ = h;
    batch_size_.assign(h.batch_size, h.batch_size + h.batch_ndim);
    staged_.reset();
    if (free_) {
      free_->add_free(tail_, align_up(tail_, kPageSize) - tail_);  // the rest of the last page
      end_run();
      for (auto [offset, length] : txn_retired_) free_->add_pending(offset, length, g);
    }
    tail_ = align_up(tail_, kPageSize);
    txn_runs_.clear();
    txn_retired_.clear();
    released_ = false;
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void Store::continue_generations_from(uint64_t g) {
  require_writable("continue_generations_from");
  if (header_.generation != 0 || g == 0)
    throw Error(dir_.string() + ": continue_generations_from needs a new store and g > 0");
  header_.generation = g - 1;
}

bool Store::refresh() {
  if (writable_) return false;
  if (swapped()) {
    // A compaction replaced the directory: move to the new store. Views of the old one keep
    // their mapping (Mapping is shared with them).
    dir_region_.reset();
    dir_map_ = nullptr;
    {
      MutexLock lock(&catalog_mu_);
      catalog_snapshot_.reset();
    }
    catalog_.reset();
    header_ = DirHeader{};
    open_files(OpenMode::ReadOnly);
    reset_key_index();
    return true;
  }
  bool moved = load_header();
  if (moved) {
    reset_key_index();
    remap();
  }
  return moved;
}

// A reader moving to a newer generation maps the arena afresh: the writer may have reused
// pages this process copied on write (in-place writes to views), whose private copies would
// hide the new bytes. Views of the old generation keep the old mapping and their pin.
void Store::remap() {
  if (in_memory_) return;
  if (header_.arena_end > arena_reserve_)
    throw CapacityError(dir_.string() + ": arena holds " + std::to_string(header_.arena_end) +
                        " bytes, more than arena_reserve " + std::to_string(arena_reserve_) +
                        "; open with a larger StoreOptions::arena_reserve");
  mapping_ = std::make_shared<Mapping>(*env_, *arena_file_, mapping_size());
  if (pins_) current_pin_ = pins_->pin(header_.generation, mapping_);
}

// A writer reserves arena_reserve to grow into; a reader maps only the arena its generation
// uses (a refresh that moves it maps afresh), so a process can hold thousands of read handles.
uint64_t Store::mapping_size() const {
  if (writable_) return arena_reserve_;
  return std::min(arena_reserve_,
                  align_up(std::max(header_.arena_end, kArenaDataOffset), kPageSize));
}

bool Store::swapped() const {
  const std::optional<FileIdentity> now = env_->identity(dir_ / kDirectoryFile);
  const std::optional<FileIdentity> mine = dir_file_->identity();
  return now && mine && *now != *mine;
}

const std::set<std::string, std::less<>>& Store::key_index() const {
  MutexLock lock(&index_mu_);  // const callers on several threads build it once
  if (!key_index_) {
    std::set<std::string, std::less<>> index;
    uint64_t companions = 0;
    for_each([&](std::string_view k, const Entry&) {
      index.emplace(k);
      companions += k.find('\0') != std::string_view::npos;
    });
    key_index_ = std::move(index);
    companions_ = companions;
  }
  return *key_index_;
}

void Store::reset_key_index() {
  MutexLock lock(&index_mu_);
  key_index_.reset();
}

uint64_t Store::key_count() const {
  const size_t keys = key_index().size();
  MutexLock lock(&index_mu_);
  return keys - companions_;
}

bool Store::has_prefix(std::string_view prefix) const {
  const auto& index = key_index();
  auto it = index.lower_bound(prefix);
  return it != index.end() && std::string_view(*it).substr(0, prefix.size()) == prefix;
}

}  // namespace tdstore::storage
