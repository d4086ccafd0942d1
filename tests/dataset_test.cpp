// Datasets (tdstore/dataset.h): shards written by separate writers (threads here, processes
// killed midway below), published atomically, read as one dataset.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randperm.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <random>
#include <thread>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "storage/dataset_manifest.h"
#include "tdstore/tdstore.h"
#include "tests/dataset_rows.h"
#include "tests/error_message.h"
#include "tests/kill_harness.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

using testing::TempDir;

using testing::append_rows;
using testing::dataset_of;
using testing::rows;

using testing::message_of;

TEST(Dataset, ShardsArePublishedTogetherAndReadAsOne) {
  TempDir t;
  Dataset ds = Dataset::create(t / "d");
  EXPECT_EQ(ds.rows(), 0);
  EXPECT_TRUE(ds.keys().empty());
  // Three writers at once, one shard each: rows [0, 40), [40, 50), [50, 80).
  const int64_t from[] = {0, 40, 50}, count[] = {40, 10, 30};
  std::vector<std::thread> writers;
  for (int s = 0; s < 3; ++s)
    writers.emplace_back([&, s] {
      TensorDict shard = Dataset::open(t / "d").shard(s);
      for (int64_t r = 0; r < count[s]; r += 5) append_rows(shard, from[s] + r, 5);
    });
  for (auto& w : writers) w.join();
  EXPECT_EQ(ds.rows(), 0) << "nothing published yet";
  ds.publish();
  EXPECT_EQ(ds.rows(), 80);
  EXPECT_EQ(ds.shard_rows(), std::vector<int64_t>({40, 10, 30}));
  EXPECT_EQ(ds.keys(), std::vector<std::string>({"id", "x"}));
  TensorDict all = ds.index(at::arange(80, at::kLong));
  EXPECT_EQ(all.batch_size(), std::vector<int64_t>({80}));
  EXPECT_TRUE(at::equal(all.get("id"), at::arange(80, at::kLong)));
  EXPECT_TRUE(at::equal(all.get("x"), rows(0, 80).get("x")));
  at::Tensor perm = at::randperm(80, at::kLong);
  TensorDict some = ds.index(perm);
  EXPECT_TRUE(at::equal(some.get("id"), perm))
      << "rows come back in the order asked, across shards";
  TensorDict none = ds.index(at::empty({0}, at::kLong));
  EXPECT_EQ(none.keys(), ds.keys()) << "no rows: every key, with 0 rows";
  EXPECT_EQ(none.get("x").sizes(), at::IntArrayRef({0, 3}));
  EXPECT_NE(
      message_of([&] { ds.index(at::arange(79, 81, at::kLong)); }).find("row 80 out of range"),
      std::string::npos);
  Dataset again = Dataset::open(t / "d");
  EXPECT_EQ(again.rows(), 80);
}

TEST(Dataset, ReadersSeeOnlyPublishedRows) {
  TempDir t;
  Dataset writer = Dataset::create(t / "d");
  TensorDict s0 = writer.shard(0);
  append_rows(s0, 0, 10);
  writer.publish();
  Dataset reader = Dataset::open(t / "d");
  EXPECT_EQ(reader.rows(), 10);
  append_rows(s0, 10, 10);  // committed, not published
  TensorDict s1 = writer.shard(1);
  append_rows(s1, 20, 5);
  reader.refresh();
  EXPECT_EQ(reader.rows(), 10) << "committed shard rows are not the dataset's until published";
  EXPECT_TRUE(
      at::equal(reader.index(at::arange(10, at::kLong)).get("id"), at::arange(10, at::kLong)));
  writer.publish();
  EXPECT_EQ(reader.rows(), 10) << "a reader moves on refresh()";
  reader.refresh();
  EXPECT_EQ(reader.rows(), 25);
  EXPECT_EQ(reader.shard_rows(), std::vector<int64_t>({20, 5}));
  EXPECT_TRUE(
      at::equal(reader.index(at::arange(25, at::kLong)).get("id"), at::arange(25, at::kLong)));
}

