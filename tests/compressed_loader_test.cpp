// The Loader over compressed keys (src/loader_windows.h: a quasi-random epoch decompresses each
// window's blocks in the loader's threads; other orders read a compressed key whole), checked
// against the same epoch over raw keys: random stores (dicts and datasets of shards, keys
// compressed or not, appended in parts) and random loader options, every batch compared. A
// failure prints the case that failed. TDSTORE_FUZZ_SECONDS runs more cases.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

#include "storage/compressed.h"
#include "storage/store.h"
#include "tdstore/tdstore.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace compressed_loader_test {

using testing::TempDir;

// One random case: the data, how it is stored, how it is loaded.
struct Case {
  uint64_t seed = 0;
  int64_t rows = 0;
  std::vector<int64_t> split;  // a dataset's rows per shard; empty: one dict
  int64_t appends = 1;         // each shard's (or the dict's) rows come in this many appends
  int64_t width = 1;           // x's row: float32 [width]
  int64_t block_bytes = 4096;  // the compressed blocks' raw bytes
  bool compress_y = true;      // y (int64) compressed too, or left raw beside x
  LoaderOptions lo;
  std::string text() const {
    std::ostringstream o;
    o << "seed " << seed << " rows " << rows << " split [";
    for (int64_t s : split) o << s << ",";
    o << "] appends " << appends << " width " << width << " block_bytes " << block_bytes
      << " compress_y " << compress_y << " | order " << static_cast<int>(lo.order) << " batch "
      << lo.batch_size << " loader block_bytes " << lo.block_bytes << " memory_budget "
      << lo.memory_budget << " workers " << lo.num_workers << " drop_last " << lo.drop_last
      << " rank " << lo.rank << "/" << lo.world_size;
    return o.str();
  }
};

Case random_case(uint64_t seed) {
  std::mt19937_64 g(seed);
  auto pick = [&](std::initializer_list<int64_t> v) { return v.begin()[g() % v.size()]; };
  Case c;
  c.seed = seed;
  c.rows = pick({1, 2, 97, 600, 2500});
  if (g() % 2) {
    const int64_t shards = 1 + static_cast<int64_t>(g() % 3);
    int64_t left = c.rows;
    for (int64_t s = 0; s < shards; ++s) {
      const int64_t r = s + 1 == shards ? left : static_cast<int64_t>(g() % (left + 1));
      c.split.push_back(r), left -= r;
    }
  }
  c.appends = pick({1, 1, 3});
  c.width = pick({1, 3, 17});
  c.block_bytes = pick({4096, 8192, 65536});
  c.compress_y = g() % 2;
  c.lo.order = static_cast<LoaderOrder>(pick({static_cast<int64_t>(LoaderOrder::QuasiRandom),
                                              static_cast<int64_t>(LoaderOrder::QuasiRandom),
                                              static_cast<int64_t>(LoaderOrder::Random),
                                              static_cast<int64_t>(LoaderOrder::Sequential)}));
  c.lo.batch_size = pick({1, 7, 64, 500});
  c.lo.block_bytes = pick({200, 4096, int64_t{8} << 20});
  c.lo.memory_budget = pick({8192, 100000, int64_t{1} << 30});  // the smaller: windows past memory
  c.lo.num_workers = static_cast<int>(pick({0, 1, 3}));
  c.lo.drop_last = g() % 4 == 0;
  c.lo.world_size = pick({1, 1, 2});
  c.lo.rank = static_cast<int64_t>(g() % static_cast<uint64_t>(c.lo.world_size));
  c.lo.seed = g();
  return c;
}

// Rows [from, from + n) of the case's data: x float32 [n, width], y int64 [n].
TensorDict rows_of(const Case& c, int64_t from, int64_t n) {
  TensorDict r({n});
  at::Tensor id = at::arange(from, from + n, at::kLong);
  r.set("x", (id.to(at::kFloat).unsqueeze(1).remainder(13) + at::arange(c.width, at::kFloat))
                 .contiguous());
  r.set("y", id * 7 % 11);
  return r;
}

