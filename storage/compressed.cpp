#include "storage/compressed.h"

#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>

#include "storage/checksum.h"
#include "tdstore/dtype.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

constexpr int kMinLevel = 1, kMaxLevel = 19;
constexpr int64_t kMinBlockBytes = int64_t{4} << 10, kMaxBlockBytes = int64_t{1} << 30;

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // the format is little-endian, as is every machine tdstore builds on
  return v;
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

struct CctxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DctxFree {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};
ZSTD_CCtx* cctx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CctxFree> c(ZSTD_createCCtx());
  return c.get();
}
ZSTD_DCtx* dctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DctxFree> d(ZSTD_createDCtx());
  return d.get();
}

// Threads a large compression or read splits its blocks among: the machine's cores.
uint64_t parallelism() { return std::max(1u, std::thread::hardware_concurrency()); }

// Rows a block holds: the largest power of two of whole rows within block_bytes, at least one
// (all when rows are empty). A power of two, so that the Loader's quasi-random blocks, powers
// of two as well and at least as large, each hold whole compressed blocks of every key
// (src/loader_order.h): an epoch past its memory budget decompresses each block once.
uint64_t rows_per_block(uint64_t row_bytes, uint64_t block_bytes) {
  if (row_bytes == 0) return UINT64_MAX;
  return std::bit_floor(std::max<uint64_t>(1, block_bytes / row_bytes));
}

// The memory s has reserved backed by huge pages where the kernel has them, when there is
// enough of it to hold one (Env::Advice::HugePages).
void writable_in_huge_pages(std::string& s) {
  if (s.capacity() >= (size_t{4} << 20))
    Env::posix()->advise(s.data(), s.capacity(), Env::Advice::HugePages);
}

// A block's frame and the bytes that check it, reused from block to block by one thread: the
// frame as compressed, and its rows as they decompress again.
struct FrameBuffers {
  std::vector<char> frame, check, rows;  // rows: those read from a RowSource's read
};

// n bytes of src from byte `at` on: in place, or read into buffers.rows.
const uint8_t* rows_at(const RowSource& src, uint64_t at, uint64_t n, FrameBuffers& buffers) {
  if (!src.read) return src.data + at;
  if (n > buffers.rows.size()) {
    buffers.rows.clear();
    buffers.rows.shrink_to_fit();
    buffers.rows.resize(n);
  }
  if (n) src.read(at, n, buffers.rows.data());
  return reinterpret_cast<const uint8_t*>(buffers.rows.data());
}

// Whether the zstd frame of z bytes decompresses to exactly the n bytes at src: decompressed a
// piece at a time into buffers.check and compared as it goes, so the check holds a piece
// (kCheckPiece bytes), not the block, while the block is still in the core's cache.
constexpr size_t kCheckPiece = 128 << 10;
bool decodes_to(const char* frame, size_t z, const uint8_t* src, size_t n, FrameBuffers& buffers) {
  auto& piece = buffers.check;
  piece.resize(kCheckPiece);
  ZSTD_DCtx* d = dctx();
  ZSTD_DCtx_reset(d, ZSTD_reset_session_only);
  ZSTD_inBuffer in{frame, z, 0};
  size_t done = 0;
  for (;;) {
    ZSTD_outBuffer out{piece.data(), piece.size(), 0};
    const size_t left = ZSTD_decompressStream(d, &out, &in);
    if (ZSTD_isError(left) || out.pos > n - done ||
        (out.pos && std::memcmp(piece.data(), src + done, out.pos) != 0))
      return false;
    done += out.pos;
    if (left == 0) return done == n && in.pos == z;       // the frame ends here
    if (in.pos == z && out.pos < out.size) return false;  // the frame is cut short
  }
}