TEST(Dataset, AShardThatDisagreesIsRefusedAndNothingPublishedIsLost) {
  TempDir t;
  Dataset ds = Dataset::create(t / "d");
  TensorDict s0 = ds.shard(0);
  append_rows(s0, 0, 10);
  ds.publish();
  TensorDict s1 = ds.shard(1);
  TensorDict bad({4});
  bad.set("id", at::arange(4, at::kLong));
  bad.set("x", at::zeros({4, 3}, at::kDouble));  // float64 where the others have float32
  s1.append(bad);
  s1.commit();
  std::string m = message_of([&] { ds.publish(); });
  EXPECT_NE(m.find("shard 1"), std::string::npos) << m;
  EXPECT_NE(m.find("'x'"), std::string::npos) << m;
  EXPECT_NE(m.find("float64 [3]"), std::string::npos) << m;
  EXPECT_NE(m.find("float32 [3]"), std::string::npos) << m;
  EXPECT_THROW(ds.publish(), DTypeError);
  EXPECT_EQ(Dataset::open(t / "d").rows(), 10) << "the previous publish stands";
  TensorDict s2 = ds.shard(2);
  TensorDict extra = rows(0, 2);
  extra.set("y", at::zeros({2}));
  s2.append(extra);
  s2.commit();
  std::filesystem::remove_all(t / "d" / "shards" / "00001");
  m = message_of([&] { ds.publish(); });
  EXPECT_NE(m.find("shard 2"), std::string::npos) << m;
  EXPECT_NE(m.find("'y'"), std::string::npos) << m;
  EXPECT_EQ(Dataset::open(t / "d").rows(), 10);
  EXPECT_THROW(Dataset::open(t / "nothing"), FormatError);
  std::filesystem::create_directories(t / "plain" / "file");
  EXPECT_THROW(Dataset::create(t / "plain"), Error);
}

// A caching job: shard `id` holds global rows [id * kRows, (id + 1) * kRows), appended in small
// committed chunks from wherever the shard's committed rows end.
constexpr int64_t kShardRows = 3000;

TEST(DatasetChild, CacheShard) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  std::string arg = testing::child_arg();
  auto bar = arg.rfind('|');
  const int64_t id = std::stoll(arg.substr(bar + 1));
  TensorDict shard = Dataset::open(arg.substr(0, bar)).shard(id);
  shard.reserve(kShardRows);
  std::mt19937 rng(static_cast<unsigned>(getpid()));
  for (int64_t n = shard.batch_size()[0]; n < kShardRows;) {
    int64_t k = std::min<int64_t>(kShardRows - n, 1 + rng() % 40);
    testing::report("begin", n + k);
    append_rows(shard, id * kShardRows + n, k);
    testing::report("done", n + k);
    n += k;
  }
}

// Rows shard s of the dataset at dir holds committed (0 before a writer created it).
int64_t committed_rows(const std::filesystem::path& dir, int s) {
  const auto shard = dir / "shards" / storage::shard_dir_name(s);
  return std::filesystem::exists(shard) ? TensorDict::open(shard).batch_size()[0] : 0;
}

