// Appending rows: amortized growth, snapshots, errors, and a caching job killed midway.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <iostream>
#include <random>
#include <set>

#include "storage/store.h"
#include "tdstore/tdstore.h"
#include "tests/kill_harness.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace append_test {

using testing::TempDir;

// Rows [start, start + n): "x" [n, 3] float = row index, "label" [n] int64 = row index % 10.
TensorDict rows(int64_t start, int64_t n) {
  TensorDict td({n});
  at::Tensor idx = at::arange(start, start + n, at::kLong);
  td.set("x", idx.to(at::kFloat).unsqueeze(1).repeat({1, 3}));
  td.set("label", idx.remainder(10));
  return td;
}

void expect_rows(const TensorDict& td, int64_t n) {
  ASSERT_EQ(td.batch_size(), std::vector<int64_t>{n});
  if (n == 0) {
    EXPECT_EQ(td.size(), 0);
    return;
  }
  TensorDict expect = rows(0, n);
  EXPECT_TRUE(at::equal(td.get("x"), expect.get("x")));
  EXPECT_TRUE(at::equal(td.get("label"), expect.get("label")));
}

TEST(Append, GrowsBatchDimAndKeepsSnapshots) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {0});
  td.append(rows(0, 5));
  td.commit();
  auto reader = TensorDict::open(t / "s");
  expect_rows(reader, 5);
  for (int i = 1; i < 10; ++i) td.append(rows(5 * i, 5));
  expect_rows(td, 50);  // staged rows are readable by the writer
  expect_rows(reader, 5);
  td.commit();
  expect_rows(reader, 5);  // a reader sees a commit only after refresh
  reader.refresh();
  expect_rows(reader, 50);
  EXPECT_TRUE(reader.verify().empty()) << "checksums extended, not stale";
  expect_rows(TensorDict::open(t / "s"), 50);
}

TEST(Append, AmortizedGrowthAndReserve) {
  TempDir t;
  auto dir = t / "count";
  auto td = TensorDict::create(dir, {0});
  std::set<uint64_t> offsets;
  for (int i = 0; i < 200; ++i) {
    td.append(rows(i, 1));
    td.commit();
    offsets.insert(storage::Store::open(dir, OpenMode::ReadOnly, {})->find("x")->offset);
  }
  EXPECT_LE(offsets.size(), 10u) << "geometric growth: about log2(200) moves";
  auto r = TensorDict::create(t / "reserved", {0});
  r.reserve(200);
  offsets.clear();
  for (int i = 0; i < 200; ++i) {
    r.append(rows(i, 1));
    r.commit();
    offsets.insert(storage::Store::open(t / "reserved", OpenMode::ReadOnly, {})->find("x")->offset);
  }
  EXPECT_EQ(offsets.size(), 1u) << "with reserve(), nothing moves";
  expect_rows(TensorDict::open(t / "reserved"), 200);
}

TEST(Append, BadRowsAreRejectedBeforeAnythingIsWritten) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {0});
  td.append(rows(0, 4));
  td.commit();
  TensorDict missing({2});
  missing.set("x", at::zeros({2, 3}));
  EXPECT_THROW(td.append(missing), KeyError);
  TensorDict wrong_dtype = rows(4, 2);
  wrong_dtype.set("label", at::zeros({2}, at::kInt));
  EXPECT_THROW(td.append(wrong_dtype), DTypeError);
  TensorDict wrong_shape = rows(4, 2);
  wrong_shape.set("x", at::zeros({2, 4}));
  EXPECT_THROW(td.append(wrong_shape), ShapeError);
  EXPECT_THROW(td.append(TensorDict({2, 2})), ShapeError);
  td.commit();
  expect_rows(TensorDict::open(t / "s"), 4);
  TensorDict mem({0});
  mem.append(rows(0, 3));
  mem.append(rows(3, 3));
  expect_rows(mem, 6);
}

// ---- a caching job killed midway resumes without duplicates or gaps

constexpr int64_t kTotal = 3000;

TEST(AppendChild, CachingJob) {
  const char* arg = testing::child_arg();
  if (!arg) GTEST_SKIP() << "runs as a child";
  auto td = TensorDict::open(arg, OpenMode::ReadWrite);
  td.reserve(kTotal);
  std::mt19937 rng(static_cast<unsigned>(getpid()));
  for (int64_t n = td.batch_size()[0]; n < kTotal;) {
    int64_t k = std::min<int64_t>(kTotal - n, 1 + rng() % 50);
    testing::report("begin", n + k);
    td.append(rows(n, k));
    td.commit();
    testing::report("done", n + k);
    n += k;
  }
  _exit(testing::kChildPassed);
}

// A caching job is killed after its k-th begun chunk (k random, counted in its reports) until 12
// kills landed mid-chunk; a job that completes starts over on an empty store. The kill lands
// wherever the job got to: inside a chunk (the store holds the chunk last done, or the one
// begun if its commit finished first), between two (the chunk last done), or after the job
// completed and exited by itself (every row).
TEST(Append, KilledCachingJobResumesExactly) {
  TempDir t;
  auto dir = t / "s";
  TensorDict::create(dir, {0});
  std::mt19937 rng(11);
  int64_t last = 0;
  testing::KillRounds rounds(12, 120);
  while (rounds.more()) {
    testing::Child job = testing::Child::test("AppendChild.CachingJob", dir.string());
    const int chunks = 1 + static_cast<int>(rng() % 8);
    int begun = 0;
    for (std::optional<testing::Event> e; begun < chunks && (e = job.next());)
      begun += e->name == "begin";
    testing::Killed k;
    if (begun == chunks) {
      k = job.kill();
    } else {  // the job completed before its k-th chunk
      k.code = job.wait();
      k.last_begin = job.last_begin(), k.last_done = job.last_done();
    }
    rounds.count(k);
    int64_t n;
    {
      auto td = TensorDict::open(dir);
      n = td.batch_size()[0];
      EXPECT_GE(n, last) << "committed rows never go away";
      EXPECT_TRUE(n == k.last_done.value_or(last) || (k.mid_operation && n == k.last_begin))
          << n << " rows; " << k.landed();
      if (!k.signaled) {
        EXPECT_EQ(k.code, 0) << "the job exited by itself: it completed";
        EXPECT_EQ(n, kTotal) << "the job exited by itself: it completed";
      }
      expect_rows(td, n);
      EXPECT_TRUE(td.verify().empty());
    }
    last = n;
    if (HasFailure()) return;
    if (n == kTotal &&
        !rounds.done()) {  // the job completed: start over, so that kills keep landing mid-job
      std::filesystem::remove_all(dir);
      TensorDict::create(dir, {0});
      last = 0;
    }
  }
  std::cerr << rounds.landings() << "\n";
  EXPECT_EQ(testing::run_child("AppendChild.CachingJob", dir.string()), 0);
  expect_rows(TensorDict::open(dir), kTotal);
}

}  // namespace append_test
}  // namespace tdstore