// Appends one zstd frame of n raw bytes to out; returns its entry (offset = base + where it
// starts in out). The frame is compressed into buffers.frame and appended: out grows by the
// compressed bytes only, never zero-filled. Before it is appended the frame is decompressed
// again and compared with src, byte for byte (decodes_to): what is stored is known to read
// back as the rows it was made of (an import's exactness rests on it). CorruptionError naming
// `where` and the rows when it does not (rows in memory changed while they were compressed).
BlockIndex::Block add_frame(std::string& out, uint64_t base, const void* src, size_t n, int level,
                            uint64_t first_row, uint64_t rows, FrameBuffers& buffers,
                            const std::string& where) {
  auto& frame = buffers.frame;
  if (const size_t bound = ZSTD_compressBound(n); bound > frame.size()) {
    frame.clear();
    frame.shrink_to_fit();
    frame.resize(bound);
  }
  const size_t z = ZSTD_compressCCtx(cctx(), frame.data(), frame.size(), src, n, level);
  if (ZSTD_isError(z)) throw Error(where + ": zstd: " + ZSTD_getErrorName(z));
  if (!decodes_to(frame.data(), z, static_cast<const uint8_t*>(src), n, buffers))
    throw CorruptionError(where + ": the zstd frame of rows " + std::to_string(first_row) + " to " +
                          std::to_string(first_row + rows - 1) +
                          " does not decompress to them (did they change while compressed?)");
  const size_t at = out.size();
  out.append(frame.data(), z);
  return {base + at, z, first_row, rows, xxh3(frame.data(), z)};
}

void add_index(std::string& out, const std::vector<BlockIndex::Block>& blocks, uint64_t rows,
               int32_t level, uint64_t block_bytes) {
  const size_t at = out.size();
  for (const auto& b : blocks) {
    put_u64(out, b.offset);
    put_u64(out, b.stored);
    put_u64(out, b.rows);
    put_u64(out, b.xxh3);
  }
  out.append(kBlockTrailerMagic, sizeof kBlockTrailerMagic);
  put_u32(out, kCodecZstd);
  put_u32(out, static_cast<uint32_t>(level));
  put_u64(out, block_bytes);
  put_u64(out, blocks.size());
  put_u64(out, rows);
  put_u64(out, xxh3(out.data() + at, out.size() - at));
}

// What is wrong with block b ("" when nothing): its checksum, then its frame.
std::string check_frame(const uint8_t* object, const BlockIndex& idx, size_t i) {
  const auto& b = idx.blocks[i];
  const uint8_t* frame = object + b.offset;
  const std::string name = "block " + std::to_string(i) + " (rows " + std::to_string(b.first_row) +
                           " to " + std::to_string(b.first_row + b.rows - 1) + ")";
  if (xxh3(frame, b.stored) != b.xxh3) return name + ": checksum mismatch";
  if (ZSTD_findFrameCompressedSize(frame, b.stored) != b.stored)
    return name + ": not one whole zstd frame";
  if (ZSTD_getFrameContentSize(frame, b.stored) != b.rows * idx.layout.row_bytes)
    return name + ": the zstd frame does not state the block's " +
           std::to_string(b.rows * idx.layout.row_bytes) + " bytes";
  return "";
}

std::atomic<uint64_t> decompressed_blocks{0};  // blocks_decompressed()

void decompress(const uint8_t* object, const BlockIndex& idx, size_t i, uint8_t* dst,
                const std::string& where) {
  decompressed_blocks.fetch_add(1, std::memory_order_relaxed);
  const auto& b = idx.blocks[i];
  const uint64_t raw = b.rows * idx.layout.row_bytes;
  std::string bad = check_frame(object, idx, i);
  if (bad.empty()) {
    const size_t got = ZSTD_decompressDCtx(dctx(), dst, raw, object + b.offset, b.stored);
    if (ZSTD_isError(got) || got != raw)
      bad = "block " + std::to_string(i) + ": the zstd frame is corrupt";
  }
  if (!bad.empty()) throw CorruptionError(where + ": " + bad);
}

void read_rows_one_thread(const uint8_t* object, const BlockIndex& idx, uint64_t first,
                          uint64_t count, void* dst, const std::string& where) {
  const uint64_t row_bytes = idx.layout.row_bytes;
  auto* out = static_cast<uint8_t*>(dst);
  thread_local std::string scratch;
  for (size_t i = idx.block_of(first); i < idx.blocks.size(); ++i) {
    const auto& b = idx.blocks[i];
    if (b.first_row >= first + count) break;
    const uint64_t lo = std::max(first, b.first_row);
    const uint64_t hi = std::min(first + count, b.first_row + b.rows);
    uint8_t* to = out + (lo - first) * row_bytes;
    if (lo == b.first_row && hi == b.first_row + b.rows) {
      decompress(object, idx, i, to, where);  // the whole block: straight into place
    } else {
      scratch.resize(b.rows * row_bytes);
      decompress(object, idx, i, reinterpret_cast<uint8_t*>(scratch.data()), where);
      if (row_bytes)  // rows of no bytes: dst may be null
        std::memcpy(to, scratch.data() + (lo - b.first_row) * row_bytes, (hi - lo) * row_bytes);
    }
  }
}

}  // namespace