// Writers killed after their k-th begun chunk (one writer a round) leave their shards at their
// last commit; rerunning the job resumes every shard, and the published dataset holds every row
// exactly once. The kill lands wherever the writer got to: inside that chunk or a later one
// (its shard holds the chunk it last reported done, or the one it began if that commit
// finished first), between two chunks (the one last done), or after it completed its shard
// and exited. Rounds go on until 6 kills landed mid-chunk; a dataset whose shards are complete
// starts over.
TEST(Dataset, KilledWritersResumeAndNoRowIsLostOrRepeated) {
  TempDir t;
  const auto dir = t / "d";
  Dataset ds = Dataset::create(dir);
  std::mt19937 rng(5);
  testing::KillRounds rounds(6, 60);
  while (rounds.more()) {
    const int victim = rounds.rounds() % 3;
    const int64_t before = committed_rows(dir, victim);
    std::vector<testing::Child> writers;
    for (int s = 0; s < 3; ++s)
      writers.push_back(
          testing::Child::test("DatasetChild.CacheShard", dir.string() + "|" + std::to_string(s)));
    const int chunks = 1 + static_cast<int>(rng() % 20);
    int begun = 0;
    for (std::optional<testing::Event> e; begun < chunks && (e = writers[victim].next());)
      begun += e->name == "begin";
    testing::Killed k;
    if (begun == chunks) {
      k = writers[victim].kill();
    } else {  // the victim completed its shard before its k-th chunk
      k.code = writers[victim].wait();
      k.last_begin = writers[victim].last_begin(), k.last_done = writers[victim].last_done();
    }
    rounds.count(k);
    for (int s = 0; s < 3; ++s) {
      if (s == victim) continue;
      EXPECT_EQ(writers[s].wait(), 0)
          << "writer " << s << " was not killed: it completes its shard";
    }
    const int64_t held = committed_rows(dir, victim);
    EXPECT_TRUE(held == k.last_done.value_or(before) || (k.mid_operation && held == k.last_begin))
        << "writer " << victim << "'s shard holds " << held << " rows; " << k.landed();
    if (!k.signaled) {
      EXPECT_EQ(k.code, 0) << "writer " << victim << " exited by itself: it completed its shard";
      EXPECT_EQ(held, kShardRows);
    }
    ds.publish();  // whatever is committed, mid-job
    const DatasetInfo info =
        dataset_info(dir);  // a writer killed before creating its shard has none
    int64_t total = 0;
    // The published rows of each shard are a prefix of its share, in order.
    std::vector<at::Tensor> want;
    for (const auto& sh : info.shards) {
      want.push_back(at::arange(sh.shard * kShardRows, sh.shard * kShardRows + sh.rows, at::kLong));
      total += sh.rows;
    }
    ASSERT_EQ(ds.rows(), total);
    if (total > 0) {
      ASSERT_TRUE(at::equal(ds.index(at::arange(total, at::kLong)).get("id"), at::cat(want)));
    }
    if (total == 3 * kShardRows &&
        !rounds.done()) {  // start over, so that kills keep landing mid-job
      std::filesystem::remove_all(dir);
      ds = Dataset::create(dir);
    }
  }
  std::cerr << rounds.landings() << "\n";
  for (int s = 0; s < 3; ++s)  // the rerun finishes every shard
    EXPECT_EQ(testing::run_child("DatasetChild.CacheShard", dir.string() + "|" + std::to_string(s)),
              0);
  ds.publish();
  EXPECT_EQ(ds.shard_rows(), std::vector<int64_t>({kShardRows, kShardRows, kShardRows}));
  TensorDict all = ds.index(at::arange(3 * kShardRows, at::kLong));
  EXPECT_TRUE(at::equal(all.get("id"), at::arange(3 * kShardRows, at::kLong)));
  EXPECT_TRUE(at::equal(all.get("x"), rows(0, 3 * kShardRows).get("x")));
  for (int s = 0; s < 3; ++s) EXPECT_TRUE(Dataset::open(dir).shard(s).verify().empty());
}

// The same 100 rows in one shard, or in three of 30/0/70 rows (an empty shard between).
std::vector<at::Tensor> epoch_ids(Loader& loader) {
  std::vector<at::Tensor> out;
  for (TensorDict batch : loader) {
    EXPECT_TRUE(at::equal(batch.get("x"), rows(0, 100).get("x").index_select(0, batch.get("id"))))
        << "each row's keys come from the same row";
    out.push_back(batch.get("id"));
  }
  return out;
}

TEST(Dataset, ALoaderShufflesGlobalRowsTheSameWhateverTheShardLayout) {
  TempDir t;
  Dataset one = dataset_of(t / "one", {100}), three = dataset_of(t / "three", {30, 0, 70});
  for (int64_t world : {1, 2}) {
    std::vector<at::Tensor> all;
    for (int64_t rank = 0; rank < world; ++rank) {
      LoaderOptions o;
      o.batch_size = 16, o.seed = 7, o.rank = rank, o.world_size = world;
      Loader a(one, o), b(three, o);
      a.set_epoch(3), b.set_epoch(3);
      auto ia = epoch_ids(a), ib = epoch_ids(b);
      ASSERT_EQ(ia.size(), ib.size());
      for (size_t i = 0; i < ia.size(); ++i) EXPECT_TRUE(at::equal(ia[i], ib[i])) << "batch " << i;
      all.insert(all.end(), ib.begin(), ib.end());
    }
    at::Tensor seen = std::get<0>(at::cat(all).sort());
    EXPECT_TRUE(at::equal(seen, at::arange(100, at::kLong)))
        << "every row once per epoch over " << world << " ranks";
  }
}

TEST(Dataset, ALoaderReadsPublishedRowsAndNewOnesAfterRefresh) {
  TempDir t;
  Dataset ds = dataset_of(t / "d", {30, 20});
  TensorDict s0 = ds.shard(0);
  append_rows(s0, 1000, 10);  // committed, not published
  LoaderOptions o;
  o.batch_size = 64, o.shuffle = false;
  Loader loader(ds, o);
  EXPECT_EQ(loader.rows(), 50);
  auto ids = epoch_ids(loader);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_TRUE(at::equal(ids[0], at::arange(50, at::kLong)));
  Dataset writer = Dataset::open(t / "d");
  writer.publish();
  loader.set_epoch(1);
  EXPECT_EQ(loader.rows(), 50) << "this handle has not refreshed";
  ds.refresh();
  loader.set_epoch(2);
  EXPECT_EQ(loader.rows(), 60);
  LoaderOptions missing = o;
  missing.keys = {"nope"};
  EXPECT_THROW(Loader(ds, missing), KeyError);
}