// Stores rows [from, from + n) into td (whose default compression is x's) in c.appends appends;
// y is rewritten raw after the first when the case leaves y raw.
void fill(const Case& c, TensorDict& td, int64_t from, int64_t n) {
  for (int64_t a = 0; a < c.appends; ++a) {
    const int64_t lo = from + n * a / c.appends, hi = from + n * (a + 1) / c.appends;
    if (lo == hi) continue;
    const bool first = !td.contains("y");
    td.append(rows_of(c, lo, hi - lo));
    if (first && !c.compress_y) td.set("y", td.get("y"), Compression::none());
    td.commit();
  }
}

// Changes one byte in the middle of block b's frame of key (of that layout) in the arena file.
void damage_block(const std::filesystem::path& dir, const std::string& key, size_t b,
                  storage::RowLayout layout) {
  uint64_t at = 0;
  {
    auto store = storage::Store::open(dir, OpenMode::ReadOnly, {});
    const auto e = *store->find(key);
    const auto v = store->view(e);
    const auto idx =
        storage::read_index(static_cast<const uint8_t*>(v.data), e.nbytes, layout, key);
    at = e.offset + idx.blocks[b].offset + idx.blocks[b].stored / 2;
  }
  std::FILE* f = std::fopen((dir / "arena.tda").c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, static_cast<long>(at), SEEK_SET);
  const int byte = std::fgetc(f);
  std::fseek(f, static_cast<long>(at), SEEK_SET);
  std::fputc(byte ^ 0xff, f);
  std::fclose(f);
}

// A store whose key "x" (float32 [4000, 4]: row r holds 4r .. 4r + 3) is compressed in blocks of
// 256 rows, block 1 (rows 256 to 511) damaged.
void store_with_block_1_damaged(const std::filesystem::path& dir) {
  {
    auto td = TensorDict::create(dir, {4000});
    td.set("x", at::arange(4000 * 4, at::kFloat).reshape({4000, 4}), Compression::zstd(1, 4096));
    td.commit();
  }
  damage_block(dir, "x", 1, {4000, 16});
}

std::vector<TensorDict> epoch(const Case& c, const std::filesystem::path& dir) {
  auto run = [&](auto source) {
    Loader l(source, c.lo);
    l.set_epoch(2);
    std::vector<TensorDict> out;
    for (TensorDict b : l) out.push_back(b);
    return out;
  };
  if (c.split.empty()) return run(TensorDict::open(dir));
  return run(Dataset::open(dir));
}

void make(const Case& c, const std::filesystem::path& dir, bool zstd) {
  StoreOptions o;
  o.compression = zstd ? Compression::zstd(1, c.block_bytes) : Compression::none();
  if (c.split.empty()) {
    auto td = TensorDict::create(dir, {0}, o);
    fill(c, td, 0, c.rows);
    return;
  }
  Dataset ds = Dataset::create(dir);
  int64_t at = 0;
  for (size_t s = 0; s < c.split.size(); ++s) {
    TensorDict shard = ds.shard(static_cast<int64_t>(s), o);
    fill(c, shard, at, c.split[s]);
    at += c.split[s];
  }
  ds.publish();
}

// "" when the epochs over raw and compressed copies agree, else what differs.
std::string check(const Case& c) {
  TempDir t;
  make(c, t / "raw", false);
  make(c, t / "zstd", true);
  auto a = epoch(c, t / "raw"), b = epoch(c, t / "zstd");
  if (a.size() != b.size())
    return std::to_string(b.size()) + " batches against " + std::to_string(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* k : {"x", "y"})
      if (!at::equal(a[i].get(k), b[i].get(k)))
        return "batch " + std::to_string(i) + " key " + k + " differs";
  return "";
}

