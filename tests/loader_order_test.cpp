// LoaderOrder::QuasiRandom: every row once per epoch, deterministic from (seed, epoch), shared
// by ranks, resumable, and batches that mix a class-sorted dataset (shuffle quality).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/repeat.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>

#include "tdstore/tdstore.h"
#include "tests/fault_env.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace loader_order_test {

using testing::TempDir;

// n rows of 64 bytes: "id" (int64) and "x" (14 floats), and "label": rows sorted by class,
// 20 classes in runs of equal size, as a dataset cached class by class is.
TensorDict class_sorted(int64_t n) {
  TensorDict td({n});
  td.set("id", at::arange(n, at::kLong));
  td.set("x", at::zeros({n, 14}));
  at::Tensor label = at::zeros({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) label.data_ptr<int64_t>()[i] = i * 20 / n;
  td.set("label", label);
  return td;
}

// About the defaults' ratio (window: half of 1 GiB in 8 MiB blocks), scaled to class_sorted's
// 72-byte rows.
LoaderOptions quasi(int64_t batch_size = 256) {
  LoaderOptions o;
  o.order = LoaderOrder::QuasiRandom;
  o.batch_size = batch_size;
  o.block_bytes = 128 * 72;   // 128 rows
  o.memory_budget = 1 << 20;  // windows of 56 blocks
  return o;
}

std::vector<at::Tensor> batches(Loader& loader, const char* key = "id") {
  std::vector<at::Tensor> out;
  for (TensorDict b : loader) out.push_back(b.get(key));
  return out;
}

at::Tensor ids(Loader& loader) {
  auto parts = batches(loader);
  return parts.empty() ? at::zeros({0}, at::kLong) : at::cat(parts);
}

TEST(LoaderOrder, QuasiRandomVisitsEveryRowOncePerEpochDeterministically) {
  for (int64_t n : {0L, 1L, 127L, 128L, 129L, 10'000L, 100'003L}) {
    auto td = class_sorted(n);
    Loader a(td, quasi()), b(td, quasi());
    at::Tensor e0 = ids(a);
    ASSERT_TRUE(at::equal(std::get<0>(at::sort(e0)), at::arange(n, at::kLong))) << n;
    EXPECT_TRUE(at::equal(e0, ids(b))) << n << ": same seed and epoch, same order";
    if (n < 1000) continue;
    EXPECT_FALSE(at::equal(e0, at::arange(n, at::kLong))) << n;
    a.set_epoch(1);
    at::Tensor e1 = ids(a);
    EXPECT_TRUE(at::equal(std::get<0>(at::sort(e1)), at::arange(n, at::kLong))) << n;
    EXPECT_FALSE(at::equal(e0, e1)) << n << ": a new epoch, a new order";
  }
}

TEST(LoaderOrder, RanksShareEachWindowExactlyOnce) {
  auto td = class_sorted(50'000);
  std::vector<at::Tensor> all;
  for (int64_t rank = 0; rank < 3; ++rank) {
    LoaderOptions o = quasi(100);
    o.rank = rank;
    o.world_size = 3;
    Loader l(td, o);
    all.push_back(ids(l));
  }
  EXPECT_TRUE(at::equal(std::get<0>(at::sort(at::cat(all))), at::arange(50'000, at::kLong)));
}

// Mean number of distinct classes in the batches of one epoch.
double classes_per_batch(Loader& loader) {
  double sum = 0;
  int64_t count = 0;
  for (const at::Tensor& labels : batches(loader, "label")) {
    if (labels.numel() < 256) continue;  // a short last batch
    const int64_t* l = labels.data_ptr<int64_t>();
    sum += static_cast<double>(std::set<int64_t>(l, l + labels.numel()).size());
    ++count;
  }
  return sum / static_cast<double>(count);
}

TEST(LoaderOrder, BatchesOfAClassSortedDatasetMixTheClasses) {
  auto td = class_sorted(100'000);  // 782 blocks, runs of 39 blocks per class
  Loader q(td, quasi());
  const double quasi_classes = classes_per_batch(q);
  LoaderOptions sequential = quasi();
  sequential.shuffle = false;
  Loader s(td, sequential);
  LoaderOptions random = quasi();
  random.order = LoaderOrder::Random;
  Loader r(td, random);
  const double sequential_classes = classes_per_batch(s), random_classes = classes_per_batch(r);
  RecordProperty("quasi_random_classes_per_batch", std::to_string(quasi_classes));
  EXPECT_GE(quasi_classes, 18.0) << "random " << random_classes;
  EXPECT_GE(random_classes, 19.9);
  EXPECT_LE(sequential_classes, 1.1);
  // A window of 4 blocks mixes far fewer: the budget is the knob.
  LoaderOptions small = quasi();
  small.memory_budget = 8 * (128 * 72);
  Loader few(td, small);
  EXPECT_LE(classes_per_batch(few), 8.0);  // at most 4 classes a window, a batch spans two at most
}

TEST(LoaderOrder, AQuasiRandomEpochResumesExactlyAndRefusesAnotherPlan) {
  TempDir dir;
  auto td = TensorDict::create(dir.path() / "s", {20'000});
  td.update(class_sorted(20'000));
  td.commit();
  Loader full(td, quasi(100));
  full.set_epoch(3);
  std::vector<at::Tensor> want = batches(full);
  Loader first(td, quasi(100));
  first.set_epoch(3);
  int64_t seen = 0;
  for (auto it = first.begin(); it != first.end(); ++it)
    if (++seen == 37) break;
  first.save(td, "run");
  Loader second(td, quasi(100));
  ASSERT_TRUE(second.load(td, "run"));
  std::vector<at::Tensor> rest = batches(second);
  ASSERT_EQ(rest.size(), want.size() - 37);
  for (size_t i = 0; i < rest.size(); ++i) ASSERT_TRUE(at::equal(rest[i], want[37 + i])) << i;
  LoaderOptions other = quasi(100);
  other.block_bytes *= 2;
  Loader third(td, other);
  try {
    third.load(td, "run");
    FAIL() << "a position of another block size was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_rows"), std::string::npos) << e.what();
  }
  LoaderOptions random = quasi(100);
  random.order = LoaderOrder::Random;
  Loader fourth(td, random);
  EXPECT_THROW(fourth.load(td, "run"), Error);  // another permutation scheme
}

TEST(LoaderOrder, OverADatasetEveryPublishedRowOnce) {
  TempDir dir;
  auto ds = Dataset::create(dir.path() / "d");
  for (int64_t shard = 0; shard < 3; ++shard) {
    auto s = ds.shard(shard);
    TensorDict rows = class_sorted(7'000 + shard);
    rows.set("id", at::arange(7'000 + shard, at::kLong) + shard * 100'000);
    s.append(rows);
    s.commit();
  }
  ds.publish();
  Loader l(ds, quasi());
  at::Tensor got = std::get<0>(at::sort(ids(l)));
  std::vector<at::Tensor> want;
  for (int64_t shard = 0; shard < 3; ++shard)
    want.push_back(at::arange(7'000 + shard, at::kLong) + shard * 100'000);
  EXPECT_TRUE(at::equal(got, std::get<0>(at::sort(at::cat(want)))));
}

// Options over the memory budget: blocks of 4 KiB (56 rows of 72 bytes), windows of 4 blocks.
LoaderOptions over_budget(LoaderOrder order, int64_t batch_size, int workers) {
  LoaderOptions o = quasi(batch_size);
  o.order = order;
  o.block_bytes = 4 << 10;
  o.memory_budget = 32 << 10;
  o.num_workers = workers;
  return o;
}

// Rows of class_sorted(n) numbered from `first`, with "x" a function of the id.
TensorDict numbered(int64_t n, int64_t first = 0) {
  TensorDict rows = class_sorted(n);
  at::Tensor id = at::arange(first, first + n, at::kLong);
  rows.set("id", id);
  rows.set("x", id.to(at::kFloat).unsqueeze(1).repeat({1, 14}) * 3);
  return rows;
}

// Every batch's "x" is the function of its "id" that numbered() wrote.
void expect_bytes_of_their_rows(const std::vector<TensorDict>& got, const std::string& what) {
  for (const auto& b : got)
    ASSERT_TRUE(at::equal(b.get("x"), b.get("id").to(at::kFloat).unsqueeze(1).repeat({1, 14}) * 3))
        << what;
}

std::vector<TensorDict> all_batches(Loader& l) {
  std::vector<TensorDict> out;
  for (TensorDict b : l) out.push_back(b);
  return out;
}

at::Tensor ids_of(const std::vector<TensorDict>& got) {
  std::vector<at::Tensor> parts;
  for (const auto& b : got) parts.push_back(b.get("id"));
  return parts.empty() ? at::zeros({0}, at::kLong) : at::cat(parts);
}

// A store larger than the memory budget: QuasiRandom copies its windows into memory of its
// own and gathers there (two windows, or as many as one batch spans: a batch of 1,000 rows
// spans up to six windows of 224), Random reads each batch's rows ahead. Neither may change
// what a batch holds: every row once per epoch with its own bytes, epoch after epoch (the
// second re-reads what the first released), with and without workers, for each rank, and the
// same batches as the order over data that fits in the budget.
TEST(LoaderOrder, OverTheMemoryBudgetEveryRowKeepsItsBytes) {
  TempDir dir;
  const int64_t n = 20'000;  // 1.44 MB of rows against a budget of 32 KiB
  auto td = TensorDict::create(dir.path() / "s", {0});
  td.append(numbered(n));
  td.commit();
  for (LoaderOrder order : {LoaderOrder::QuasiRandom, LoaderOrder::Random})
    for (int64_t batch : {100L, 1000L})
      for (int workers : {0, 2})
        for (int64_t world : {1L, 2L}) {
          std::vector<at::Tensor> ranks;
          for (int64_t rank = 0; rank < world; ++rank) {
            LoaderOptions o = over_budget(order, batch, workers);
            o.rank = rank, o.world_size = world;
            LoaderOptions fits = o;
            fits.memory_budget = 1 << 30;
            fits.block_bytes = o.block_bytes;
            Loader l(td, o);
            for (int64_t epoch = 0; epoch < 2; ++epoch) {
              const std::string what = "order " + std::to_string(static_cast<int>(order)) +
                                       " batch " + std::to_string(batch) + " workers " +
                                       std::to_string(workers) + " rank " + std::to_string(rank) +
                                       "/" + std::to_string(world) + " epoch " +
                                       std::to_string(epoch);
              l.set_epoch(epoch);
              auto got = all_batches(l);
              expect_bytes_of_their_rows(got, what);
              if (order == LoaderOrder::Random) {  // the same permutation whatever the budget
                Loader in_memory(td, fits);
                in_memory.set_epoch(epoch);
                EXPECT_TRUE(at::equal(ids_of(got), ids_of(all_batches(in_memory)))) << what;
              }
              if (epoch == 0) ranks.push_back(ids_of(got));
              if (world == 1) {
                ASSERT_TRUE(at::equal(std::get<0>(at::sort(ids_of(got))), at::arange(n, at::kLong)))
                    << what;
                EXPECT_FALSE(at::equal(ids_of(got), at::arange(n, at::kLong))) << what;
              }
            }
          }
          EXPECT_TRUE(at::equal(std::get<0>(at::sort(at::cat(ranks))), at::arange(n, at::kLong)))
              << "ranks together, order " << static_cast<int>(order) << " batch " << batch;
        }
}

// Resumed mid-epoch over the budget: the windows are copied from the resumed batch's on.
TEST(LoaderOrder, OverTheMemoryBudgetAnEpochResumesExactly) {
  TempDir dir;
  auto td = TensorDict::create(dir.path() / "s", {0});
  td.append(numbered(20'000));
  td.commit();
  for (int64_t batch : {100L, 1000L}) {
    Loader full(td, over_budget(LoaderOrder::QuasiRandom, batch, 2));
    full.set_epoch(5);
    auto want = all_batches(full);
    Loader first(td, over_budget(LoaderOrder::QuasiRandom, batch, 2));
    first.set_epoch(5);
    int64_t seen = 0;
    for (auto it = first.begin(); it != first.end(); ++it)
      if (++seen == 7) break;
    first.save(td, "run");
    Loader second(td, over_budget(LoaderOrder::QuasiRandom, batch, 2));
    ASSERT_TRUE(second.load(td, "run"));
    auto rest = all_batches(second);
    ASSERT_EQ(rest.size(), want.size() - 7) << batch;
    for (size_t i = 0; i < rest.size(); ++i)
      ASSERT_TRUE(at::equal(rest[i].get("x"), want[7 + i].get("x"))) << batch << " " << i;
  }
}

// Over the budget, a dataset's shards are the parts of each column (a block may span two),
// and a ragged key is read from the mapping (the windows hold dense columns only).
TEST(LoaderOrder, OverTheMemoryBudgetShardsAndRaggedKeysKeepTheirRows) {
  TempDir dir;
  auto ds = Dataset::create(dir.path() / "d");
  int64_t at = 0;
  for (int64_t shard = 0; shard < 3; ++shard) {
    auto s = ds.shard(shard);
    s.append(numbered(3'001 + shard * 1'000, at));
    s.commit();
    at += 3'001 + shard * 1'000;
  }
  ds.publish();
  Loader l(ds, over_budget(LoaderOrder::QuasiRandom, 100, 2));
  auto got = all_batches(l);
  expect_bytes_of_their_rows(got, "dataset");
  EXPECT_TRUE(at::equal(std::get<0>(at::sort(ids_of(got))), at::arange(at, at::kLong)));

  auto td = TensorDict::create(dir.path() / "r", {0});
  TensorDict rows = numbered(5'000);
  std::vector<at::Tensor> seqs;
  for (int64_t i = 0; i < 5'000; ++i) seqs.push_back(at::full({i % 7}, static_cast<float>(i)));
  rows.set_ragged("seq", seqs);
  td.append(rows);
  td.commit();
  Loader r(td, over_budget(LoaderOrder::QuasiRandom, 100, 2));
  got = all_batches(r);
  expect_bytes_of_their_rows(got, "ragged");
  EXPECT_TRUE(at::equal(std::get<0>(at::sort(ids_of(got))), at::arange(5'000, at::kLong)));
  for (const auto& b : got) {
    at::Tensor id = b.get("id"), len = b.get("seq.lengths"), seq = b.get("seq");
    for (int64_t i = 0; i < id.numel(); ++i) {
      const int64_t row = id[i].item<int64_t>();
      ASSERT_EQ(len[i].item<int64_t>(), row % 7);
      for (int64_t k = 0; k < row % 7; ++k)
        ASSERT_EQ(seq[i][k].item<float>(), static_cast<float>(row));
    }
  }
}

// Blocks large enough to be read past the page cache straight into the windows (each block's
// pages of the file onto its area's pages, the block starting as far into them as into the
// file's): every row keeps its bytes, over a store and over a dataset whose blocks span two
// shards (the later part read through a buffer), epoch after epoch.
TEST(LoaderOrder, OverTheMemoryBudgetLargeBlocksReadStraightIntoTheWindowsKeepEveryRowsBytes) {
  TempDir dir;
  auto td = TensorDict::create(dir.path() / "s", {0});
  td.append(numbered(60'000));
  td.commit();
  auto ds = Dataset::create(dir.path() / "d");
  int64_t at = 0;
  for (int64_t shard = 0; shard < 3; ++shard) {
    auto s = ds.shard(shard);
    s.append(numbered(19'999 + shard, at));
    s.commit();
    at += 19'999 + shard;
  }
  ds.publish();
  LoaderOptions o = over_budget(LoaderOrder::QuasiRandom, 256, 2);
  // 7,281 rows a block: 398 KiB of "x", read straight into page-aligned areas, and 57 KiB of
  // "id" and of "label", packed and read through a buffer.
  o.block_bytes = 512 << 10;
  o.memory_budget = 2 << 20;  // windows of 2 blocks, against 4.3 MB of rows
  for (int source = 0; source < 2; ++source) {
    Loader l = source == 0 ? Loader(td, o) : Loader(ds, o);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      const std::string what =
          (source == 0 ? "store" : "dataset") + std::string(" epoch ") + std::to_string(epoch);
      l.set_epoch(epoch);
      auto got = all_batches(l);
      expect_bytes_of_their_rows(got, what);
      EXPECT_TRUE(at::equal(std::get<0>(at::sort(ids_of(got))), at::arange(60'000, at::kLong)))
          << what;
    }
  }
}

// The windows read a store's arena file only where it holds what the dict's views hold: rows
// of a view written in place (copy on write: this process's own pages, never the file's) come
// from the mapping, as every other read of the view sees them.
TEST(LoaderOrder, OverTheMemoryBudgetRowsWrittenInPlaceAreReadAsTheViewHoldsThem) {
  TempDir dir;
  {
    auto td = TensorDict::create(dir.path() / "s", {0});
    td.append(numbered(20'000));
    td.commit();
  }
  auto td = TensorDict::open(dir.path() / "s");
  at::Tensor x = td.get("x");
  for (int64_t row : {0L, 5L, 9'999L, 19'999L}) x[row].fill_(-1.0f);
  Loader l(td, over_budget(LoaderOrder::QuasiRandom, 100, 2));
  int64_t seen = 0;
  for (TensorDict b : l) {
    at::Tensor id = b.get("id"), bx = b.get("x");
    for (int64_t i = 0; i < id.numel(); ++i) {
      const int64_t row = id[i].item<int64_t>();
      ASSERT_TRUE(at::equal(bx[i], x[row])) << "row " << row;
      seen += bx[i][0].item<float>() == -1.0f;
    }
  }
  EXPECT_EQ(seen, 4);
}

// The windows read the arena file at the offsets of the mapping the epoch's keys point into: a
// store compacted underneath (every key at another offset of another file) and refreshed
// between epochs, or between two runs of one epoch, still gives every row its own bytes.
TEST(LoaderOrder, OverTheMemoryBudgetACompactedStoreKeepsEveryRowsBytes) {
  TempDir dir;
  {
    auto td = TensorDict::create(dir.path() / "s", {20'000});
    td.set("pad", at::zeros({20'000, 64}));  // 5 MB written first, then erased: a hole
    td.update(numbered(20'000));
    td.commit();
    td.erase("pad");
    td.commit();
  }
  auto td = TensorDict::open(dir.path() / "s");
  Loader l(td, over_budget(LoaderOrder::QuasiRandom, 100, 2));
  expect_bytes_of_their_rows(all_batches(l), "before compaction");
  CompactResult r = compact(dir.path() / "s");
  ASSERT_LT(r.arena_bytes_after, r.arena_bytes_before);  // the rows moved
  ASSERT_TRUE(td.refresh());
  auto again = all_batches(l);  // the epoch's keys: the old mapping, kept by their views
  expect_bytes_of_their_rows(again, "the same epoch after compaction");
  EXPECT_EQ(ids_of(again).numel(), 20'000);
  l.set_epoch(1);  // the new store's keys
  auto next = all_batches(l);
  expect_bytes_of_their_rows(next, "the next epoch");
  EXPECT_TRUE(at::equal(std::get<0>(at::sort(ids_of(next))), at::arange(20'000, at::kLong)));
}

// A writer's staged keys small enough to wait in the small-write buffer (4 KiB at most) are in
// the arena file once the loader holds them, so the windows read them as the views show them.
TEST(LoaderOrder, OverTheMemoryBudgetAWritersSmallStagedKeysAreRead) {
  TempDir dir;
  auto td = TensorDict::create(dir.path() / "s", {400});
  td.update(numbered(400));  // id 3,200 bytes, x 22,400, label 3,200: two of them buffered
  LoaderOptions o = over_budget(LoaderOrder::QuasiRandom, 10, 2);
  o.block_bytes = 512;     // 7 rows of 72 bytes
  o.memory_budget = 4096;  // windows of 4 blocks, against 28,800 bytes of rows
  Loader l(td, o);
  auto got = all_batches(l);
  expect_bytes_of_their_rows(got, "staged");
  EXPECT_TRUE(at::equal(std::get<0>(at::sort(ids_of(got))), at::arange(400, at::kLong)));
  at::Tensor labels = td.get("label");  // 3,200 bytes: a buffered key
  for (const auto& b : got)
    ASSERT_TRUE(at::equal(b.get("label"), labels.index_select(0, b.get("id"))));
  EXPECT_EQ(labels[399].item<int64_t>(), 19);
}

// A window that cannot be read fails the batches that read it with the read's IOError, naming
// the arena file; the loader neither hangs nor crashes, and the next epoch reads again.
TEST(LoaderOrder, OverTheMemoryBudgetAFailedReadIsTheBatchsError) {
  TempDir dir;
  {
    auto td = TensorDict::create(dir.path() / "s", {0});
    td.append(numbered(20'000));
    td.commit();
  }
  auto env = std::make_shared<testing::FaultEnv>();
  StoreOptions so;
  so.env = env;
  auto td = TensorDict::open(dir.path() / "s", OpenMode::ReadOnly, so);
  for (int workers : {0, 2}) {
    Loader l(td, over_budget(LoaderOrder::QuasiRandom, 100, workers));
    env->reads = 0;
    env->fail_read_at = 30;  // a block of the window after a few
    std::string message;
    int64_t batches = 0;
    try {
      for (TensorDict b : l) ++batches;
    } catch (const IOError& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("arena.tda"), std::string::npos) << workers << ": " << message;
    EXPECT_NE(message.find("injected"), std::string::npos) << message;
    EXPECT_LT(batches, 200);
    env->fail_read_at = 0;
    l.set_epoch(1);
    auto got = all_batches(l);
    expect_bytes_of_their_rows(got, "after the failure");
    EXPECT_EQ(ids_of(got).numel(), 20'000);
  }
}

// The virtual memory this process has mapped, from /proc/self/status.
int64_t mapped_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7)) * 1024;
  return 0;
}

// QuasiRandom with block_bytes of 1 TiB or 2^62 over a 3 KB store threw std::bad_alloc, and
// 16 GiB mapped 32 GiB of address space (issue 45): blocks and windows are clamped to the data.
TEST(LoaderOrder, AHugeBlockOrBudgetIsClampedToTheData) {
  TempDir dir;
  auto td = TensorDict::create(dir.path() / "s", {48});
  td.update(class_sorted(48));
  td.commit();
  for (int64_t block : {int64_t{16} << 30, int64_t{1} << 40, int64_t{1} << 62}) {
    for (int64_t budget : {int64_t{1} << 10, int64_t{1} << 62}) {  // 1 KiB: the 3 KB are over it
      LoaderOptions o = quasi(5);
      o.block_bytes = block;
      o.memory_budget = budget;
      const int64_t before = mapped_bytes();
      Loader l(td, o);
      int64_t peak = 0;
      std::vector<int64_t> seen;
      for (TensorDict b : l) {
        peak = std::max(peak, mapped_bytes() - before);
        for (int64_t i = 0; i < b.get("id").numel(); ++i)
          seen.push_back(b.get("id")[i].item<int64_t>());
      }
      std::sort(seen.begin(), seen.end());
      ASSERT_EQ(seen.size(), 48u) << block << " " << budget;
      for (int64_t i = 0; i < 48; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], i);
      EXPECT_LT(peak, int64_t{1} << 30) << "block_bytes " << block << " mapped " << peak;
    }
  }
}

// A QuasiRandom position over a store with a ragged key, saved mid-epoch, was refused after
// longer rows were appended ("saved with block_rows 3, this loader has block_rows 1"): the plan
// came from the row bytes of every row. It comes from the epoch's rows (loader.h: the epoch
// finishes over its first `rows` rows), so the rest of the epoch is exactly the saved run's.
TEST(LoaderOrder, AQuasiRandomPositionOverARaggedKeyResumesAfterLongerRowsAreAppended) {
  TempDir dir;
  auto td = TensorDict::create(dir.path() / "s", {0});
  auto rows = [](int64_t first, int64_t n, int64_t len) {
    TensorDict r({n});
    r.set("id", at::arange(first, first + n, at::kLong));
    std::vector<at::Tensor> tokens;
    for (int64_t i = 0; i < n; ++i) tokens.push_back(at::full({len}, first + i, at::kLong));
    r.set_ragged("tok", tokens);
    return r;
  };
  td.append(rows(0, 600, 2));
  td.commit();
  LoaderOptions o = quasi(10);
  o.block_bytes = 24 * 20;            // 20 rows of 24 bytes (id + 2 tokens)
  o.memory_budget = 24 * 20 * 4 * 2;  // windows of 4 blocks
  Loader full(td, o);
  full.set_epoch(1);
  std::vector<at::Tensor> want = batches(full);
  Loader first(td, o);
  first.set_epoch(1);
  int64_t seen = 0;
  for (auto it = first.begin(); it != first.end(); ++it)
    if (++seen == 13) break;
  first.save(td, "run");
  td.append(rows(600, 600, 40));  // rows of 328 bytes: the average row is 7x longer
  td.commit();
  Loader second(td, o);
  ASSERT_TRUE(second.load(td, "run"));
  std::vector<at::Tensor> rest = batches(second);
  ASSERT_EQ(rest.size(), want.size() - 13);
  for (size_t i = 0; i < rest.size(); ++i) ASSERT_TRUE(at::equal(rest[i], want[13 + i])) << i;
  second.set_epoch(2);  // the next epoch covers every row
  EXPECT_EQ(ids(second).numel(), 1200);
}

// A position saved before plans were clamped to the data named a block of more rows than the
// source has, or a window of more blocks than there are: the same order, so it still resumes.
TEST(LoaderOrder, APositionFromBeforeTheClampResumesExactly) {
  auto td = class_sorted(300);
  LoaderOptions o = quasi(10);
  o.block_bytes = 64 * 40;           // 40 rows a block
  o.memory_budget = 64 * 40 * 1000;  // one window of every block (unclamped: 500 blocks)
  Loader full(td, o);
  full.set_epoch(2);
  std::vector<at::Tensor> want = batches(full);
  Loader first(td, o);
  first.set_epoch(2);
  int64_t seen = 0;
  for (auto it = first.begin(); it != first.end(); ++it)
    if (++seen == 7) break;
  LoaderPosition p = first.position();
  ASSERT_TRUE(p.block_rows && p.window_blocks);
  ASSERT_EQ(*p.window_blocks, (300 + *p.block_rows - 1) / *p.block_rows);  // clamped: every block
  p.window_blocks = 500;  // what the plan said before
  Loader second(td, o);
  second.restore(p);
  std::vector<at::Tensor> rest = batches(second);
  ASSERT_EQ(rest.size(), want.size() - 7);
  for (size_t i = 0; i < rest.size(); ++i) ASSERT_TRUE(at::equal(rest[i], want[7 + i])) << i;
  LoaderOptions huge = o;
  huge.block_bytes = int64_t{1} << 40;
  Loader whole(td, huge);
  whole.set_epoch(2);
  std::vector<at::Tensor> want_whole = batches(whole);
  Loader part(td, huge);
  part.set_epoch(2);
  seen = 0;
  for (auto it = part.begin(); it != part.end(); ++it)
    if (++seen == 3) break;
  LoaderPosition q = part.position();
  ASSERT_EQ(q.block_rows, std::optional<int64_t>(300));
  q.block_rows = (int64_t{1} << 40) / 64;  // unclamped: more rows than the source has
  Loader again(td, huge);
  again.restore(q);
  std::vector<at::Tensor> rest_whole = batches(again);
  ASSERT_EQ(rest_whole.size(), want_whole.size() - 3);
  for (size_t i = 0; i < rest_whole.size(); ++i)
    ASSERT_TRUE(at::equal(rest_whole[i], want_whole[3 + i])) << i;
}

// Bad arguments are ArgumentError (a ValueError in Python), not a bare Error (issue 45).
TEST(LoaderOrder, BadArgumentsAreArgumentErrors) {
  auto td = class_sorted(10);
  auto refused = [&](auto change) {
    LoaderOptions o = quasi();
    change(o);
    EXPECT_THROW(Loader(td, o), ArgumentError);
  };
  refused([](LoaderOptions& o) { o.batch_size = 0; });
  refused([](LoaderOptions& o) { o.world_size = 0; });
  refused([](LoaderOptions& o) { o.rank = 2, o.world_size = 2; });
  refused([](LoaderOptions& o) { o.block_bytes = 0; });
  refused([](LoaderOptions& o) { o.memory_budget = -5; });
  EXPECT_THROW(TensorDict::stack({}), ArgumentError);
  EXPECT_THROW(TensorDict::cat({}), ArgumentError);
  TempDir dir;
  for (auto change :
       {+[](StoreOptions& o) { o.key_capacity = 0; }, +[](StoreOptions& o) { o.alignment = 3; }}) {
    StoreOptions o;
    change(o);
    EXPECT_THROW(TensorDict::create(dir.path() / "bad", {2}, o), ArgumentError);
  }
}

TEST(LoaderOrder, BadBlockOrBudgetIsRefused) {
  auto td = class_sorted(10);
  LoaderOptions o = quasi();
  o.block_bytes = 0;
  EXPECT_THROW(Loader(td, o), Error);
  o = quasi();
  o.memory_budget = -1;
  EXPECT_THROW(Loader(td, o), Error);
}

}  // namespace loader_order_test
}  // namespace tdstore