TEST(Dataset, ALoaderResumesMidEpochAsOverAStore) {
  TempDir t;
  Dataset ds = dataset_of(t / "d", {40, 25, 35});
  LoaderOptions o;
  o.batch_size = 8, o.seed = 3, o.num_workers = 2;
  Loader full(ds, o);
  full.set_epoch(1);
  auto want = epoch_ids(full);
  Loader first(ds, o);
  first.set_epoch(1);
  LoaderPosition at;
  int taken = 0;
  for (TensorDict batch : first) {
    (void)batch;
    if (++taken == 5) {
      at = first.position();
      break;
    }
  }
  Loader resumed(ds, o);
  resumed.restore(at);
  auto rest = epoch_ids(resumed);
  ASSERT_EQ(rest.size(), want.size() - 5);
  for (size_t i = 0; i < rest.size(); ++i)
    EXPECT_TRUE(at::equal(rest[i], want[i + 5])) << "batch " << i + 5;
  LoaderOptions other = o;
  other.seed = 4;
  Loader wrong(ds, other);
  EXPECT_THROW(wrong.restore(at), Error) << "another seed is refused";
}

// Rows published into an earlier shard move every later shard's global row numbers: a position
// saved mid-epoch resumes with the rows the saved run would have handed out, by shard and
// local row, not by global number; through save()/load() too.
TEST(Dataset, AResumedEpochHandsOutTheSameRowsAfterAnEarlierShardGrew) {
  TempDir t;
  Dataset ds = dataset_of(t / "d", {30, 0, 40});
  LoaderOptions o;
  o.batch_size = 8, o.seed = 9, o.num_workers = 0;
  Loader full(ds, o);
  full.set_epoch(2);
  auto want = epoch_ids(full);  // ids name rows: row k of shard 2 has id 30 + k
  Loader first(ds, o);
  first.set_epoch(2);
  int taken = 0;
  for (TensorDict batch : first) {
    (void)batch;
    if (++taken == 3) break;
  }
  const LoaderPosition at = first.position();
  TensorDict saved = TensorDict::create(t / "positions", {});
  first.save(saved, "run");
  {
    Dataset writer = Dataset::open(t / "d");
    TensorDict s0 = writer.shard(0), s1 = writer.shard(1);
    append_rows(s0, 1000, 5);  // shard 0 grows: shard 2's rows move 5 global rows on
    append_rows(s1, 2000, 3);  // a shard between gets rows
    writer.publish();
  }
  ds.refresh();
  for (int via = 0; via < 2; ++via) {
    Loader resumed(ds, o);
    if (via == 0)
      resumed.restore(at);
    else
      ASSERT_TRUE(resumed.load(saved, "run"));
    std::vector<at::Tensor> rest;
    for (TensorDict batch : resumed) rest.push_back(batch.get("id"));
    ASSERT_EQ(rest.size(), want.size() - 3);
    for (size_t i = 0; i < rest.size(); ++i)
      EXPECT_TRUE(at::equal(rest[i], want[i + 3])) << "batch " << i + 3;
    resumed.set_epoch(3);
    EXPECT_EQ(resumed.rows(), 78) << "the next epoch plans over every published row";
  }
  LoaderPosition shrunk = at;
  shrunk.shards = {{0, 30}, {2, 50}};
  Loader refused(ds, o);
  EXPECT_NE(message_of([&] {
              refused.restore(shrunk);
            }).find("shard 2 now has 40 published rows, the position's epoch was planned over 50"),
            std::string::npos);
}

// Rows [from, from + n) with a ragged key: row i holds i % 4 tokens, token j of it is 10 i + j.
TensorDict ragged_rows(int64_t from, int64_t n) {
  TensorDict r({n});
  r.set("id", at::arange(from, from + n, at::kLong));
  std::vector<at::Tensor> tokens;
  for (int64_t i = from; i < from + n; ++i)
    tokens.push_back(at::arange(10 * i, 10 * i + i % 4, at::kLong));
  r.set_ragged("tokens", tokens);
  return r;
}