TEST(CompressedLoader, EveryEpochOverCompressedKeysIsTheEpochOverRawKeys) {
  const char* env = std::getenv("TDSTORE_FUZZ_SECONDS");
  const double seconds = env ? std::atof(env) : 0;
  const auto start = std::chrono::steady_clock::now();
  int cases = 0;
  for (uint64_t seed = 1;; ++seed) {
    const double spent =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seed > 40 && spent >= seconds) break;  // 40 cases always; more on demand
    const Case c = random_case(seed);
    std::string bad;
    try {
      bad = check(c);
    } catch (const std::exception& e) {
      bad = std::string("threw: ") + e.what();
    }
    ASSERT_EQ(bad, "") << "case: " << c.text();
    ++cases;
  }
  std::printf("%d cases\n", cases);
}

// Row reads (index by an int, a tensor of ints of any shape, a mask; slices with steps) of a
// compressed key, nested or not, give what the same reads of a raw copy give.
TEST(CompressedLoader, RowReadsOfCompressedKeysAreThoseOfRawKeys) {
  TempDir t;
  const int64_t n = 3000;
  at::Tensor x = at::randn({n, 5}), y = at::arange(n).remainder(9);
  for (bool zstd : {false, true}) {
    auto td = TensorDict::create(t / (zstd ? "z" : "r"), {n});
    const auto c = zstd ? Compression::zstd(1, 4096) : Compression::none();
    td.set("x", x, c);
    td.set("sub/y", y, c);
    td.commit();
  }
  auto raw = TensorDict::open(t / "r"), z = TensorDict::open(t / "z");
  auto same = [](const TensorDict& a, const TensorDict& b) {
    if (a.keys() != b.keys() || a.batch_size() != b.batch_size()) return false;
    for (const auto& k : a.keys())
      if (a.get(k).sizes() != b.get(k).sizes() || !at::equal(a.get(k), b.get(k))) return false;
    return true;
  };
  std::mt19937_64 g(7);
  for (int i = 0; i < 60; ++i) {
    const int64_t m = static_cast<int64_t>(g() % 40);
    at::Tensor idx = at::randint(-n, n, {m}, at::kLong);
    EXPECT_TRUE(same(z.index(idx), raw.index(idx))) << "index " << i;
    at::Tensor two = at::randint(0, n, {2, m / 2}, at::kLong);
    EXPECT_TRUE(same(z.index(two), raw.index(two))) << "2-d index " << i;
    at::Tensor mask = at::randint(0, 2, {n}, at::kLong).to(at::kBool);
    EXPECT_TRUE(same(z.index(mask), raw.index(mask))) << "mask " << i;
    const int64_t a = static_cast<int64_t>(g() % n) - n / 2, b = static_cast<int64_t>(g() % n),
                  step = 1 + static_cast<int64_t>(g() % 700);
    EXPECT_TRUE(same(z.slice(a, b, step), raw.slice(a, b, step))) << "slice " << a << ":" << b;
    const int64_t row = static_cast<int64_t>(g() % (2 * n)) - n;
    EXPECT_TRUE(same(z.index(row), raw.index(row))) << "row " << row;
    EXPECT_TRUE(same(z.sub("sub").index(idx), raw.sub("sub").index(idx)));
  }
}

// A row read decompresses only the blocks holding its rows: with block 1 damaged, rows of the
// other blocks still read, and a read touching block 1 is a CorruptionError naming it.
TEST(CompressedLoader, RowReadsTouchOnlyTheirBlocks) {
  TempDir t;
  store_with_block_1_damaged(t / "s");
  auto td = TensorDict::open(t / "s");
  EXPECT_EQ(td.index(3).get("x")[0].item<float>(), 12.0f);
  EXPECT_EQ(td.index(at::tensor({0, 600, 3999}, at::kLong)).get("x")[2][0].item<float>(),
            3999.0f * 4);
  EXPECT_EQ(td.slice(512, 700).get("x").size(0), 188);
  EXPECT_THROW(td.index(300), CorruptionError);
  EXPECT_THROW(td.slice(0, 4000, 100), CorruptionError);
  EXPECT_THROW(td.get("x"), CorruptionError);
}

