// LoaderOrder::QuasiRandom: every row once per epoch, deterministic from (seed, epoch), shared
// by ranks, resumable, and batches that mix a class-sorted dataset (shuffle quality).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tdstore/tdstore.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

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

// The defaults' ratio (window: half of 1 GiB in 8 MiB blocks), scaled to 64-byte rows.
LoaderOptions quasi(int64_t batch_size = 256) {
  LoaderOptions o;
  o.order = LoaderOrder::QuasiRandom;
  o.batch_size = batch_size;
  o.block_bytes = 8 << 10;    // 128 rows
  o.memory_budget = 1 << 20;  // windows of 64 blocks
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
  small.memory_budget = 8 * (8 << 10);
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

TEST(LoaderOrder, BadBlockOrBudgetIsRefused) {
  auto td = class_sorted(10);
  LoaderOptions o = quasi();
  o.block_bytes = 0;
  EXPECT_THROW(Loader(td, o), Error);
  o = quasi();
  o.memory_budget = -1;
  EXPECT_THROW(Loader(td, o), Error);
}

}  // namespace
}  // namespace tdstore