Dataset ragged_dataset_of(const std::filesystem::path& dir, const std::vector<int64_t>& split) {
  Dataset ds = Dataset::create(dir);
  int64_t at = 0;
  for (size_t s = 0; s < split.size(); ++s) {
    TensorDict shard = ds.shard(static_cast<int64_t>(s));
    if (split[s]) {
      shard.append(ragged_rows(at, split[s]));
      shard.commit();
    }
    at += split[s];
  }
  ds.publish();
  return ds;
}

TEST(Dataset, ALoaderReadsRaggedKeysTheSameWhateverTheShardLayout) {
  TempDir t;
  Dataset one = ragged_dataset_of(t / "one", {60}),
          three = ragged_dataset_of(t / "three", {25, 0, 35});
  TensorDict shard = three.shard(2);
  shard.append(ragged_rows(60, 5));  // committed, not published: never handed out
  shard.commit();
  LoaderOptions o;
  o.batch_size = 8, o.seed = 11;
  Loader a(one, o), b(three, o);
  std::vector<TensorDict> from_one;
  for (TensorDict batch : a) from_one.push_back(batch);
  size_t i = 0;
  std::vector<at::Tensor> seen;
  for (TensorDict batch : b) {
    ASSERT_LT(i, from_one.size());
    const TensorDict& want = from_one[i++];
    for (const char* k : {"id", "tokens", "tokens.lengths"})
      EXPECT_TRUE(at::equal(batch.get(k), want.get(k))) << "batch " << i - 1 << " key " << k;
    at::Tensor ids = batch.get("id"), padded = batch.get("tokens"),
               lengths = batch.get("tokens.lengths");
    for (int64_t r = 0; r < ids.numel(); ++r) {  // each row by content, its padding zero
      const int64_t id = ids[r].item<int64_t>();
      EXPECT_EQ(lengths[r].item<int64_t>(), id % 4) << "row " << id;
      for (int64_t j = 0; j < padded.size(1); ++j)
        EXPECT_EQ(padded[r][j].item<int64_t>(), j < id % 4 ? 10 * id + j : 0)
            << "row " << id << " token " << j;
    }
    seen.push_back(ids);
  }
  EXPECT_EQ(i, from_one.size());
  EXPECT_TRUE(at::equal(std::get<0>(at::cat(seen).sort()), at::arange(60, at::kLong)))
      << "published rows, once each";
}

// A feature over a dataset, x summed per row, counted each time a row is computed.
RowFeature x_sum(std::atomic<int64_t>& computed, std::string version = "v1") {
  return {"x_sum",
          {"x"},
          [&computed](const TensorDict& r) {
            computed += r.batch_size()[0];
            return r.get("x").sum(1);
          },
          std::move(version)};
}

int64_t check_x_sum(Loader& loader, int64_t stop_after = -1) {
  int64_t batches = 0;
  for (TensorDict batch : loader) {
    EXPECT_TRUE(at::equal(batch.get("x_sum"), batch.get("x").sum(1)))
        << "the feature of the batch's own rows";
    if (++batches == stop_after) break;
  }
  return batches;
}

TEST(Dataset, RowFeaturesAreComputedOnceStoredAndReadByTheNextRun) {
  TempDir t;
  dataset_of(t / "d", {40, 0, 60});
  std::atomic<int64_t> computed{0};
  LoaderOptions o;
  o.batch_size = 10, o.num_workers = 0;
  {
    Loader l(Dataset::open(t / "d"), o);
    EXPECT_FALSE(l.add_feature(x_sum(computed)));
    check_x_sum(l, 3);  // stopped early: its rows are kept by the destructor
  }
  EXPECT_EQ(computed, 30);
  EXPECT_TRUE(std::filesystem::exists(t / "d" / "features")) << "stored beside the shards";
  {
    Loader l(Dataset::open(t / "d"), o);
    EXPECT_FALSE(l.add_feature(x_sum(computed)));
    EXPECT_EQ(l.feature_rows_done("x_sum"), 30) << "resumed from the stored rows";
    for (int epoch = 0; epoch < 3; ++epoch) {
      l.set_epoch(epoch);
      check_x_sum(l);
    }
    EXPECT_EQ(computed, 100) << "each row once over all runs and epochs";
  }
  {
    Loader l(Dataset::open(t / "d"), o);
    EXPECT_TRUE(l.add_feature(x_sum(computed))) << "complete: read like a key";
    check_x_sum(l);
    EXPECT_EQ(computed, 100);
  }
  {
    Loader l(Dataset::open(t / "d"), o);
    EXPECT_FALSE(l.add_feature(x_sum(computed, "v2"))) << "another version of the function";
    check_x_sum(l);
    EXPECT_EQ(computed, 200);
  }
}

