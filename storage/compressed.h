// Compressed keys (docs/FORMAT.md, "Compressed keys"): a key's stored bytes are its rows in
// independently compressed zstd blocks, then a block index and a trailer at the end. Appending
// rows writes new blocks, a new index and a new trailer after the old ones, so the bytes an
// older version names never change. Torch-free; every function here is pure (no I/O but what a
// RowSource's read does) and may run on any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tdstore/options.h"

namespace tdstore::storage {

inline constexpr uint64_t kBlockEntryBytes = 32;    // one block's entry in the index
inline constexpr uint64_t kBlockTrailerBytes = 48;  // the trailer: the last bytes stored
inline constexpr uint32_t kCodecZstd = 1;
inline constexpr char kBlockTrailerMagic[8] = {'T', 'D', 'S', 'Z', 'B', 'L', 'K', '\0'};

// A tensor as rows: dim 0 (a 0-d tensor is one row of one element).
struct RowLayout {
  uint64_t rows = 0;
  uint64_t row_bytes = 0;
};
// nullopt when the shape has a negative dimension, or its byte count or its row's passes 64
// bits (a row's may although the whole has no bytes: [0, 2^62, 2^62]).
std::optional<RowLayout> row_layout(const std::vector<int64_t>& shape, uint64_t item_bytes);

// A stored object's block index, checked (read_index).
struct BlockIndex {
  struct Block {
    uint64_t offset = 0;  // from the first stored byte
    uint64_t stored = 0;  // bytes of its zstd frame
    uint64_t first_row = 0;
    uint64_t rows = 0;
    uint64_t xxh3 = 0;  // of the frame's bytes
  };
  std::vector<Block> blocks;
  RowLayout layout;
  int32_t level = 0;
  uint64_t block_bytes = 0;  // the raw bytes a block aims at (appends keep the key's)
  uint64_t index_offset = 0;
  // The block holding `row`. REQUIRES: row < layout.rows. O(log blocks).
  size_t block_of(uint64_t row) const;
};

// The catalog attribute holding a store's default compression (StoreOptions::compression), as
// Compression::text() writes it.
inline constexpr char kCompressionAttr[] = "store/compression";

// ArgumentError naming `where` unless c is Zstd with a level in [1, 19] and block_bytes in
// [4 KiB, 1 GiB].
void check_compression(const Compression& c, const std::string& where);

// Rows to compress: at data, in memory; or, when read is set, read(byte offset, bytes, dst)
// copies that many of their bytes from that offset on into dst (called on the thread
// compressing them, block by block, into a buffer of its own: a file read with pread is read
// in parallel and compressed while in cache).
struct RowSource {
  const uint8_t* data = nullptr;
  std::function<void(uint64_t, uint64_t, void*)> read;
};

// A key's stored bytes as compress_rows makes them, in pieces: each thread's frames in the
// buffer it compressed them into, then the block index and trailer. Stored, they are the
// pieces' concatenation, in block order, which is never made in memory: each piece is written
// where it lands.
struct EncodedRows {
  std::vector<std::string> buffers;  // the bytes, owned
  struct Span {
    size_t buffer;
    uint64_t at, n;  // bytes [at, at + n) of buffers[buffer]
  };
  std::vector<Span> spans;  // the pieces, in stored order
  // Views of the pieces, in stored order; valid while this object lives unchanged.
  std::vector<std::string_view> pieces() const;
  void add(std::string bytes);  // a buffer, stored whole after the pieces before it
  uint64_t size() const;        // of the concatenation
  std::string join() const;     // the concatenation (for tests and tools; a writer lands pieces)
};

// The stored bytes of `layout.rows` rows at src under c (REQUIRES: check_compression), the
// cores taking the blocks one at a time, in order; the bytes do not depend on how many there
// are. Every frame is decompressed again as it is made, a 128 KiB piece at a time, and compared
// with its rows (CorruptionError naming `where` and the rows when it differs: rows changed while
// they were compressed): the bytes decompress to src. Memory: per thread, a block's zstd bound,
// the frames it made, and for a src that reads, a block's rows.
EncodedRows compress_rows(const RowSource& src, RowLayout layout, const Compression& c,
                          const std::string& where = "");

// The bytes to write after the `stored` bytes of object (whose index is idx) so that it holds
// `rows` more rows from src: the last block again with the new rows when it holds less than a
// block's worth, the new blocks, then an index naming the blocks kept and the new ones, and a
// trailer. The key's level and block size are kept; every frame is checked as compress_rows
// checks it, the new blocks shared among the cores as compress_rows shares them. No pieces for
// no rows.
EncodedRows append_rows(const uint8_t* object, uint64_t stored, const BlockIndex& idx,
                        const RowSource& src, uint64_t rows, const std::string& where);

// Reads and checks the index at the end of `stored` bytes: the trailer's magic, codec and
// checksum; blocks within the bytes before the index, in row order, of at least one row each,
// covering exactly layout.rows rows. CorruptionError naming `where` otherwise. O(blocks), no
// block decompressed.
BlockIndex read_index(const uint8_t* object, uint64_t stored, RowLayout layout,
                      const std::string& where);

// Blocks this process has decompressed (read_rows, check_blocks, an append's short last block),
// all keys and threads counted
// (relaxed): what a test or benchmark compares with the blocks an epoch needed.
uint64_t blocks_decompressed();

// Decompresses rows [first, first + count) into dst (count * row_bytes bytes), each block it
// touches checked first: its checksum, a whole zstd frame stating exactly the block's raw size.
// CorruptionError naming `where` and the block otherwise. A read of many blocks splits them
// among up to max_threads threads (0: one per core); 1 reads on the calling thread alone.
// REQUIRES: first + count <= rows.
void read_rows(const uint8_t* object, const BlockIndex& idx, uint64_t first, uint64_t count,
               void* dst, const std::string& where, uint64_t max_threads = 0);

// The stored bytes [first, second) holding the frames of rows [first, first + count): what a
// reader of those rows reads (and may ask the kernel to read ahead). REQUIRES: count > 0 and
// first + count <= rows. O(log blocks).
std::pair<uint64_t, uint64_t> frames_of(const BlockIndex& idx, uint64_t first, uint64_t count);

// The blocks holding `rows` (ascending, each < layout.rows) as runs of whole blocks, adjacent
// blocks merged: (first row, row count) each, ascending. Each block is named once however many
// of the rows it holds. O(rows + log(blocks) per block named).
std::vector<std::pair<uint64_t, uint64_t>> block_runs(const BlockIndex& idx,
                                                      const std::vector<uint64_t>& rows);

// Every block's frame checked as read_rows checks it before decompressing it (its checksum, one
// whole zstd frame stating the block's raw size), none decompressed: "" when all pass, else
// what is wrong with the first that does not. O(stored bytes), at the speed of xxh3.
std::string check_frames(const uint8_t* object, const BlockIndex& idx);

// Every block decompressed and checked as read_rows does: "" when all are intact, else what is
// wrong with the first damaged block.
std::string check_blocks(const uint8_t* object, const BlockIndex& idx);

}  // namespace tdstore::storage
