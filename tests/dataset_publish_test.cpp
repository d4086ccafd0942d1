// Datasets never read what no publish named: readers see exactly the published rows (a shard
// committed after its publish is read only if its published rows are the sealed bytes),
// published rows never decrease, shard directories are unambiguous, indexing follows
// TensorDict::index, damage is a typed error, and a dataset of hundreds of shards opens.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tdstore/tdstore.h"
#include "tests/dataset_rows.h"
#include "tests/error_message.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

namespace fs = std::filesystem;
using testing::append_rows;
using testing::dataset_of;
using testing::message_of;
using testing::rows;
using testing::TempDir;

at::Tensor ids(const Dataset& ds) { return ds.index(at::arange(ds.rows(), at::kLong)).get("id"); }

TEST(DatasetPublish, AShardRewrittenAfterItsPublishIsRefusedNamingShardAndKey) {
  TempDir t;
  dataset_of(t / "d", {30, 20});
  {
    TensorDict shard = Dataset::open(t / "d").shard(1);
    shard.set("x", shard.get("x") * 2);  // same rows and spec, other bytes; not published
    shard.commit();
  }
  Dataset ds = Dataset::open(t / "d");  // opens: it can still publish
  EXPECT_EQ(ds.rows(), 50);
  std::string m = message_of([&] { ds.index(at::arange(50, at::kLong)); });
  EXPECT_NE(m.find("shard 1"), std::string::npos) << m;
  EXPECT_NE(m.find("'x'"), std::string::npos) << m;
  EXPECT_NE(m.find("changed after the publish"), std::string::npos) << m;
  EXPECT_THROW(ds.index(at::arange(50, at::kLong)), CorruptionError);
  EXPECT_THROW(Loader(ds, LoaderOptions{}), CorruptionError);
  ds.publish();  // publishing the new bytes is how to move on
  EXPECT_TRUE(at::equal(Dataset::open(t / "d").index(at::arange(30, 50, at::kLong)).get("x"),
                        rows(30, 20).get("x") * 2));
}

TEST(DatasetPublish, AShardWithOtherSpecsAfterItsPublishIsRefusedBeforeAnyRead) {
  TempDir t;
  Dataset reader = dataset_of(t / "d", {30, 20});
  {
    TensorDict shard = Dataset::open(t / "d").shard(1);
    shard.set("x", at::zeros({20, 5}));  // wider rows: read as published they would overrun
    shard.commit();
  }
  std::string m = message_of([&] { reader.refresh(); });
  EXPECT_NE(m.find("shard 1"), std::string::npos) << m;
  EXPECT_NE(m.find("float32 [5]"), std::string::npos) << m;
  EXPECT_NE(m.find("float32 [3]"), std::string::npos) << m;
  // The handle keeps the state it had: still the published rows, exactly.
  EXPECT_TRUE(at::equal(ids(reader), at::arange(50, at::kLong)));
  EXPECT_THROW(Loader(Dataset::open(t / "d"), LoaderOptions{}), CorruptionError);
}

TEST(DatasetPublish, RowsAppendedAfterAPublishLeaveThePublishedRowsReadable) {
  TempDir t;
  dataset_of(t / "d", {30, 20});
  {
    TensorDict shard = Dataset::open(t / "d").shard(0);
    append_rows(shard, 1000, 7);  // committed, not published
  }
  compact(t / "d" / "shards" / "00000");  // and compacted: another commit, the same bytes
  Dataset ds = Dataset::open(t / "d");
  EXPECT_EQ(ds.rows(), 50);
  EXPECT_TRUE(at::equal(ids(ds), at::arange(50, at::kLong)));
  LoaderOptions o;
  o.batch_size = 64;
  Loader loader(ds, o);
  int64_t seen = 0;
  for (TensorDict b : loader) seen += b.batch_size()[0];
  EXPECT_EQ(seen, 50);
}