// What a dataset feature depends on, each changed in turn: a dep's content in one shard, the
// published rows; a dep that is not a published key (or ragged) is refused by name.
TEST(Dataset, ARowFeatureIsRecomputedWhenItsInputsChange) {
  TempDir t;
  Dataset ds = dataset_of(t / "d", {30, 20});
  std::atomic<int64_t> computed{0};
  LoaderOptions o;
  o.batch_size = 16, o.num_workers = 1;
  Loader l(ds, o);
  l.add_feature(x_sum(computed));
  check_x_sum(l);
  l.set_epoch(1);
  check_x_sum(l);
  EXPECT_EQ(computed, 50);
  {
    Dataset writer = Dataset::open(t / "d");
    TensorDict shard = writer.shard(1);
    shard.set("x", shard.get("x") * 2);  // same rows, new content in one shard
    shard.commit();
    writer.publish();
  }
  ds.refresh();
  l.set_epoch(2);
  check_x_sum(l);
  EXPECT_EQ(computed, 100) << "a dep rewritten in one shard";
  {
    Dataset writer = Dataset::open(t / "d");
    TensorDict shard = writer.shard(0);
    append_rows(shard, 50, 10);
    writer.publish();
  }
  l.set_epoch(3);
  check_x_sum(l);
  EXPECT_EQ(computed, 100) << "this handle has not refreshed: the same rows";
  ds.refresh();
  l.set_epoch(4);
  check_x_sum(l);
  EXPECT_EQ(computed, 160) << "new rows published: global row numbers moved";
  Loader next(Dataset::open(t / "d"), o);
  EXPECT_TRUE(next.add_feature(x_sum(computed))) << "the last state was stored complete";
  check_x_sum(next);
  EXPECT_EQ(computed, 160);

  Loader bad(ds, o);
  EXPECT_NE(message_of([&] {
              bad.add_feature({"f", {"nope"}, [](const TensorDict& r) { return r.get("x"); }, ""});
            }).find("dependency 'nope' is not a key of the published rows"),
            std::string::npos);
  Dataset rag = ragged_dataset_of(t / "r", {10});
  Loader ragged(rag, o);
  EXPECT_NE(
      message_of([&] {
        ragged.add_feature({"f", {"tokens"}, [](const TensorDict& r) { return r.get("id"); }, ""});
      }).find("dependency 'tokens' is ragged"),
      std::string::npos);
}

// Two ranks each compute the feature for their half of the rows; their flushes merge, so the
// feature ends complete for a third loader.
TEST(Dataset, RanksComputeDisjointRowsOfAFeatureAndCompleteItTogether) {
  TempDir t;
  dataset_of(t / "d", {45, 55});
  std::atomic<int64_t> computed{0};
  std::vector<std::thread> ranks;
  for (int64_t rank = 0; rank < 2; ++rank)
    ranks.emplace_back([&, rank] {
      LoaderOptions o;
      o.batch_size = 7, o.rank = rank, o.world_size = 2;
      Loader l(Dataset::open(t / "d"), o);
      l.add_feature(x_sum(computed));
      check_x_sum(l);
      const int64_t done =
          l.feature_rows_done("x_sum");  // its own rows, and the other's once merged
      EXPECT_TRUE(done == l.rows() || done == 100) << done;
    });
  for (auto& r : ranks) r.join();
  EXPECT_EQ(computed, 100) << "each row computed by one rank";
  LoaderOptions o;
  o.batch_size = 32;
  Loader all(Dataset::open(t / "d"), o);
  EXPECT_TRUE(all.add_feature(x_sum(computed))) << "the ranks' rows merged";
  EXPECT_EQ(check_x_sum(all), 4);
  EXPECT_EQ(computed, 100);
}

// ---- parallel caching over c10d (Gloo on loopback): Fashion-MNIST's 60,000 training rows

const std::filesystem::path kImages =
    "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
const std::filesystem::path kLabels =
    "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz";
constexpr int kRanks = 4;

