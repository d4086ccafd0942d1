// Store: create and open, and the header copies (recovery of a torn commit: store_recover.cpp).
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "storage/catalog.h"
#include "storage/checksum.h"
#include "storage/compact.h"
#include "storage/directory.h"
#include "storage/durable_dirs.h"
#include "storage/process.h"
#include "storage/store.h"
#include "storage/store_internal.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace fs = std::filesystem;

std::unique_ptr<Store> Store::create(const fs::path& dir, std::vector<int64_t> batch_size,
                                     const StoreOptions& options) {
  auto env = options.env ? options.env : Env::posix();
  validate_batch(dir, batch_size);
  if (options.key_capacity <= 0 || options.key_capacity > (int64_t{1} << 32))
    throw ArgumentError(dir.string() + ": key_capacity must be in [1, 2^32], got " +
                        std::to_string(options.key_capacity));
  if (options.format_version != kHashedFormatVersion &&
      options.format_version != kIndexedFormatVersion)
    throw ArgumentError(
        dir.string() + ": format_version must be " + std::to_string(kHashedFormatVersion) + " or " +
        std::to_string(kIndexedFormatVersion) + ", got " + std::to_string(options.format_version));
  if (options.alignment < 64 || options.alignment > (1 << 20) ||
      !std::has_single_bit(static_cast<uint64_t>(options.alignment)))
    throw ArgumentError(dir.string() + ": alignment must be a power of two in [64, 1 MiB], got " +
                        std::to_string(options.alignment));
  std::error_code ec;
  if (fs::exists(dir, ec) && !(fs::is_directory(dir, ec) && fs::is_empty(dir, ec)))
    throw IOError(dir.string() +
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
  s->publish(Snapshot::empty(dir));
  s->arena_reserve_ = static_cast<uint64_t>(options.arena_reserve);
  s->lock_timeout_ms_ = options.lock_timeout_ms;
  s->shared_readonly_ = options.shared_readonly;
  s->reuse_ = options.reuse_space;
  if (options.shared_readonly && mode != OpenMode::ReadOnly)
    throw ArgumentError(dir.string() + ": shared_readonly applies to ReadOnly opens only");
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
    {
      MutexLock lock(&catalog_mu_);
      catalog_snapshot_.reset();
    }
    catalog_.reset();
    lock_.reset();
    current_pin_.reset();
    pins_.reset();
    readers_.reset();
    publish(Snapshot::empty(dir_));
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
  Snapshot files = Snapshot::empty(dir_);
  files.directory = env_->map(*dir_file_, dsize, Env::MapMode::SharedRead);
  files.dir_map = files.directory->data();
  files.dir_map_size = dsize;

  arena_file_ = env_->open(dir_ / kArenaFile, access);
  ArenaHeader a{};
  arena_file_->read_at(0, &a, sizeof a);
  if (std::memcmp(a.magic, kArenaMagic, 8) != 0 ||
      a.checksum != xxh3(&a, offsetof(ArenaHeader, checksum)))
    throw CorruptionError((dir_ / kArenaFile).string() + ": bad arena header");
  files.arena = arena_file_;
  publish(std::move(files));  // no generation yet: load_header() adopts one
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
  remap();
  if (snap_->header.format_version >= 2 && catalog_->last_txnid() < snap_->header.catalog_txn)
    throw CorruptionError(
        (dir_ / kCatalogDir).string() + ": the catalog is at transaction " +
        std::to_string(catalog_->last_txnid()) + ", generation " +
        std::to_string(snap_->header.generation) + " committed it at transaction " +
        std::to_string(snap_->header.catalog_txn) +
        " (deleted, truncated or replaced: attributes and provenance would be lost)");
  if (writable_) {
    recover();
    extent_pins_ = std::make_shared<ExtentPins>();
    ArenaAllocator::Setup a;
    a.where = dir_.string();
    a.tail = align_up(snap_->header.arena_end, kPageSize);
    a.limit = snap_->mapping->size();
    if (reuse_)
      a.free = std::make_unique<FreeSpace>(scan_space(readers_->oldest(snap_->header.generation)));
    a.oldest_reader = [this] { return readers_->oldest(snap_->header.generation); };
    a.pins = extent_pins_;
    a.taken = [this](uint64_t offset, uint64_t length) {
      env_->advise(snap_->mapping->base() + offset, length, Env::Advice::Discard);
    };
    txn_ = std::make_unique<WriteTxn>(std::move(a), arena_file_, snap_->header.alignment);
  }
}

Store::~Store() = default;

// Reads both header copies and adopts the valid one with the highest generation, with a
// catalog snapshot taken between two reads of the same generation (so the catalog holds
// every version the generation needs).
bool Store::load_header() {
  const uint64_t before = snap_->header.generation;
  DirHeader adopted;
  int damaged = -1;  // a header copy that fails its checksum
  // keys.tdd never shrinks: a shorter file (damage) would turn reads of the mapping into SIGBUS.
  if (dir_file_ && dir_file_->size() < snap_->dir_map_size)
    throw CorruptionError((dir_ / kDirectoryFile).string() +
                          ": truncated under an open handle: " + std::to_string(dir_file_->size()) +
                          " bytes, " + std::to_string(snap_->dir_map_size) + " when opened");
  for (;;) {
    DirHeader copies[2];
    std::memcpy(&copies[0], snap_->dir_map + kHeaderCopyOffset[0], sizeof(DirHeader));
    std::memcpy(&copies[1], snap_->dir_map + kHeaderCopyOffset[1], sizeof(DirHeader));
    const DirHeader* best = nullptr;
    bool magic = false;
    damaged = -1;
    for (int c = 0; c < 2; ++c)
      if (!header_valid(copies[c])) damaged = c;
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
    if (snap_->dir_map_size < slots_at ||
        (snap_->dir_map_size - slots_at) / (2 * sizeof(SlotRecord)) < h.slot_count)
      throw CorruptionError(file + ": truncated: " + std::to_string(snap_->dir_map_size) +
                            " bytes for " + std::to_string(h.slot_count) + " slots");
    uint64_t asize = arena_size();
    if (asize < h.arena_end)
      throw CorruptionError((dir_ / kArenaFile).string() + ": truncated: " + std::to_string(asize) +
                            " bytes, generation " + std::to_string(h.generation) + " uses " +
                            std::to_string(h.arena_end));
    if (writable_) {
      // A header copy is one write inside one sector, synced: it is never torn, so an invalid
      // copy is damage, and it may have held the newest commit. A writer would overwrite it and
      // make a rollback permanent.
      if (damaged >= 0)
        throw CorruptionError(file + ": header copy " + std::to_string(damaged) +
                              " is damaged; it may have held the newest commit (generation " +
                              std::to_string(h.generation + 1) +
                              "), so the store is not opened for writing");
      adopted = h;
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
      std::memcpy(&again, snap_->dir_map + off, sizeof again);
      if (header_valid(again)) newest = std::max(newest, again.generation);
    }
    if (newest == h.generation) {
      adopted = h;
      break;
    }
  }
  // An unmoved refresh (the common poll) publishes nothing.
  if (std::memcmp(&adopted, &snap_->header, sizeof adopted) != 0 ||
      damaged != snap_->damaged_header) {
    Snapshot next = *snap_;
    next.adopt(adopted);
    next.damaged_header = damaged;
    publish(std::move(next));
  }
  return adopted.generation != before;
}

}  // namespace tdstore::storage