std::optional<RowLayout> row_layout(const std::vector<int64_t>& shape, uint64_t item_bytes) {
  auto total = shape_bytes(shape.data(), shape.size(), item_bytes);
  if (!total) return std::nullopt;
  if (shape.empty()) return RowLayout{1, *total};
  auto row = shape_bytes(shape.data() + 1, shape.size() - 1, item_bytes);
  if (!row) return std::nullopt;  // [0, 2^62, 2^62]: no bytes, yet rows past 64 bits
  return RowLayout{static_cast<uint64_t>(shape[0]), *row};
}

size_t BlockIndex::block_of(uint64_t row) const {
  auto it = std::upper_bound(blocks.begin(), blocks.end(), row,
                             [](uint64_t r, const Block& b) { return r < b.first_row; });
  return static_cast<size_t>(it - blocks.begin()) - 1;
}

}  // namespace tdstore::storage

namespace tdstore {

std::string Compression::text() const {
  if (!enabled()) return "none";
  return "zstd:" + std::to_string(level) + ":" + std::to_string(block_bytes);
}

Compression Compression::parse(std::string_view text) {
  auto refuse = [&] {
    return ArgumentError("compression \"" + std::string(text) +
                         "\" is not none, zstd, zstd:LEVEL or zstd:LEVEL:BLOCK_BYTES");
  };
  if (text == "none") return Compression::none();
  if (text.substr(0, 4) != "zstd") throw refuse();
  // Up to two numbers after "zstd", each after a ':': the level, then the block size.
  std::vector<int64_t> numbers;
  for (std::string_view rest = text.substr(4); !rest.empty();) {
    if (rest[0] != ':' || numbers.size() == 2) throw refuse();
    rest.remove_prefix(1);
    const size_t end = std::min(rest.find(':'), rest.size());
    int64_t v = 0;
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + end, v);
    if (ec != std::errc() || p != rest.data() + end || end == 0) throw refuse();
    numbers.push_back(v);
    rest.remove_prefix(end);
  }
  Compression c = Compression::zstd();
  if (numbers.size() > 0) {
    if (numbers[0] < INT32_MIN || numbers[0] > INT32_MAX) throw refuse();
    c.level = static_cast<int>(numbers[0]);
  }
  if (numbers.size() > 1) c.block_bytes = numbers[1];
  storage::check_compression(c, "compression \"" + std::string(text) + "\"");
  return c;
}

}  // namespace tdstore