// One rank: "<dataset>|<rendezvous file>|<timeout s>|<rank>". Rank r caches rows
// [r * 15000, (r + 1) * 15000) of the IDX files in committed chunks of 500, from where its
// shard ends, reporting each chunk. The timeout bounds the rendezvous and the barriers.
TEST(DatasetChild, CacheRank) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  std::string arg = testing::child_arg();
  std::vector<std::string> f;
  for (size_t p = 0, e; p <= arg.size(); p = e + 1)
    f.push_back(arg.substr(p, (e = std::min(arg.find('|', p), arg.size())) - p));
  ASSERT_EQ(f.size(), 4u) << arg;
  const std::string dir = f[0], rendezvous = f[1];
  const auto timeout = std::chrono::seconds(std::stoi(f[2]));
  const int rank = std::stoi(f[3]);
  auto store = c10::make_intrusive<c10d::FileStore>(rendezvous, kRanks);
  store->setTimeout(timeout);
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, kRanks, opts);
  Dataset ds = Dataset::open(dir);
  cache_in_parallel(ds, *group, [](TensorDict& shard, int64_t r, int64_t world) {
    at::Tensor images = read_idx(kImages), labels = read_idx(kLabels).to(at::kLong);
    const int64_t per = images.size(0) / world, begin = r * per, end = begin + per;
    shard.reserve(per);
    for (int64_t at = begin + shard.batch_size()[0]; at < end;) {
      const int64_t k = std::min<int64_t>(500, end - at);
      TensorDict chunk({k});
      chunk.set("image", images.slice(0, at, at + k));
      chunk.set("label", labels.slice(0, at, at + k));
      chunk.set("row", at::arange(at, at + k, at::kLong));
      testing::report("begin", at + k);
      shard.append(chunk);
      shard.commit();
      testing::report("done", at + k);
      at += k;
    }
  });
  EXPECT_EQ(ds.rows(), 60000) << "every rank sees the publish";
}

// Published rows, in global order, are each shard's first rows of its range: checked by content.
void expect_consistent(const Dataset& ds, const at::Tensor& images) {
  std::vector<at::Tensor> want;
  const auto per_shard = ds.shard_rows();
  for (size_t s = 0; s < per_shard.size(); ++s)
    want.push_back(at::arange(static_cast<int64_t>(s) * 15000,
                              static_cast<int64_t>(s) * 15000 + per_shard[s], at::kLong));
  if (ds.rows() == 0) return;
  at::Tensor rows_wanted = at::cat(want);
  TensorDict all = ds.index(at::arange(ds.rows(), at::kLong));
  ASSERT_TRUE(at::equal(all.get("row"), rows_wanted)) << "no row lost, repeated or out of place";
  ASSERT_TRUE(at::equal(all.get("image"), images.index_select(0, rows_wanted)))
      << "the bytes of the IDX file";
}

