// Compressed keys: the block codec (storage/compressed.h) and the Store's compressed reads,
// appends, verification and format marking (docs/FORMAT.md, "Compressed keys").
#include "storage/compressed.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "storage/checksum.h"
#include "storage/compact.h"
#include "storage/store.h"
#include "tdstore/admin.h"
#include "tdstore/errors.h"
#include "tests/temp_dir.h"

namespace tdstore::storage {
namespace compressed_test {

using testing::TempDir;

// stmt throws `type` whose message contains `text`.
#define EXPECT_THROW_MSG(stmt, type, text)                                        \
  do {                                                                            \
    try {                                                                         \
      stmt;                                                                       \
      ADD_FAILURE() << #stmt " threw nothing";                                    \
    } catch (const type& e) {                                                     \
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what(); \
    }                                                                             \
  } while (0)

// Rows that compress somewhat: a ramp with noise, seeded.
std::string rows_of(RowLayout l, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(l.rows * l.row_bytes, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i / 64 + (rng() % 4));
  return s;
}

RowSource in_memory(const void* src) { return {static_cast<const uint8_t*>(src), {}}; }

// The rows at src as a RowSource reading them (as a file is read), counting the bytes read
// (read is called on several threads at once).
RowSource reading(const void* src, std::atomic<uint64_t>* bytes_read) {
  return {nullptr, [=](uint64_t at, uint64_t n, void* dst) {
            std::memcpy(dst, static_cast<const uint8_t*>(src) + at, n);
            *bytes_read += n;
          }};
}

// The stored bytes compress_rows makes: its pieces, joined.
std::string encode(const void* src, RowLayout l, const Compression& c) {
  return compress_rows(in_memory(src), l, c).join();
}

const uint8_t* bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

std::string read_all(const std::string& stored, RowLayout l) {
  auto idx = read_index(bytes(stored), stored.size(), l, "t");
  std::string out(l.rows * l.row_bytes, '\0');
  read_rows(bytes(stored), idx, 0, l.rows, out.data(), "t");
  return out;
}

TEST(Compressed, RowsRoundTripInBlocksOfWholeRows) {
  const auto c = Compression::zstd(3, 4096);
  for (RowLayout l : {RowLayout{0, 12}, RowLayout{1, 12}, RowLayout{1000, 12}, RowLayout{7, 5000},
                      RowLayout{33, 0}, RowLayout{4096, 1}}) {
    SCOPED_TRACE(std::to_string(l.rows) + " rows of " + std::to_string(l.row_bytes));
    const std::string raw = rows_of(l, 1), stored = encode(raw.data(), l, c);
    EXPECT_EQ(read_all(stored, l), raw);
    auto idx = read_index(bytes(stored), stored.size(), l, "t");
    uint64_t next = 0;
    for (const auto& b : idx.blocks) {
      EXPECT_EQ(b.first_row, next);
      EXPECT_GE(b.rows, 1u);
      // Whole rows, at most a block's worth unless one row is larger.
      if (l.row_bytes) {
        EXPECT_LE(b.rows * l.row_bytes, std::max<uint64_t>(4096, l.row_bytes));
      }
      next += b.rows;
    }
    EXPECT_EQ(next, l.rows);
    // Any range reads what the whole read gave.
    std::mt19937 rng(2);
    for (int i = 0; i < 20 && l.rows; ++i) {
      uint64_t first = rng() % l.rows, count = rng() % (l.rows - first + 1);
      std::string part(count * l.row_bytes, '\0');
      read_rows(bytes(stored), idx, first, count, part.data(), "t");
      EXPECT_EQ(part, raw.substr(first * l.row_bytes, count * l.row_bytes));
    }
  }
}

// Rows read through a RowSource's read (as a file is, block by block on the compressing
// threads) give the same stored bytes as the rows in memory, for a key and an append to it,
// each byte read once.
TEST(Compressed, RowsReadBlockByBlockEncodeAsRowsInMemory) {
  const RowLayout l{5000, 24}, more{1234, 24};
  const std::string raw = rows_of(l, 11), extra = rows_of(more, 12);
  const auto c = Compression::zstd(3, 4096);
  std::atomic<uint64_t> read = 0;
  const std::string stored = compress_rows(reading(raw.data(), &read), l, c).join();
  EXPECT_EQ(stored, encode(raw.data(), l, c));
  EXPECT_EQ(read, raw.size());
  const auto idx = read_index(bytes(stored), stored.size(), l, "t");
  read = 0;
  const auto tail_of = [&](const RowSource& src) {
    return append_rows(bytes(stored), stored.size(), idx, src, more.rows, "t").join();
  };
  const std::string tail = tail_of(reading(extra.data(), &read));
  EXPECT_EQ(tail, tail_of(in_memory(extra.data())));
  EXPECT_EQ(read, extra.size());
  EXPECT_EQ(read_all(stored + tail, {l.rows + more.rows, 24}), raw + extra);
}

// The cores take the blocks one at a time, whichever is free first: however the blocks fall to
// the threads (reads made slow at random, so that they fall differently from run to run), the
// stored bytes are those of the rows in memory, the frames one after another in block order.
TEST(Compressed, TheBytesDoNotDependOnWhichThreadCompressedWhichBlock) {
  const RowLayout l{3000, 40};  // 64 rows a block: 47 blocks
  const std::string raw = rows_of(l, 13);
  const auto c = Compression::zstd(1, 4096);
  const std::string expected = encode(raw.data(), l, c);
  const auto idx = read_index(bytes(expected), expected.size(), l, "t");
  ASSERT_EQ(idx.blocks.size(), 47u);
  uint64_t end = 0;
  for (const auto& b : idx.blocks) {
    EXPECT_EQ(b.offset, end);
    end = b.offset + b.stored;
  }
  EXPECT_EQ(end, expected.size() - 47 * kBlockEntryBytes - kBlockTrailerBytes);
  for (uint32_t run = 0; run < 6; ++run) {
    std::atomic<uint32_t> calls = 0;
    const RowSource slow{nullptr, [&](uint64_t at, uint64_t n, void* dst) {
                           const uint32_t k = calls++ * 2654435761u + run;
                           std::this_thread::sleep_for(std::chrono::microseconds(k % 700));
                           std::memcpy(dst, raw.data() + at, n);
                         }};
    const EncodedRows made = compress_rows(slow, l, c);
    EXPECT_EQ(made.join(), expected) << "run " << run;
    EXPECT_LE(made.pieces().size(), idx.blocks.size() + 1);
  }
}

// A read that throws on one thread stops the others at their next block (they do not compress
// the rest of the key first), and the error is what compress_rows throws. Block 0 fails at
// once; every other read takes 1 ms, so the 2000 blocks would take a second on two cores.
TEST(Compressed, AnErrorOnOneThreadStopsTheOthersAndIsThrown) {
  const RowLayout l{2000 * 4096, 1};  // 4096 rows a block: 2000 blocks
  std::atomic<uint64_t> reads = 0;
  const RowSource failing{nullptr, [&](uint64_t at, uint64_t n, void* dst) {
                            ++reads;
                            if (at == 0) throw IOError("block 0 unreadable");
                            std::this_thread::sleep_for(std::chrono::milliseconds(1));
                            std::memset(dst, 7, n);
                          }};
  EXPECT_THROW_MSG(compress_rows(failing, l, Compression::zstd(1, 4096), "t"), IOError,
                   "block 0 unreadable");
  EXPECT_LT(reads, 2000u);
}

// Layouts at the edges of the sharing (no rows, rows of no bytes, one block, rows larger than
// a block, incompressible rows whose frames outgrow their zstd bound's share, many blocks) and
// appends at every kind of split: the frames lie one after another from the first byte in
// block order, the pieces add up to size(), and the bytes read back as the rows.
TEST(Compressed, EdgeLayoutsEncodeAndAppendInBlockOrder) {
  struct Case {
    RowLayout l;
    bool noise;
  };
  for (const Case& k :
       {Case{{0, 40}, false}, Case{{7, 0}, false}, Case{{1, 40}, false}, Case{{64, 64}, false},
        Case{{5, 10000}, true}, Case{{1000, 2049}, true}, Case{{40000, 24}, false}}) {
    const RowLayout l = k.l;
    std::string raw = rows_of(l, 21);
    if (k.noise) {
      std::mt19937_64 rng(5);
      for (char& ch : raw) ch = static_cast<char>(rng());
    }
    const auto c = Compression::zstd(1, 4096);
    const EncodedRows made = compress_rows(in_memory(raw.data()), l, c);
    const std::string stored = made.join();
    EXPECT_EQ(stored.size(), made.size());
    const auto idx = read_index(bytes(stored), stored.size(), l, "t");
    uint64_t end = 0;
    for (const auto& b : idx.blocks) {
      EXPECT_EQ(b.offset, end) << l.rows << "x" << l.row_bytes;
      end = b.offset + b.stored;
    }
    EXPECT_EQ(end, idx.index_offset);
    EXPECT_EQ(read_all(stored, l), raw);
    for (uint64_t split : {uint64_t{0}, uint64_t{1}, l.rows / 3, l.rows / 2 + 1, l.rows}) {
      if (split > l.rows) continue;
      const RowLayout head{split, l.row_bytes};
      const std::string first = encode(raw.data(), head, c);
      const auto head_idx = read_index(bytes(first), first.size(), head, "t");
      const EncodedRows tail =
          append_rows(bytes(first), first.size(), head_idx,
                      in_memory(raw.data() + split * l.row_bytes), l.rows - split, "t");
      const std::string all = first + tail.join();
      EXPECT_EQ(tail.join().size(), tail.size());
      EXPECT_EQ(read_all(all, l), raw) << l.rows << "x" << l.row_bytes << " split " << split;
      EXPECT_EQ(check_frames(bytes(all), read_index(bytes(all), all.size(), l, "t")), "");
    }
  }
}

// A read split among threads (which take the blocks one at a time, in stored order) gives the
// rows a read on one thread gives, for ranges starting and ending inside blocks.
TEST(Compressed, ARangeReadOnSeveralThreadsReadsAsOnOne) {
  const RowLayout l{3000, 24};
  const std::string raw = rows_of(l, 13),
                    stored = encode(raw.data(), l, Compression::zstd(3, 4096));
  const auto idx = read_index(bytes(stored), stored.size(), l, "t");
  for (auto [first, count] :
       {std::pair<uint64_t, uint64_t>{0, 3000}, {5, 2990}, {127, 1000}, {128, 2048}, {1000, 1}}) {
    for (uint64_t threads : {1, 2, 3, 8}) {
      std::string out(count * 24, '\0');
      read_rows(bytes(stored), idx, first, count, out.data(), "t", threads);
      EXPECT_EQ(out, raw.substr(first * 24, count * 24))
          << first << "+" << count << " on " << threads;
    }
  }
}

TEST(Compressed, AppendedRowsReadAsOneWriteAndLeaveTheOlderBytesAlone) {
  const RowLayout all{900, 24};
  const std::string raw = rows_of(all, 3);
  std::string stored = encode(raw.data(), {100, 24}, Compression::zstd(5, 4096));
  for (uint64_t done = 100; done < all.rows;) {
    const uint64_t n = std::min<uint64_t>(all.rows - done, 1 + done % 170);  // short and long
    const std::string before = stored;
    auto idx = read_index(bytes(stored), stored.size(), {done, 24}, "t");
    const RowSource next = in_memory(raw.data() + done * 24);
    stored += append_rows(bytes(stored), stored.size(), idx, next, n, "t").join();
    // The older version's bytes are a prefix, and still read as they did.
    ASSERT_EQ(stored.compare(0, before.size(), before), 0);
    EXPECT_EQ(read_all(before, {done, 24}), raw.substr(0, done * 24));
    done += n;
    EXPECT_EQ(read_all(stored, {done, 24}), raw.substr(0, done * 24));
  }
  // The key's level and block size are kept; short blocks were filled, not multiplied.
  auto idx = read_index(bytes(stored), stored.size(), all, "t");
  EXPECT_EQ(idx.level, 5);
  EXPECT_EQ(idx.block_bytes, 4096u);
  // 4096 / 24 = 170 rows fit a block: 128, the largest power of two, a block
  EXPECT_EQ(idx.blocks.size(), (all.rows + 128 - 1) / 128);
  for (size_t i = 0; i + 1 < idx.blocks.size(); ++i) EXPECT_EQ(idx.blocks[i].rows, 128u) << i;
}

TEST(Compressed, ADamagedBlockNamesItselfAndSparesTheOthers) {
  const RowLayout l{600, 32};
  const std::string raw = rows_of(l, 4);
  std::string stored = encode(raw.data(), l, Compression::zstd(3, 4096));
  auto idx = read_index(bytes(stored), stored.size(), l, "t");
  ASSERT_GE(idx.blocks.size(), 3u);
  stored[idx.blocks[1].offset + idx.blocks[1].stored / 2] ^= 0x40;
  std::string out(l.row_bytes * idx.blocks[1].rows, '\0');
  EXPECT_THROW_MSG(read_rows(bytes(stored), idx, idx.blocks[1].first_row, 1, out.data(), "k"),
                   CorruptionError, "k: block 1 (rows 128 to 255): checksum mismatch");
  read_rows(bytes(stored), idx, 0, idx.blocks[0].rows, out.data(), "k");  // block 0 is intact
  EXPECT_EQ(out.substr(0, idx.blocks[0].rows * 32), raw.substr(0, idx.blocks[0].rows * 32));
  EXPECT_NE(check_blocks(bytes(stored), idx).find("block 1"), std::string::npos);
  EXPECT_EQ(check_frames(bytes(stored), idx), "block 1 (rows 128 to 255): checksum mismatch");
  stored[idx.blocks[1].offset + idx.blocks[1].stored / 2] ^= 0x40;
  EXPECT_EQ(check_frames(bytes(stored), idx), "");
}

TEST(Compressed, ACraftedIndexIsRefusedBeforeAnythingIsAllocated) {
  const RowLayout l{50, 8};
  const std::string raw = rows_of(l, 5), good = encode(raw.data(), l, Compression::zstd());
  // Another row count than the shape's, a truncated object, a wrong trailer.
  EXPECT_THROW_MSG(read_index(bytes(good), good.size(), {51, 8}, "k"), CorruptionError,
                   "k: block index: holds 50 rows, the shape 51");
  EXPECT_THROW(read_index(bytes(good), 10, l, "k"), CorruptionError);
  std::string bad = good;
  bad[bad.size() - 48] = 'X';
  EXPECT_THROW_MSG(read_index(bytes(bad), bad.size(), l, "k"), CorruptionError, "no trailer magic");
  // A consistent index (checksum recomputed) claiming 2^40 rows of 8 bytes from a small frame.
  auto forge = [&](uint64_t rows_field, uint64_t total_rows) {
    std::string f = good;
    const size_t entry = f.size() - 48 - 32, trailer = f.size() - 48;
    std::memcpy(f.data() + entry + 16, &rows_field, 8);
    std::memcpy(f.data() + trailer + 32, &total_rows, 8);
    uint64_t sum = xxh3(f.data() + entry, 32 + 40);
    std::memcpy(f.data() + trailer + 40, &sum, 8);
    return f;
  };
  const std::string huge = forge(uint64_t{1} << 40, uint64_t{1} << 40);
  EXPECT_THROW_MSG(read_index(bytes(huge), huge.size(), {uint64_t{1} << 40, 8}, "k"),
                   CorruptionError, "rows cannot come from");
  const std::string zero = forge(0, 0);
  EXPECT_THROW_MSG(read_index(bytes(zero), zero.size(), {0, 8}, "k"), CorruptionError,
                   "block 0: 0 rows");
  // Trailer fields out of range: a block size that would make every append rewrite all rows.
  auto field = [&](size_t at, uint64_t value, size_t width) {
    std::string f = good;
    const size_t entry = f.size() - 48 - 32, trailer = f.size() - 48;
    std::memcpy(f.data() + trailer + at, &value, width);
    uint64_t sum = xxh3(f.data() + entry, 32 + 40);
    std::memcpy(f.data() + trailer + 40, &sum, 8);
    return f;
  };
  const std::string level0 = field(12, 0, 4), huge_blocks = field(16, uint64_t{1} << 63, 8);
  EXPECT_THROW_MSG(read_index(bytes(level0), level0.size(), l, "k"), CorruptionError,
                   "zstd level 0 is not in [1, 19]");
  EXPECT_THROW_MSG(read_index(bytes(huge_blocks), huge_blocks.size(), l, "k"), CorruptionError,
                   "block size 9223372036854775808 is not in [4 KiB, 1 GiB]");
}

TEST(Compressed, TheTextUsersWriteParsesOrIsRefused) {
  EXPECT_EQ(Compression::parse("zstd"), Compression::zstd());
  // "zstd" alone is level 1 and 1 MiB blocks, as the docs state (README, docs/CLI.md, the
  // Python docstrings); a store records the text in full, so one made at level 3 stays there.
  EXPECT_EQ(Compression::parse("zstd").text(), "zstd:1:1048576");
  EXPECT_EQ(Compression::parse("zstd:7"), Compression::zstd(7));
  EXPECT_EQ(Compression::parse("zstd:1:65536"), Compression::zstd(1, 65536));
  EXPECT_EQ(Compression::parse("none"), Compression::none());
  for (auto c : {Compression::none(), Compression::zstd(19, 4096)})
    EXPECT_EQ(Compression::parse(c.text()), c);
  for (const char* bad : {"zstd:", "zstd:0", "zstd:20", "zstd:3:100", "zstd:3:1:2", "gzip", "zstdx",
                          "zstd:-1", "zstd:3:99999999999"})
    EXPECT_THROW_MSG(Compression::parse(bad), ArgumentError, bad);
}

StoreOptions options() {
  StoreOptions o;
  o.key_capacity = 16;
  o.arena_reserve = int64_t{1} << 30;
  return o;
}

std::string read_key(const Store& s, const std::string& key) {
  auto e = s.find(key);
  EXPECT_TRUE(e) << key;
  if (!e) return "";
  std::string out(e->raw_nbytes, '\0');
  s.read_rows(key, *e, 0, e->shape.empty() ? 1 : e->shape[0], out.data());
  return out;
}

TEST(CompressedStore, KeysRoundTripAppendVerifyAndMarkTheStoreVersion5) {
  TempDir t;
  const auto dir = t / "s";
  const RowLayout l{3000, 16};
  const std::string raw = rows_of(l, 6);
  {
    auto s = Store::create(dir, {}, options());
    s->put("raw", DType::UInt8, {16}, raw.data(), 16);
    s->commit();
    EXPECT_EQ(s->info().format_version, 4u);  // no compressed key yet: older builds read it
    s->put_compressed("x", DType::Float32, {2000, 4}, raw.data(), 2000 * 16,
                      Compression::zstd(3, 8192));
    s->commit();
    EXPECT_EQ(s->info().format_version, 5u);
    auto e = s->find("x");
    EXPECT_TRUE(e->compressed());
    EXPECT_EQ(e->raw_nbytes, 2000u * 16);
    EXPECT_LT(e->nbytes, e->raw_nbytes);
    const uint64_t before = s->find("x")->nbytes;
    s->append("x", {2000, 4}, nullptr, 0);  // no rows: nothing written
    EXPECT_EQ(s->find("x")->nbytes, before);
    s->append("x", {3000, 4}, raw.data() + 2000 * 16, 1000 * 16);
    s->commit();
    EXPECT_TRUE(s->verify().empty());
    EXPECT_EQ(s->info().live_bytes, s->find("x")->nbytes + 16);  // bytes as stored
  }
  auto r = Store::open(dir, OpenMode::ReadOnly, options());
  EXPECT_EQ(read_key(*r, "x"), raw);
  std::string rows(10 * 16, '\0');
  r->read_rows("x", *r->find("x"), 2995, 5, rows.data());
  EXPECT_EQ(rows.substr(0, 80), raw.substr(2995 * 16, 80));
  EXPECT_THROW(r->read_rows("x", *r->find("x"), 2995, 6, rows.data()), IndexError);
  // Compaction carries the key as it is stored.
  r.reset();
  compact(dir, options());
  auto c = Store::open(dir, OpenMode::ReadOnly, options());
  EXPECT_TRUE(c->find("x")->compressed());
  EXPECT_EQ(read_key(*c, "x"), raw);
  EXPECT_TRUE(c->verify().empty());
}

TEST(CompressedStore, ADamagedBlockFailsVerifyAndTheReadNamesKeyAndBlock) {
  TempDir t;
  const auto dir = t / "s";
  const std::string raw = rows_of({4000, 8}, 7);
  uint64_t at = 0;
  {
    auto s = Store::create(dir, {}, options());
    s->put_compressed("k", DType::Int64, {4000}, raw.data(), raw.size(),
                      Compression::zstd(3, 4096));
    s->commit();
    auto e = s->find("k");
    auto idx = read_index(static_cast<const uint8_t*>(s->view(*e).data), e->nbytes, {4000, 8}, "");
    at = e->offset + idx.blocks[2].offset + 3;
  }
  {
    std::fstream f(dir / "arena.tda", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put('\x5a');
  }
  auto r = Store::open(dir, OpenMode::ReadOnly, options());
  EXPECT_EQ(r->verify(), std::vector<std::string>{"k"});
  std::string out(raw.size(), '\0');
  EXPECT_THROW_MSG(r->read_rows("k", *r->find("k"), 0, 4000, out.data()), CorruptionError,
                   "key 'k': block 2");
  r->read_rows("k", *r->find("k"), 0, 10, out.data());  // block 0 still reads
  EXPECT_EQ(out.substr(0, 80), raw.substr(0, 80));
}

TEST(CompressedStore, BadStoredBytesAndFormat3StoresAreRefused) {
  TempDir t;
  auto s = Store::create(t / "s", {}, options());
  const std::string junk(100, 'j');
  EXPECT_THROW(s->put("k", DType::UInt8, {100}, junk.data(), junk.size(), 0, kSlotCompressed),
               CorruptionError);
  EXPECT_THROW_MSG(
      s->put_compressed("k", DType::UInt8, {100}, junk.data(), junk.size(), Compression::zstd(42)),
      ArgumentError, "zstd level 42 is not in [1, 19]");
  EXPECT_FALSE(s->find("k"));
  StoreOptions o3 = options();
  o3.format_version = 3;
  auto old = Store::create(t / "v3", {}, o3);
  EXPECT_THROW_MSG(
      old->put_compressed("k", DType::UInt8, {100}, junk.data(), junk.size(), Compression::zstd()),
      FormatError, "a format-3 store holds no compressed keys");
}

// A compressed import is exact without decompressing what it stored: each frame was compared
// with its rows as it was made, and the stored frames are checked against the checksums taken
// then. A byte of the arena changed after the last commit (as a torn write would) is a
// CorruptionError naming the key and the block; intact, every row reads back as the source's.
TEST(CompressedStore, AnImportChecksTheFramesItStoredAgainstTheirChecksums) {
  TempDir t;
  const RowLayout l{3000, 40};
  const std::string raw = rows_of(l, 9);
  Array a;
  a.dtype = DType::Int32;
  a.shape = {3000, 10};
  a.data = raw.data();
  a.nbytes = raw.size();
  ImportOptions o;
  o.compression = Compression::zstd(3, 4096);
  o.chunk_bytes = 700 * 40;  // five commits, the last a short one
  const auto r = import_arrays_chunked(t / "good", {{"x", a}}, o);
  EXPECT_EQ(r.verified_bytes, raw.size());
  {
    auto s = Store::open(t / "good", OpenMode::ReadOnly, options());
    std::string out(raw.size(), '\0');
    s->read_rows("x", *s->find("x"), 0, l.rows, out.data());
    EXPECT_EQ(out, raw);
    EXPECT_TRUE(s->verify().empty());
  }
  o.progress = [&](int64_t done, int64_t rows) {
    if (done < rows) return;
    auto s = Store::open(t / "bad", OpenMode::ReadOnly, options());
    const auto e = s->find("x");
    ASSERT_TRUE(e && e->compressed());
    const auto idx = read_index(static_cast<const uint8_t*>(s->view(*e).data), e->nbytes, l, "");
    ASSERT_GE(idx.blocks.size(), 3u);
    std::fstream f(t / "bad" / "arena.tda", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(e->offset + idx.blocks[2].offset + 5));
    const char c = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(e->offset + idx.blocks[2].offset + 5));
    f.put(static_cast<char>(c ^ 0x10));
  };
  EXPECT_THROW_MSG(import_arrays_chunked(t / "bad", {{"x", a}}, o), CorruptionError,
                   "key 'x': block 2 (rows 128 to 191): checksum mismatch after the copy");
}

}  // namespace compressed_test
}  // namespace tdstore::storage
