// Options for creating and opening stores. Every field has a documented default.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "tdstore/export.h"

namespace tdstore {

class Env;

enum class OpenMode { ReadOnly, ReadWrite };

// How a key's bytes are stored (docs/FORMAT.md, "Compressed keys"). None: raw, and read
// zero-copy. Zstd: the rows in independently compressed blocks of about block_bytes raw bytes
// (whole rows, at least one), each with its own checksum, behind a block index. A read returns
// a new tensor rather than a view: get() decompresses the whole key; row reads (td[i], index
// and slice, Dataset::index, Store::read_rows) only the blocks holding the rows, except under a
// recording (an observer, a RunWatch, torch.jit's tracer), where they decompress it whole.
//
// The default level is 1, numcodecs.Zstd's default too (zarr 2's default compressor is Blosc,
// not zstd): on the Fashion-MNIST train store (README, "Compressed keys") it stores 0.37x the
// raw bytes (level 2: 0.32x, 3: 0.31x) and imports about 1.45x as fast as level 3 (1.1x level
// 2): the uint8 images compress alike at all three, the float32 feature less at 1. Every level
// reads back at about the same speed.
struct Compression {
  enum class Codec : uint8_t { None = 0, Zstd = 1 };
  static constexpr int kDefaultLevel = 1;
  static constexpr int64_t kDefaultBlockBytes = int64_t{1} << 20;
  Codec codec = Codec::None;
  int level = kDefaultLevel;                 // zstd level, 1 to 19
  int64_t block_bytes = kDefaultBlockBytes;  // raw bytes per block, 4 KiB to 1 GiB
  static Compression none() { return {}; }
  static Compression zstd(int level = kDefaultLevel, int64_t block_bytes = kDefaultBlockBytes) {
    return {Codec::Zstd, level, block_bytes};
  }
  bool enabled() const { return codec != Codec::None; }
  bool operator==(const Compression&) const = default;
  // "none", "zstd", "zstd:LEVEL" or "zstd:LEVEL:BLOCK_BYTES", what is left out taking zstd()'s
  // defaults: what the CLI's --compress and Python's compression= take. ArgumentError
  // otherwise, or for a level or block size out of range.
  TDSTORE_API static Compression parse(std::string_view text);
  // What parse() reads back: "none" or "zstd:LEVEL:BLOCK_BYTES".
  TDSTORE_API std::string text() const;
};

struct StoreOptions {
  // Maximum number of live keys. Fixed when the store is created (stored in the key
  // directory); the directory file holds bit_ceil(key_capacity * 3 / 2) slots of 1 KiB,
  // allocated sparsely. Adding a key past it throws CapacityError.
  int64_t key_capacity = 4096;

  // On-disk format of a new store (docs/FORMAT.md): 4 places slots in the order keys are
  // created, behind a key index, so that a commit of many new keys writes few directory pages;
  // 3 places them by key hash, and is what builds before format 4 read. Fixed at creation
  // (compaction rewrites a store in format 4).
  int format_version = 4;

  // Alignment of every tensor extent in the arena, a power of two >= 64. Fixed at creation.
  int64_t alignment = 64;

  // Address range a writer reserves for the arena mapping when it opens the store (not
  // memory, not disk); a set() that would grow the arena past it throws CapacityError. A
  // read-only handle maps only the arena its generation uses, so a process can hold thousands
  // of them (CapacityError when that is more than this). Per open, not stored.
  int64_t arena_reserve = int64_t{1} << 40;  // 1 TiB

  // How long opening ReadWrite waits for another writer to release the store before throwing
  // LockError. 0: fail at once. Per open, not stored.
  int64_t lock_timeout_ms = 0;

  // Readers on a shared file system mounted by several machines: LMDB's lock file does not
  // work across machines, so the catalog is read without it (MDB_NOLOCK). Safe only while no
  // writer is active anywhere (docs/DESIGN.md, "Readers on shared file systems"). ReadOnly only.
  bool shared_readonly = false;

  // Reuse arena space freed by earlier commits once no reader can see it (docs/DESIGN.md,
  // "Space reuse"). false: the arena only grows until `tdstore compact` (the behaviour of
  // format version 2). Per open, not stored.
  bool reuse_space = true;

  // The compression of keys set through this handle without one of their own. create() records
  // it in the store (catalog attribute "store/compression", committed with the first commit),
  // and a handle opened without one uses the recorded one; unset and unrecorded: none. Keys
  // already stored keep theirs, and appended rows take their key's.
  std::optional<Compression> compression;

  // Operating-system boundary; nullptr means Env::posix(). Tests pass fault-injecting Envs.
  std::shared_ptr<Env> env;
};

}  // namespace tdstore