// The printout gives a stored key's dtype and shape from its entry: a compressed key is not
// decompressed (a damaged one prints too), and says it is compressed.
TEST(CompressedLoader, ThePrintoutReadsNoCompressedBlock) {
  TempDir t;
  store_with_block_1_damaged(t / "s");
  const std::string s = TensorDict::open(t / "s").to_string();
  EXPECT_NE(s.find("\n  x: float32 [4000, 4] (compressed)"), std::string::npos) << s;
}

// The packed path itself (a quasi-random epoch, windows smaller than the data): a damaged block
// is a CorruptionError naming the key and the block, raised to the consumer.
TEST(CompressedLoader, ADamagedBlockIsACorruptionErrorNamingKeyAndBlock) {
  TempDir t;
  store_with_block_1_damaged(t / "s");
  LoaderOptions lo;
  lo.order = LoaderOrder::QuasiRandom;
  lo.batch_size = 100;
  lo.memory_budget = 64 << 10;
  Loader l(TensorDict::open(t / "s"), lo);
  try {
    for (TensorDict b : l) (void)b;
    FAIL() << "the damaged block was read without an error";
  } catch (const CorruptionError& e) {
    EXPECT_NE(std::string(e.what()).find("key 'x': block 1 (rows 256 to 511): checksum mismatch"),
              std::string::npos)
        << e.what();
  }
}

// Past the memory budget a quasi-random epoch decompresses each compressed block once: a key's
// compressed blocks and the plan's blocks are powers of two of rows from row 0, so each
// compressed block lies in one plan block, which one window reads. Keys of three widths (their
// compressed blocks of 32, 8 and 64 rows; the plan's of 64), and the batches those of a raw
// copy. Under the earlier rules (compressed blocks of 40, 10 and 64 rows, the plan's of 70)
// this epoch decompressed 827 blocks of 704, 1.17 times each.
TEST(CompressedLoader, AnEpochPastTheBudgetDecompressesEachBlockOnce) {
  TempDir t;
  const int64_t rows = 5000;
  const auto c = Compression::zstd(3, 4096);
  const at::Tensor a = at::randint(0, 7, {rows, 100}, at::kByte),
                   b = at::randn({rows, 100}),                 // 400 bytes a row
      l = at::arange(rows * 8, at::kLong).reshape({rows, 8});  // 64 bytes
  {
    auto td = TensorDict::create(t / "z", {rows});
    td.set("a", a, c);
    td.set("b", b, c);
    td.set("l", l, c);
    td.commit();
    auto raw = TensorDict::create(t / "r", {rows});
    raw.set("a", a);
    raw.set("b", b);
    raw.set("l", l);
    raw.commit();
  }
  int64_t blocks = 0;
  for (int64_t per : {32, 8, 64}) blocks += (rows + per - 1) / per;
  LoaderOptions lo;
  lo.order = LoaderOrder::QuasiRandom;
  lo.batch_size = 100;
  lo.block_bytes = 40000;  // 564 bytes a row: 70 rows, so blocks of 64
  lo.memory_budget = 64 << 10;
  lo.seed = 7;
  Loader z(TensorDict::open(t / "z"), lo), r(TensorDict::open(t / "r"), lo);
  for (int epoch = 0; epoch < 2; ++epoch) {
    const uint64_t before = storage::blocks_decompressed();
    auto mine = z.begin();
    auto theirs = r.begin();
    int64_t seen = 0;
    for (; mine != z.end(); ++mine, ++theirs) {
      ASSERT_NE(theirs, r.end());
      for (const char* k : {"a", "b", "l"})
        ASSERT_TRUE(at::equal((*mine).get(k), (*theirs).get(k))) << k << " at row " << seen;
      seen += (*mine).batch_size()[0];
    }
    EXPECT_EQ(seen, rows);
    EXPECT_EQ(storage::blocks_decompressed() - before, static_cast<uint64_t>(blocks))
        << "epoch " << epoch << ": every compressed block decompressed exactly once";
  }
}

}  // namespace compressed_loader_test
}  // namespace tdstore