namespace tdstore::storage {

void check_compression(const Compression& c, const std::string& where) {
  if (c.codec != Compression::Codec::Zstd)
    throw ArgumentError(where + ": compression codec " + std::to_string(static_cast<int>(c.codec)) +
                        " is not zstd");
  if (c.level < kMinLevel || c.level > kMaxLevel)
    throw ArgumentError(where + ": zstd level " + std::to_string(c.level) + " is not in [" +
                        std::to_string(kMinLevel) + ", " + std::to_string(kMaxLevel) + "]");
  if (c.block_bytes < kMinBlockBytes || c.block_bytes > kMaxBlockBytes)
    throw ArgumentError(where + ": block_bytes " + std::to_string(c.block_bytes) +
                        " is not in [4 KiB, 1 GiB]");
}

namespace {

// Appends to out the frames of `rows` rows of src, from its row src_row on, numbered from
// first_row, and their entries to blocks (offsets from base, where out's bytes will start).
// The cores take the blocks one at a time, in order (an atomic counter: none idles while a
// block is left), each compressing into a buffer of its own; the frames are then listed in
// block order. The bytes do not depend on the number of threads.
void encode_blocks(const RowSource& src, uint64_t src_row, uint64_t rows, uint64_t first_row,
                   uint64_t row_bytes, uint64_t block_bytes, int level, uint64_t base,
                   EncodedRows& out, std::vector<BlockIndex::Block>& blocks,
                   const std::string& where) {
  const uint64_t per = rows_per_block(row_bytes, block_bytes);
  const uint64_t nblocks = rows ? (rows - 1) / std::min(per, rows) + 1 : 0;
  const uint64_t threads = std::min<uint64_t>(parallelism(), nblocks / 2 + 1);
  struct Made {
    size_t thread = 0;
    BlockIndex::Block block;  // offset: where the frame starts in its thread's buffer
  };
  std::vector<Made> made(nblocks);
  std::vector<std::string> buffers(threads);
  std::vector<std::exception_ptr> errors(threads);
  std::atomic<uint64_t> next{0};
  auto encode = [&](uint64_t t) {
    try {
      // Room for the worst case of a fair share (rounded up) and a quarter more: over all
      // threads, at most 1.25 times the key's zstd bound and a block each. Untouched pages cost
      // nothing; a thread that takes more grows its buffer. Those written are huge pages where
      // the kernel has them (a 4 KiB page fault costs more than compressing it).
      const uint64_t fair = (nblocks + threads - 1) / threads;
      const uint64_t share = fair + fair / 4;
      buffers[t].reserve(ZSTD_compressBound(std::min(share * per, rows) * row_bytes));
      writable_in_huge_pages(buffers[t]);
      FrameBuffers scratch;  // freed when the frames are made
      for (uint64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < nblocks;) {
        const uint64_t r = i * per, n = std::min(per, rows - r);
        const uint8_t* from = rows_at(src, (src_row + r) * row_bytes, n * row_bytes, scratch);
        made[i] = {t, add_frame(buffers[t], 0, from, n * row_bytes, level, first_row + r, n,
                                scratch, where)};
      }
    } catch (...) {
      errors[t] = std::current_exception();
      next.store(nblocks);  // the others stop at their next block
    }
  };
  std::vector<std::thread> pool;
  for (uint64_t t = 1; t < threads; ++t) pool.emplace_back(encode, t);
  if (threads) encode(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  const size_t first_buffer = out.buffers.size();
  for (auto& b : buffers) out.buffers.push_back(std::move(b));
  blocks.reserve(blocks.size() + nblocks);
  for (const Made& m : made) {
    const uint64_t at = m.block.offset, n = m.block.stored;
    auto& last = out.spans;
    if (!last.empty() && last.back().buffer == first_buffer + m.thread &&
        last.back().at + last.back().n == at)
      last.back().n += n;  // the frame before it in the same buffer: one piece
    else
      last.push_back({first_buffer + m.thread, at, n});
    BlockIndex::Block b = m.block;
    b.offset = base;
    base += n;
    blocks.push_back(b);
  }
}

}  // namespace

std::vector<std::string_view> EncodedRows::pieces() const {
  std::vector<std::string_view> out;
  out.reserve(spans.size());
  for (const Span& p : spans) out.emplace_back(buffers[p.buffer].data() + p.at, p.n);
  return out;
}

void EncodedRows::add(std::string bytes) {
  spans.push_back({buffers.size(), 0, bytes.size()});
  buffers.push_back(std::move(bytes));
}

uint64_t EncodedRows::size() const {
  uint64_t n = 0;
  for (const Span& p : spans) n += p.n;
  return n;
}

std::string EncodedRows::join() const {
  std::string out;
  out.reserve(size());
  for (std::string_view p : pieces()) out += p;
  return out;
}

EncodedRows compress_rows(const RowSource& src, RowLayout layout, const Compression& c,
                          const std::string& where) {
  EncodedRows out;
  std::vector<BlockIndex::Block> blocks;
  encode_blocks(src, 0, layout.rows, 0, layout.row_bytes, static_cast<uint64_t>(c.block_bytes),
                c.level, 0, out, blocks, where);
  std::string index;
  add_index(index, blocks, layout.rows, c.level, static_cast<uint64_t>(c.block_bytes));
  out.add(std::move(index));
  return out;
}

EncodedRows append_rows(const uint8_t* object, uint64_t stored, const BlockIndex& idx,
                        const RowSource& src, uint64_t rows, const std::string& where) {
  EncodedRows out;
  if (rows == 0) return out;  // the stored bytes already say it all
  const uint64_t row_bytes = idx.layout.row_bytes;
  const uint64_t per = rows_per_block(row_bytes, idx.block_bytes);
  std::vector<BlockIndex::Block> blocks = idx.blocks;
  uint64_t next_row = idx.layout.rows, taken = 0;  // rows of src in blocks already
  if (!blocks.empty() && blocks.back().rows < per) {
    // The last block is short: it is written again with as many new rows as fill it.
    const BlockIndex::Block last = blocks.back();
    taken = std::min(per - last.rows, rows);
    std::string raw((last.rows + taken) * row_bytes, '\0');
    decompress(object, idx, blocks.size() - 1, reinterpret_cast<uint8_t*>(raw.data()), where);
    FrameBuffers buffers;
    if (taken)
      std::memcpy(raw.data() + last.rows * row_bytes, rows_at(src, 0, taken * row_bytes, buffers),
                  taken * row_bytes);
    blocks.pop_back();
    std::string frame;
    blocks.push_back(add_frame(frame, stored, raw.data(), raw.size(), idx.level, last.first_row,
                               last.rows + taken, buffers, where));
    out.add(std::move(frame));
    next_row += taken;
  }
  encode_blocks(src, taken, rows - taken, next_row, row_bytes, idx.block_bytes, idx.level,
                stored + out.size(), out, blocks, where);
  std::string index;
  add_index(index, blocks, idx.layout.rows + rows, idx.level, idx.block_bytes);
  out.add(std::move(index));
  return out;
}

BlockIndex read_index(const uint8_t* object, uint64_t stored, RowLayout layout,
                      const std::string& where) {
  auto bad = [&](const std::string& what) -> CorruptionError {
    return CorruptionError(where + ": block index: " + what);
  };
  if (stored < kBlockTrailerBytes) throw bad(std::to_string(stored) + " bytes hold no trailer");
  const uint8_t* t = object + stored - kBlockTrailerBytes;
  if (std::memcmp(t, kBlockTrailerMagic, sizeof kBlockTrailerMagic) != 0)
    throw bad("no trailer magic");
  if (get_u32(t + 8) != kCodecZstd)
    throw bad("codec " + std::to_string(get_u32(t + 8)) + " is not zstd");
  BlockIndex idx;
  idx.layout = layout;
  idx.level = static_cast<int32_t>(get_u32(t + 12));
  idx.block_bytes = get_u64(t + 16);
  const uint64_t count = get_u64(t + 24);
  if ((stored - kBlockTrailerBytes) / kBlockEntryBytes < count)
    throw bad(std::to_string(count) + " blocks do not fit in " + std::to_string(stored) + " bytes");
  idx.index_offset = stored - kBlockTrailerBytes - count * kBlockEntryBytes;
  const uint8_t* e = object + idx.index_offset;
  if (xxh3(e, count * kBlockEntryBytes + kBlockTrailerBytes - 8) != get_u64(t + 40))
    throw bad("checksum mismatch");
  if (get_u64(t + 32) != layout.rows)
    throw bad("holds " + std::to_string(get_u64(t + 32)) + " rows, the shape " +
              std::to_string(layout.rows));
  if (idx.level < kMinLevel || idx.level > kMaxLevel)
    throw bad("zstd level " + std::to_string(idx.level) + " is not in [1, 19]");
  if (idx.block_bytes < static_cast<uint64_t>(kMinBlockBytes) ||
      idx.block_bytes > static_cast<uint64_t>(kMaxBlockBytes))
    throw bad("block size " + std::to_string(idx.block_bytes) + " is not in [4 KiB, 1 GiB]");
  idx.blocks.reserve(static_cast<size_t>(count));
  uint64_t row = 0;
  for (uint64_t i = 0; i < count; ++i, e += kBlockEntryBytes) {
    BlockIndex::Block b{get_u64(e), get_u64(e + 8), row, get_u64(e + 16), get_u64(e + 24)};
    const std::string name = "block " + std::to_string(i);
    if (b.offset > idx.index_offset || idx.index_offset - b.offset < b.stored)
      throw bad(name + " lies outside the bytes before the index");
    if (b.rows == 0 || layout.rows - row < b.rows)
      throw bad(name + ": " + std::to_string(b.rows) + " rows past row " + std::to_string(row) +
                " of " + std::to_string(layout.rows));
    // A zstd block of at most ZSTD_BLOCKSIZE_MAX raw bytes takes at least 3 bytes: a frame
    // claiming more than that is damage, refused before anything is allocated for it.
    uint64_t raw = 0;
    if (__builtin_mul_overflow(b.rows, layout.row_bytes, &raw) ||
        raw > (b.stored / 3 + 1) * uint64_t{ZSTD_BLOCKSIZE_MAX})
      throw bad(name + ": " + std::to_string(b.rows) + " rows cannot come from " +
                std::to_string(b.stored) + " bytes");
    row += b.rows;
    idx.blocks.push_back(b);
  }
  if (row != layout.rows)
    throw bad("the blocks hold " + std::to_string(row) + " rows, the shape " +
              std::to_string(layout.rows));
  return idx;
}

void read_rows(const uint8_t* object, const BlockIndex& idx, uint64_t first, uint64_t count,
               void* dst, const std::string& where, uint64_t max_threads) {
  if (count == 0) return;
  // A read of many whole blocks (a key read whole): the threads take the blocks one at a time,
  // in stored order, so that together they follow the stored bytes front to back as storage
  // delivers them (and share the work evenly).
  const size_t lo = idx.block_of(first), hi = idx.block_of(first + count - 1) + 1;
  const uint64_t threads =
      std::min<uint64_t>(max_threads ? max_threads : parallelism(), (hi - lo) / 4);
  if (threads > 1) {
    std::vector<std::exception_ptr> errors(threads);
    std::atomic<size_t> next{lo};
    auto part = [&](uint64_t t) {
      try {
        for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < hi;) {
          const auto& b = idx.blocks[i];
          const uint64_t from = std::max(first, b.first_row);
          const uint64_t to = std::min(first + count, b.first_row + b.rows);
          read_rows_one_thread(object, idx, from, to - from,
                               static_cast<uint8_t*>(dst) + (from - first) * idx.layout.row_bytes,
                               where);
        }
      } catch (...) {
        errors[t] = std::current_exception();
        next.store(hi);  // the others stop at their next block
      }
    };
    std::vector<std::thread> pool;
    for (uint64_t t = 1; t < threads; ++t) pool.emplace_back(part, t);
    part(0);
    for (auto& th : pool) th.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    return;
  }
  read_rows_one_thread(object, idx, first, count, dst, where);
}

uint64_t blocks_decompressed() { return decompressed_blocks.load(std::memory_order_relaxed); }

std::pair<uint64_t, uint64_t> frames_of(const BlockIndex& idx, uint64_t first, uint64_t count) {
  const auto& a = idx.blocks[idx.block_of(first)];
  const auto& z = idx.blocks[idx.block_of(first + count - 1)];
  return {a.offset, z.offset + z.stored};
}

std::vector<std::pair<uint64_t, uint64_t>> block_runs(const BlockIndex& idx,
                                                      const std::vector<uint64_t>& rows) {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  size_t last = SIZE_MAX;  // the block of the run's end
  for (uint64_t r : rows) {
    if (last != SIZE_MAX && r < idx.blocks[last].first_row + idx.blocks[last].rows) continue;
    const size_t i = idx.block_of(r);
    const auto& b = idx.blocks[i];
    if (last != SIZE_MAX && i == last + 1)
      runs.back().second += b.rows;
    else
      runs.emplace_back(b.first_row, b.rows);
    last = i;
  }
  return runs;
}

std::string check_frames(const uint8_t* object, const BlockIndex& idx) {
  for (size_t i = 0; i < idx.blocks.size(); ++i)
    if (std::string bad = check_frame(object, idx, i); !bad.empty()) return bad;
  return "";
}

std::string check_blocks(const uint8_t* object, const BlockIndex& idx) {
  std::string scratch;
  for (size_t i = 0; i < idx.blocks.size(); ++i) {
    scratch.resize(idx.blocks[i].rows * idx.layout.row_bytes);
    try {
      decompress(object, idx, i, reinterpret_cast<uint8_t*>(scratch.data()), "");
    } catch (const CorruptionError& e) {
      return std::string(e.what()).substr(2);  // without the empty where's ": "
    }
  }
  return "";
}

}  // namespace tdstore::storage
