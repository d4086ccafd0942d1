// On-disk structures of the store format, version kFormatVersion (the fields each version added
// are marked v2, v3, ...). docs/FORMAT.md is the normative description; every constant and offset
// here is stated there. All integers are little-endian.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tdstore::storage {

static_assert(std::endian::native == std::endian::little, "the store format is little-endian");

// Version 2 added the directory digest and the catalog transaction id to the header; version
// 3, space reuse and the reader table (same byte layout), and is read, and what versions 1 and
// 2 are upgraded to by their first commit. Version 4 places slots densely, in the order keys
// are created, behind a key index (kIndexedFormatVersion); a version-3 store keeps its layout
// until it is compacted. Version 5 is version 4 with compressed keys (kSlotCompressed): the
// commit that first stores one marks the store 5, which builds before it refuse.
inline constexpr uint32_t kFormatVersion = 5;
inline constexpr uint32_t kCompressedFormatVersion = 5;  // kIndexedFormatVersion + compressed keys
inline constexpr uint32_t kHashedFormatVersion = 3;      // slots placed by key hash
inline constexpr uint32_t kIndexedFormatVersion = 4;     // slots in creation order, key index
inline constexpr uint32_t kOldestFormatVersion = 1;
inline constexpr char kDirMagic[8] = {'T', 'D', 'S', 'T', 'D', 'I', 'R', '\0'};
inline constexpr char kArenaMagic[8] = {'T', 'D', 'S', 'T', 'A', 'R', 'N', '\0'};

inline constexpr char kDirectoryFile[] = "keys.tdd";
inline constexpr char kArenaFile[] = "arena.tda";
inline constexpr char kCatalogDir[] = "catalog";
inline constexpr char kLockFile[] = "LOCK";

inline constexpr uint64_t kPageSize = 4096;
inline constexpr uint64_t kHeaderCopyOffset[2] = {0, 4096};
inline constexpr uint64_t kSlotsOffset = 8192;  // versions 1-3; version 4: the key index
inline constexpr uint64_t kIndexOffset = 8192;  // version 4: slot_count u64 entries, then the slots
inline constexpr uint64_t kArenaDataOffset = 4096;            // the arena header occupies [0, 4096)
inline constexpr uint64_t kMaxSlotCount = uint64_t{1} << 40;  // slot_count_for(2^32) is 2^33
inline constexpr size_t kMaxDims = 16;
inline constexpr size_t kMaxBatchDims = 16;
inline constexpr size_t kMaxKeyBytes = 304;

// One copy of the key directory header. Copy k lives at kHeaderCopyOffset[k]; the rest of its
// 4096-byte page is zero. A copy is valid when magic matches and checksum ==
// xxh3(bytes [0, 248)). The valid copy with the highest generation is the committed state.
struct DirHeader {
  char magic[8];                      //   0
  uint32_t format_version;            //   8
  uint32_t header_size;               //  12  == sizeof(DirHeader) == 256
  uint64_t generation;                //  16  committed generation (0: freshly created, empty)
  uint64_t key_capacity;              //  24  maximum live keys
  uint64_t slot_count;                //  32  power of two >= key_capacity * 3 / 2
  uint32_t slot_record_size;          //  40  == sizeof(SlotRecord) == 512
  uint32_t alignment;                 //  44  extent alignment, power of two >= 64
  uint64_t arena_end;                 //  48  arena bytes in use at this generation
  uint64_t commit_time_ns;            //  56  wall clock of the commit, ns since the Unix epoch
  uint64_t live_keys;                 //  64  keys present at this generation
  uint64_t live_bytes;                //  72  sum of data_nbytes over present keys
  uint32_t batch_ndim;                //  80
  uint32_t reserved0;                 //  84  zero
  int64_t batch_size[kMaxBatchDims];  //  88
  uint64_t dir_digest;   // 216  v2: XOR of slot_digest() over slots visible at generation
  uint64_t catalog_txn;  // 224  v2: LMDB transaction id the catalog had reached at the commit
  uint64_t
      catalog_digest;   // 232  v2: XOR of content_digest() over data records visible at generation
  uint64_t slots_used;  // 240  v4: slots [0, slots_used) are handed out; zero before v4
  uint64_t checksum;    // 248
};
static_assert(sizeof(DirHeader) == 256);

enum class SlotState : uint8_t { Empty = 0, Live = 1, Erased = 2 };

// Bits of SlotRecord::flags.
enum SlotFlags : uint8_t {
  // Part of a ragged key: its values, or (key "<name>\0offsets") its int64 offsets. Exempt
  // from the batch-size prefix rule (FORMAT.md, "Ragged keys").
  kSlotRagged = 1,
  // v5: the stored bytes are the rows in zstd blocks behind a block index (storage/compressed.h;
  // FORMAT.md, "Compressed keys"); data_nbytes counts them, the shape the raw bytes.
  kSlotCompressed = 2,
};

// One version of one slot. Each slot holds two versions of 512 bytes; where they lie in keys.tdd
// depends on the format version (SlotLayout, storage/directory.h; FORMAT.md, "Key directory").
// A version is valid when generation != 0 and checksum == xxh3(bytes [0, 504)).
// Every committed version is also copied into the arena at `self`; `prev` points to the arena
// copy of the version it replaced (0: none), so a reader can walk back to any generation.
struct SlotRecord {
  uint64_t generation;      //   0  commit that wrote this version
  uint64_t prev;            //   8  arena offset of the previous version's copy, 0 if none
  uint64_t self;            //  16  arena offset of this version's copy
  uint64_t data_offset;     //  24  arena offset of the tensor bytes
  uint64_t data_nbytes;     //  32
  uint64_t content_hash;    //  40  xxh3 of the tensor bytes
  uint8_t state;            //  48  SlotState
  uint8_t dtype;            //  49  storage::DType code
  uint8_t ndim;             //  50  <= kMaxDims
  uint8_t flags;            //  51  SlotFlags bits
  uint16_t key_len;         //  52  <= kMaxKeyBytes
  uint16_t reserved0;       //  54  zero
  uint64_t key_hash;        //  56  xxh3 of the key bytes
  int64_t shape[kMaxDims];  //  64
  uint64_t data_capacity;   // 192  bytes reserved at data_offset (>= data_nbytes): appends
                            //      fill the rest without moving the tensor
  char key[kMaxKeyBytes];   // 200  UTF-8, not NUL-terminated, zero padded
  uint64_t checksum;        // 504
};
static_assert(sizeof(SlotRecord) == 512);

struct ArenaHeader {
  char magic[8];            //  0
  uint32_t format_version;  //  8
  uint32_t alignment;       // 12
  uint8_t reserved[40];     // 16  zero
  uint64_t checksum;        // 56  xxh3 of bytes [0, 56)
};
static_assert(sizeof(ArenaHeader) == 64);

inline constexpr uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }

}  // namespace tdstore::storage