TEST(DatasetPublish, PublishedRowsNeverDecrease) {
  TempDir t;
  Dataset ds = dataset_of(t / "d", {30, 20});
  fs::remove_all(t / "d" / "shards" / "00001");
  std::string m = message_of([&] { ds.publish(); });
  EXPECT_NE(m.find("shard 1"), std::string::npos) << m;
  EXPECT_NE(m.find("gone"), std::string::npos) << m;
  EXPECT_THROW(ds.publish(), CorruptionError);
  fs::remove_all(t / "d" / "shards" / "00000" / "keys.tdd");
  EXPECT_THROW(ds.publish(), CorruptionError);
}

TEST(DatasetPublish, TwoDirectoriesNamingOneShardAreRefused) {
  TempDir t;
  Dataset ds = dataset_of(t / "d", {30, 20});
  fs::copy(t / "d" / "shards" / "00001", t / "d" / "shards" / "000001",
           fs::copy_options::recursive);
  std::string m = message_of([&] { ds.publish(); });
  EXPECT_NE(m.find("'000001'"), std::string::npos) << m;
  EXPECT_NE(m.find("'00001'"), std::string::npos) << m;
  EXPECT_EQ(Dataset::open(t / "d").rows(), 50) << "the manifest stands";
}

TEST(DatasetPublish, IndexFollowsTensorDictIndex) {
  TempDir t;
  Dataset ds = dataset_of(t / "d", {3, 2});
  at::Tensor mask = at::tensor({1, 0, 1, 0, 1}).to(at::kBool);
  EXPECT_TRUE(at::equal(ds.index(mask).get("id"), at::tensor({0, 2, 4}, at::kLong)));
  EXPECT_TRUE(
      at::equal(ds.index(at::tensor({-1, 0}, at::kInt)).get("id"), at::tensor({4, 0}, at::kLong)));
  EXPECT_THROW(ds.index(at::tensor({1.7})), ShapeError);
  EXPECT_THROW(ds.index(at::tensor({1, 0}).to(at::kBool)), ShapeError);  // a mask of other length
  EXPECT_THROW(ds.index(at::tensor({5}, at::kLong)), ShapeError);
  EXPECT_THROW(ds.index(at::tensor({-6}, at::kLong)), ShapeError);
  EXPECT_THROW(ds.index(at::tensor({5}, at::kLong)), IndexError);  // that ShapeError is one
}

TEST(DatasetPublish, DamageUnderAnOpenHandleIsATypedErrorAtRefresh) {
  TempDir t;
  Dataset ds = dataset_of(t / "d", {30, 20});
  fs::resize_file(t / "d" / "shards" / "00001" / "arena.tda", 4096);  // truncated
  EXPECT_THROW(ds.refresh(), CorruptionError);
  EXPECT_THROW(Dataset::open(t / "d").index(at::arange(50, at::kLong)), CorruptionError);
  EXPECT_EQ(ds.rows(), 50) << "the handle keeps the state it had (its views of the truncated "
                              "file, like any mapping's, would raise SIGBUS)";
  std::ofstream(t / "d" / "shards" / "00001" / "keys.tdd", std::ios::trunc) << "x";
  EXPECT_THROW(ds.refresh(), Error);
  // A store handle refreshed over a truncated key directory: a typed error, not SIGBUS.
  TensorDict manifest = TensorDict::open(t / "d" / "manifest");
  fs::resize_file(t / "d" / "manifest" / "keys.tdd", 100);
  EXPECT_THROW(manifest.refresh(), CorruptionError);
}

// Each shard reader maps only its arena: a dataset of 300 shards opens (and publishes) where a
// reader reserving 1 TiB of address space per store stopped at about 125.
TEST(DatasetPublish, ADatasetOfHundredsOfShardsOpens) {
  TempDir t;
  Dataset ds = Dataset::create(t / "d");
  constexpr int kShards = 300;
  for (int s = 0; s < kShards; ++s) {
    TensorDict shard = ds.shard(s);
    append_rows(shard, s, 1);
  }
  ds.publish();
  EXPECT_EQ(ds.rows(), kShards);
  Dataset again = Dataset::open(t / "d");
  EXPECT_TRUE(at::equal(ids(again), at::arange(kShards, at::kLong)));
  again.refresh();
  EXPECT_EQ(again.rows(), kShards);
}

}  // namespace
}  // namespace tdstore