// Each round starts four ranks and kills one whose shard is incomplete after its k-th begun
// chunk (counted in its reports). Where that kill lands decides what the round must show:
// - the victim died inside a chunk, or between two chunks before its last one was done: it
//   never reached the first barrier, so every other rank fails in a barrier and nothing is
//   published; its shard holds the chunk it last reported done (or the one it began, if that
//   commit finished before the kill);
// - it died after reporting its last chunk done (the parent, descheduled, sent the kill late):
//   its shard is complete, and the kill landed before, in, between or after the barriers; the
//   dataset publishes all 60,000 rows or nothing new, and a rank that got through both barriers
//   saw the 60,000 published;
// - it exited by itself first: the round ran to its end like any other.
// Rounds go on until 20 kills landed mid-chunk (TDSTORE_KILL_ROUNDS); when every shard is
// complete, a round without a kill publishes and the dataset starts over.
TEST(Dataset, FourRanksCacheFashionMnistOverGlooAndSurviveKills) {
  if (!std::filesystem::exists(kImages)) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  TempDir t;
  const auto dir = t / "fmnist";
  Dataset::create(dir);
  const at::Tensor images = read_idx(kImages);
  std::mt19937 rng(2024);
  const int wanted =
      std::getenv("TDSTORE_KILL_ROUNDS") ? std::atoi(std::getenv("TDSTORE_KILL_ROUNDS")) : 20;
  testing::KillRounds rounds(wanted, 3 * wanted + 10);
  int starts = 0, in_job = 0, after_job = 0, after_job_published = 0;
  auto start_ranks = [&] {  // a fresh rendezvous file each time: a used one holds stale addresses
    const std::string rendezvous = (t / ("rendezvous" + std::to_string(starts++))).string();
    std::vector<testing::Child> ranks;
    for (int r = 0; r < kRanks; ++r)
      ranks.push_back(testing::Child::test(
          "DatasetChild.CacheRank", dir.string() + "|" + rendezvous + "|120|" + std::to_string(r)));
    return ranks;
  };
  while (rounds.more()) {
    std::vector<int> incomplete;
    std::vector<int64_t> chunks_left;
    for (int r = 0; r < kRanks; ++r) {
      chunks_left.push_back((15000 - committed_rows(dir, r) + 499) / 500);
      if (chunks_left.back() > 0) incomplete.push_back(r);
    }
    const int64_t published = Dataset::open(dir).rows();
    std::vector<testing::Child> ranks = start_ranks();
    if (incomplete.empty()) {  // every shard complete: this round publishes them; then start over
      for (auto& rank : ranks) EXPECT_EQ(rank.wait(), 0) << "a rank of a complete dataset failed";
      Dataset ds = Dataset::open(dir);
      EXPECT_EQ(ds.rows(), 60000);
      expect_consistent(ds, images);
      std::filesystem::remove_all(dir);
      Dataset::create(dir);
      continue;
    }
    const int victim = incomplete[rng() % incomplete.size()];
    const int64_t first = victim * 15000, held_before = committed_rows(dir, victim);
    ASSERT_TRUE(ranks[victim].wait_for("begin", 1 + static_cast<int>(rng() % chunks_left[victim])))
        << "rank " << victim;
    const testing::Killed k = ranks[victim].kill();
    rounds.count(k);
    std::vector<int> codes(kRanks, 0);
    for (int r = 0; r < kRanks; ++r)
      if (r != victim) codes[r] = ranks[r].wait();
    // The victim's shard: the rows of the chunk it last reported done (reports count global
    // rows), or of the one it began if that commit finished before the kill.
    const int64_t held = committed_rows(dir, victim),
                  done = k.last_done.value_or(first + held_before);
    EXPECT_TRUE(held == done - first || (k.mid_operation && held == *k.last_begin - first))
        << "rank " << victim << "'s shard holds " << held << " rows; " << k.landed();
    Dataset ds = Dataset::open(dir);
    expect_consistent(ds, images);
    if (k.signaled && (k.mid_operation || done < first + 15000)) {  // it never reached a barrier
      ++in_job;
      for (int r = 0; r < kRanks; ++r) {
        if (r == victim) continue;
        EXPECT_NE(codes[r], 0) << "rank " << r << " went past the barrier of a peer killed in its "
                               << "job (rank " << victim << ", " << k.landed() << ")";
      }
      EXPECT_EQ(ds.rows(), published) << "nothing is published in a round with a rank killed "
                                      << "in its job (" << k.landed() << ")";
    } else if (k.signaled) {  // killed after its job: before, in, between or after the barriers
      ++after_job, after_job_published += ds.rows() != published;
      EXPECT_EQ(held, 15000) << k.landed();
      EXPECT_TRUE(ds.rows() == published || ds.rows() == 60000)
          << ds.rows() << " rows published; " << k.landed();
      for (int r = 0; r < kRanks; ++r) {
        if (r == victim || codes[r] != 0) continue;
        EXPECT_EQ(ds.rows(), 60000) << "rank " << r << " got through both barriers, so rank 0 "
                                    << "published (" << k.landed() << ")";
      }
    } else {  // it exited by itself: a whole round
      EXPECT_EQ(k.code, 0) << "rank " << victim;
      for (int r = 0; r < kRanks; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
      EXPECT_EQ(ds.rows(), 60000);
    }
    if (HasFailure()) return;
  }
  std::cerr << rounds.landings() << "; " << in_job << " kills in a rank's job, " << after_job
            << " after it (" << after_job_published << " of these rounds published)\n";
  std::vector<testing::Child> ranks = start_ranks();  // the rerun completes the job
  for (auto& rank : ranks) EXPECT_EQ(rank.wait(), 0) << "the rerun completes every shard";
  Dataset ds = Dataset::open(dir);
  expect_consistent(ds, images);
  EXPECT_EQ(ds.rows(), 60000);
  EXPECT_EQ(ds.shard_rows(), std::vector<int64_t>({15000, 15000, 15000, 15000}));
  TensorDict all = ds.index(at::arange(60000, at::kLong));
  EXPECT_TRUE(at::equal(all.get("image"), images));
  EXPECT_TRUE(at::equal(all.get("label"), read_idx(kLabels).to(at::kLong)));
  for (int s = 0; s < kRanks; ++s)
    EXPECT_TRUE(TensorDict::open(dir / "shards" / storage::shard_dir_name(s)).verify().empty());
}

}  // namespace
}  // namespace tdstore
