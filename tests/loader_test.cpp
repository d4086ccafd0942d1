// Loader: every row once per epoch, determinism, sharding, resume, row-wise lazy features.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <set>

#include "tdstore/tdstore.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace loader_test {

using testing::TempDir;

TensorDict numbered(int64_t n) {
  TensorDict td({n});
  td.set("id", at::arange(n, at::kLong));
  td.set("x", at::arange(n * 4, at::kFloat).reshape({n, 2, 2}));
  return td;
}

// The ids a loader hands out in one epoch, in order.
at::Tensor epoch_ids(Loader& loader) {
  std::vector<at::Tensor> parts;
  for (TensorDict batch : loader) {
    EXPECT_TRUE(at::equal(batch.get("x"), (batch.get("id") * 4).to(at::kFloat).view({-1, 1, 1}) +
                                              at::arange(4, at::kFloat).reshape({1, 2, 2})))
        << "rows of different keys stay aligned";
    parts.push_back(batch.get("id"));
  }
  return parts.empty() ? at::zeros({0}, at::kLong) : at::cat(parts);
}

TEST(Loader, EveryRowOncePerEpochDeterministically) {
  auto td = numbered(1000);
  LoaderOptions o;
  o.batch_size = 64;
  o.seed = 7;
  Loader a(td, o), b(td, o);
  EXPECT_EQ(a.size(), 16);
  at::Tensor e0 = epoch_ids(a);
  EXPECT_TRUE(at::equal(std::get<0>(at::sort(e0)), at::arange(1000, at::kLong)));
  EXPECT_FALSE(at::equal(e0, at::arange(1000, at::kLong))) << "shuffled";
  EXPECT_TRUE(at::equal(e0, epoch_ids(b))) << "same seed, same epoch, same order";
  a.set_epoch(1);
  at::Tensor e1 = epoch_ids(a);
  EXPECT_FALSE(at::equal(e0, e1)) << "a new epoch reshuffles";
  b.set_epoch(1);
  EXPECT_TRUE(at::equal(e1, epoch_ids(b)));
  o.shuffle = false;
  o.drop_last = true;
  Loader c(td, o);
  EXPECT_EQ(c.size(), 15);
  EXPECT_TRUE(at::equal(epoch_ids(c), at::arange(960, at::kLong)));
}

// loader.h: LoaderOrder::Sequential is "rows in order (also what shuffle = false asks for)",
// whatever shuffle says; it once drew a permutation when shuffle stayed true.
TEST(Loader, TheSequentialOrderVisitsRowsInOrderWithShuffleLeftOn) {
  auto td = numbered(100);
  LoaderOptions o;
  o.batch_size = 16;
  o.order = LoaderOrder::Sequential;
  ASSERT_TRUE(o.shuffle);
  Loader a(td, o);
  EXPECT_TRUE(at::equal(epoch_ids(a), at::arange(100, at::kLong)));
  a.set_epoch(3);
  EXPECT_TRUE(at::equal(epoch_ids(a), at::arange(100, at::kLong)));
}

TEST(Loader, AnEpochReadsTheSourceAsItWasSet) {
  TensorDict td({50});
  td.set("id", at::arange(50, at::kLong));
  td.set(
      "t",
      at::arange(100, at::kFloat).reshape({2, 50}).t());  // not contiguous: copied once per epoch
  LoaderOptions o;
  o.batch_size = 8;
  Loader loader(td, o);
  loader.set_epoch(0);
  int64_t batches = 0;
  for (TensorDict b : loader) {
    at::Tensor ids = b.get("id");
    EXPECT_TRUE(b.get("t").is_contiguous());
    EXPECT_TRUE(at::equal(b.get("t"), td.get("t").index_select(0, ids))) << "rows stay aligned";
    if (batches++ == 0) td.set("id", at::arange(50, at::kLong) + 1000);  // a write during the epoch
    EXPECT_LT(ids.max().item<int64_t>(), 1000) << "the epoch reads the source as it was set";
  }
  EXPECT_EQ(batches, 7);
  loader.set_epoch(1);
  for (TensorDict b : loader)
    EXPECT_GE(b.get("id").min().item<int64_t>(), 1000) << "seen from the next epoch";
}

TEST(Loader, WritesAndCommitsToAStoreDuringAnEpochChangeNoneOfItsBatches) {
  TempDir dir;
  TensorDict td = TensorDict::create(dir / "s", {40});
  td.set("id", at::arange(40, at::kLong));
  td.commit();
  LoaderOptions o;
  o.batch_size = 8;
  Loader loader(td, o);
  loader.set_epoch(0);
  int64_t batches = 0, rows = 0;
  for (TensorDict b : loader) {
    if (batches++ == 0) {  // each batch after this one is gathered after the writes
      td.set("id", at::arange(40, at::kLong) + 1000);  // same shape and dtype: a replacement
      td.commit();
      TensorDict more({10});
      more.set("id", at::arange(10, at::kLong) + 2000);
      td.append(more);
      td.commit();
    }
    EXPECT_LT(b.get("id").max().item<int64_t>(), 40) << "the epoch reads the store as it was set";
    rows += b.batch_size()[0];
  }
  EXPECT_EQ(rows, 40);
  loader.set_epoch(1);
  rows = 0;
  for (TensorDict b : loader) {
    EXPECT_GE(b.get("id").min().item<int64_t>(), 1000) << "seen from the next epoch";
    rows += b.batch_size()[0];
  }
  EXPECT_EQ(rows, 50);
}

TEST(Loader, WorkerCountDoesNotChangeBatches) {
  auto td = numbered(777);
  LoaderOptions o;
  o.batch_size = 50;
  o.seed = 3;
  o.num_workers = 0;
  Loader sync(td, o);
  o.num_workers = 3;
  o.prefetch = 2;
  Loader threaded(td, o);
  EXPECT_TRUE(at::equal(epoch_ids(sync), epoch_ids(threaded)));
}

TEST(Loader, RanksShareEachEpochExactlyOnce) {
  auto td = numbered(1001);
  std::vector<at::Tensor> seen;
  for (int64_t r = 0; r < 3; ++r) {
    LoaderOptions o;
    o.batch_size = 32;
    o.seed = 5;
    o.rank = r;
    o.world_size = 3;
    Loader l(td, o);
    l.set_epoch(2);
    seen.push_back(epoch_ids(l));
    EXPECT_EQ(l.rows(), seen.back().numel());
  }
  EXPECT_TRUE(at::equal(std::get<0>(at::sort(at::cat(seen))), at::arange(1001, at::kLong)));
  LoaderOptions bad;
  bad.rank = 3;
  bad.world_size = 3;
  EXPECT_THROW(Loader(td, bad), Error);
}

TEST(Loader, ResumesFromASavedPosition) {
  TempDir t;
  auto src = TensorDict::create(t / "s", {500});
  src.update(numbered(500));
  src.commit();
  LoaderOptions o;
  o.batch_size = 40;
  o.seed = 11;
  at::Tensor uninterrupted;
  {
    Loader full(src, o);
    full.set_epoch(3);
    uninterrupted = epoch_ids(full);
  }
  std::vector<at::Tensor> parts;
  {
    Loader first(src, o);
    first.set_epoch(3);
    int taken = 0;
    for (TensorDict batch : first) {
      parts.push_back(batch.get("id"));
      if (++taken == 5) break;
    }
    first.save(src, "train");
    EXPECT_EQ(first.position().step, 5);
  }
  auto reopened = TensorDict::open(t / "s");
  Loader second(reopened, o);
  ASSERT_TRUE(second.load(reopened, "train"));
  EXPECT_EQ(second.position().epoch, 3);
  parts.push_back(epoch_ids(second));
  EXPECT_TRUE(at::equal(at::cat(parts), uninterrupted)) << "the same remaining batches";
  LoaderOptions other = o;
  other.seed = 12;
  Loader wrong(reopened, other);
  EXPECT_THROW(wrong.load(reopened, "train"), Error);
}

// Loads position "train" into a loader with options `o`; the error's message, or "" on success.
std::string load_error(TensorDict& store, const LoaderOptions& o) {
  Loader l(store, o);
  try {
    l.load(store, "train");
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(Loader, RefusesAPositionOfAnotherStream) {
  TempDir t;
  auto src = TensorDict::create(t / "s", {300});
  src.update(numbered(300));
  src.commit();
  LoaderOptions o;
  o.batch_size = 32;
  o.seed = 4;
  o.rank = 1;
  o.world_size = 2;
  {
    Loader l(src, o);
    l.set_epoch(2);
    auto it = l.begin();
    ++it;
    l.save(src, "train");
  }
  EXPECT_EQ(load_error(src, o), "");
  struct Case {
    const char* field;
    std::function<void(LoaderOptions&)> change;
  };
  std::vector<Case> cases = {
      {"seed", [](LoaderOptions& x) { x.seed = 5; }},
      {"batch_size", [](LoaderOptions& x) { x.batch_size = 16; }},
      {"rank", [](LoaderOptions& x) { x.rank = 0; }},
      {"world_size", [](LoaderOptions& x) { x.world_size = 3; }},
      {"shuffle", [](LoaderOptions& x) { x.shuffle = false; }},
      {"drop_last", [](LoaderOptions& x) { x.drop_last = true; }},
      // Sequential with shuffle left true visits rows in order (kSequentialOrderVersion): a
      // Random position (scheme 1, which drew a permutation for it too) is another scheme.
      {"permutation scheme", [](LoaderOptions& x) { x.order = LoaderOrder::Sequential; }},
  };
  for (const auto& c : cases) {
    LoaderOptions other = o;
    c.change(other);
    std::string why = load_error(src, other);
    EXPECT_NE(why.find(std::string("saved with ") + c.field), std::string::npos)
        << c.field << ": " << why;
    EXPECT_NE(why.find((t / "s").string()), std::string::npos) << why;
  }
  // A position of another permutation scheme, or one that is not a position at all.
  src.set_attr("loader/train", R"({"seed": 4, "epoch": 2, "step": 2, "order": 99})");
  src.commit();
  EXPECT_NE(load_error(src, o).find("permutation scheme"), std::string::npos);
  src.set_attr("loader/train", "{\"seed\": 4");
  src.commit();
  Loader l(src, o);
  try {
    l.load(src, "train");
    FAIL() << "expected CorruptionError";
  } catch (const CorruptionError& e) {
    EXPECT_NE(std::string(e.what()).find("loader/train"), std::string::npos) << e.what();
  }
}

TEST(Loader, NewRowsJoinAtTheNextEpoch) {
  TempDir t;
  auto writer = TensorDict::create(t / "s", {100});
  writer.update(numbered(100));
  writer.commit();
  auto reader = TensorDict::open(t / "s");
  LoaderOptions o;
  o.batch_size = 16;
  o.seed = 9;
  Loader on_writer(writer, o), on_reader(reader, o);
  EXPECT_EQ(epoch_ids(on_writer).numel(), 100);
  EXPECT_EQ(epoch_ids(on_reader).numel(), 100);
  writer.append(numbered(150).index(at::arange(100, 150, at::kLong)));
  writer.commit();
  on_writer.set_epoch(1);
  EXPECT_EQ(on_writer.rows(), 150);
  at::Tensor ids = epoch_ids(on_writer);
  EXPECT_TRUE(at::equal(std::get<0>(at::sort(ids)), at::arange(150, at::kLong)))
      << "appended rows are handed out";
  // A row feature covers the new rows too: computed for them, never read from the old extent.
  Loader featured(writer, o);
  featured.add_feature(
      {"id_x2", {"id"}, [](const TensorDict& rows) { return rows.get("id") * 2; }, "v1"});
  for (TensorDict batch : featured) EXPECT_TRUE(at::equal(batch.get("id_x2"), batch.get("id") * 2));
  writer.append(numbered(170).index(at::arange(150, 170, at::kLong)));
  writer.commit();
  featured.set_epoch(1);
  int64_t seen = 0;
  for (TensorDict batch : featured) {
    EXPECT_TRUE(at::equal(batch.get("id_x2"), batch.get("id") * 2));
    seen += batch.batch_size()[0];
  }
  EXPECT_EQ(seen, 170);
  EXPECT_EQ(featured.feature_rows_done("id_x2"), 170);
  on_reader.set_epoch(1);
  EXPECT_EQ(on_reader.rows(), 100) << "a reader sees what it has refreshed to";
  ASSERT_TRUE(reader.refresh());
  on_reader.set_epoch(1);
  EXPECT_EQ(on_reader.rows(), 170);
}

TEST(Loader, ResumesAnEpochOverTheRowsItWasPlannedOver) {
  TempDir t;
  auto src = TensorDict::create(t / "s", {200});
  src.update(numbered(200));
  src.commit();
  LoaderOptions o;
  o.batch_size = 30;
  o.seed = 2;
  at::Tensor uninterrupted;
  {
    Loader full(src, o);
    uninterrupted = epoch_ids(full);
  }
  std::vector<at::Tensor> parts;
  {
    Loader first(src, o);
    int taken = 0;
    for (TensorDict batch : first) {
      parts.push_back(batch.get("id"));
      if (++taken == 3) break;
    }
    first.save(src, "train");
  }
  src.append(numbered(260).index(at::arange(200, 260, at::kLong)));  // grows while the run is down
  src.commit();
  Loader second(src, o);
  ASSERT_TRUE(second.load(src, "train"));
  EXPECT_EQ(second.rows(), 200);
  parts.push_back(epoch_ids(second));
  EXPECT_TRUE(at::equal(at::cat(parts), uninterrupted)) << "the rest of the interrupted epoch";
  second.set_epoch(1);
  EXPECT_EQ(second.rows(), 260);
  // A store that now has fewer rows than the interrupted epoch cannot finish it.
  TempDir u;
  auto small = TensorDict::create(u / "s", {100});
  small.update(numbered(100));
  small.set_attr("loader/train", *src.attr("loader/train"));
  small.commit();
  EXPECT_NE(load_error(small, o).find("over 200 rows; the source now has 100"), std::string::npos);
}

// Every input of a feature is checked at each set_epoch, not only the row count: a dep
// rewritten between epochs (same rows) makes the loader recompute, in the same run.
TEST(Loader, ARowFeatureIsRecomputedWhenItsDepChangesBetweenEpochs) {
  TempDir t;
  auto src = TensorDict::create(t / "s", {50});
  src.update(numbered(50));
  src.commit();
  int64_t computed = 0;
  LoaderOptions o;
  o.batch_size = 16, o.num_workers = 0;
  Loader l(src, o);
  l.add_feature({"x_sum",
                 {"x"},
                 [&](const TensorDict& rows) {
                   computed += rows.batch_size()[0];
                   return rows.get("x").sum({1, 2});
                 },
                 "v1"});
  auto check = [&] {
    for (TensorDict batch : l)
      EXPECT_TRUE(at::allclose(batch.get("x_sum"), batch.get("x").sum({1, 2})));
  };
  check();
  EXPECT_EQ(computed, 50);
  l.set_epoch(1);
  check();
  EXPECT_EQ(computed, 50) << "unchanged inputs: reused";
  src.set("x", src.get("x") * 3);
  src.commit();
  l.set_epoch(2);
  check();
  EXPECT_EQ(computed, 100) << "a changed dep: every row recomputed";
  l.set_epoch(3);
  check();
  EXPECT_EQ(computed, 100);
  ASSERT_TRUE(src.lazy_info("x_sum")->valid) << "stored complete at the end of epoch 2";
  src.set("x_sum", at::zeros({50}));  // the stored feature itself overwritten
  src.commit();
  l.set_epoch(4);
  check();
  EXPECT_EQ(computed, 150) << "an overwritten feature is recomputed, not read";
  src.erase("x_sum");
  src.commit();
  l.set_epoch(5);
  check();
  EXPECT_EQ(computed, 200) << "an erased one too";
}

TEST(Loader, RowFeaturesAreComputedOnceAndStored) {
  TempDir t;
  {
    auto src = TensorDict::create(t / "s", {300});
    src.update(numbered(300));
    src.commit();
  }
  std::atomic<int64_t> computed{0};
  auto feature = [&] {
    return RowFeature{"x_scaled",
                      {"x"},
                      [&](const TensorDict& rows) {
                        computed += rows.batch_size()[0];
                        return rows.get("x") / 10;
                      },
                      "v1"};
  };
  LoaderOptions o;
  o.batch_size = 32;
  int64_t first_run = 0;
  {
    auto src = TensorDict::open(t / "s", OpenMode::ReadWrite);
    Loader l(src, o);
    EXPECT_FALSE(l.add_feature(feature()));
    int b = 0;
    for (TensorDict batch : l) {  // a run stopped after 4 batches: partial progress is kept
      EXPECT_TRUE(at::allclose(batch.get("x_scaled"), batch.get("x") / 10));
      if (++b == 4) break;
    }
  }
  // Workers gather (and compute) ahead of the consumer: at least the 4 batches, maybe more.
  first_run = computed;
  EXPECT_GE(first_run, 128);
  EXPECT_LT(first_run, 300);
  {
    auto src = TensorDict::open(t / "s", OpenMode::ReadWrite);
    Loader l(src, o);
    EXPECT_FALSE(l.add_feature(feature()));
    EXPECT_EQ(l.feature_rows_done("x_scaled"), first_run) << "resumed from the stored rows";
    for (int epoch = 0; epoch < 3; ++epoch) {
      l.set_epoch(epoch);
      for (TensorDict batch : l)
        EXPECT_TRUE(at::allclose(batch.get("x_scaled"), batch.get("x") / 10));
    }
    EXPECT_EQ(computed, 300) << "each row computed once over all epochs and runs";
  }
  {
    auto src = TensorDict::open(t / "s");
    EXPECT_TRUE(src.lazy_info("x_scaled")->valid);
    EXPECT_FALSE(src.contains("x_scaled.rows_done"));
    Loader l(src, o);
    EXPECT_TRUE(l.add_feature(feature())) << "a later run reads it";
    for (TensorDict batch : l)
      EXPECT_TRUE(at::allclose(batch.get("x_scaled"), batch.get("x") / 10));
    EXPECT_EQ(computed, 300);
  }
  {
    auto src = TensorDict::open(t / "s", OpenMode::ReadWrite);
    src.set("x", src.get("x") + 1);  // the dep changes: recomputed
    src.commit();
    Loader l(src, o);
    EXPECT_FALSE(l.add_feature(feature()));
    for (TensorDict batch : l)
      EXPECT_TRUE(at::allclose(batch.get("x_scaled"), batch.get("x") / 10));
    EXPECT_EQ(computed, 600);
  }
}

TEST(Loader, OverASubDictLoadsItsKeysNamedRelativeToIt) {
  TensorDict td({6});
  td.set("obs/x", at::arange(6, at::kFloat));
  td.set("obs/y", at::arange(6, at::kLong));
  td.set("other", at::zeros({6}));
  LoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  Loader l(td.sub("obs"), o);
  int64_t seen = 0;
  for (TensorDict batch : l) {
    EXPECT_EQ(batch.keys(), (std::vector<std::string>{"x", "y"}));
    EXPECT_TRUE(at::equal(batch.get("x").to(at::kLong), batch.get("y")));
    seen += batch.batch_size()[0];
  }
  EXPECT_EQ(seen, 6);
  EXPECT_THROW(l.add_feature({"x2", {"x"}, [](const TensorDict& r) { return r.get("x"); }, "v"}),
               Error);
}

TEST(Loader, BatchSizeNearInt64MaxIsOneBatch) {
  auto td = numbered(10);
  LoaderOptions o;
  o.batch_size = INT64_MAX;
  Loader l(td, o);
  EXPECT_EQ(l.size(), 1);
  EXPECT_EQ(epoch_ids(l).numel(), 10);
  o.drop_last = true;
  Loader dropped(td, o);
  EXPECT_EQ(dropped.size(), 0);
}

TEST(Loader, AKeyNamedLikeARaggedKeysLengthsIsRefused) {
  TensorDict td({3});
  td.set_ragged("tok", std::vector<at::Tensor>{at::ones({1}), at::ones({2}), at::ones({3})});
  td.set("tok.lengths", at::zeros({3}, at::kLong));
  EXPECT_THROW(Loader(td, {}), KeyError);
  LoaderOptions o;
  o.keys = {"tok"};
  Loader l(td, o);  // one of them left out: fine
  for (TensorDict batch : l)
    EXPECT_EQ(batch.keys(), (std::vector<std::string>{"tok", "tok.lengths"}));
}

TEST(Loader, AddFeatureDuringAnEpochIsRefusedAndAfterItWorks) {
  auto td = numbered(100);
  LoaderOptions o;
  o.batch_size = 10;
  o.num_workers = 2;
  Loader l(td, o);
  auto id2 = [](const TensorDict& r) { return r.get("id") * 2; };
  int64_t batches = 0;
  for (TensorDict batch : l) {
    if (++batches == 3) {
      EXPECT_THROW(l.add_feature({"id2", {"id"}, id2, "v"}), Error);
    }
  }
  EXPECT_EQ(batches, 10);
  EXPECT_FALSE(l.add_feature({"id2", {"id"}, id2, "v"}));
  l.set_epoch(1);
  for (TensorDict batch : l) EXPECT_TRUE(at::equal(batch.get("id2"), batch.get("id") * 2));
}

// Batches are gathered into memory reused from released batches: a batch still held is never
// written again, whichever thread or epoch gathers next, and it stays valid after its loader is
// gone.
TEST(Loader, HeldBatchesKeepTheirRowsWhileReleasedOnesAreReused) {
  const int64_t n = 1000;
  TensorDict td = numbered(n);
  for (int workers : {0, 2}) {
    std::vector<TensorDict> held;
    {
      LoaderOptions o;
      o.batch_size = 32, o.seed = 3, o.num_workers = workers, o.prefetch = 2;
      Loader l(td, o);
      for (int64_t e = 0; e < 3; ++e) {
        l.set_epoch(e);
        int64_t i = 0;
        for (TensorDict batch : l)
          if (i++ % 3 == 0) held.push_back(batch);  // one in three kept, the rest released
      }
    }  // the loader (and its free buffers) gone; the held batches still own theirs
    ASSERT_EQ(held.size(), 3u * 11);
    for (const TensorDict& b : held) {
      at::Tensor id = b.get("id");
      EXPECT_TRUE(at::equal(b.get("x"), td.get("x").index_select(0, id)))
          << "workers " << workers << ": a held batch was overwritten";
    }
  }
}

TEST(Loader, ReleasedBatchMemoryIsReusedWithinItsBound) {
  TensorDict td = numbered(6400);
  for (int workers : {0, 2}) {
    const int prefetch = 3;
    LoaderOptions o;
    o.batch_size = 64, o.seed = 1, o.num_workers = workers, o.prefetch = prefetch;
    Loader l(td, o);
    std::set<const void*> buffers;
    for (int64_t e = 0; e < 2; ++e) {
      l.set_epoch(e);
      for (TensorDict batch : l) buffers.insert(batch.get("x").data_ptr());
    }
    // 200 batches, each released before the next: at most the batches in flight at once
    // (prefetched, gathered, the consumer's) ever had memory of their own.
    EXPECT_LE(buffers.size(), static_cast<size_t>(prefetch + workers + 2)) << "workers " << workers;
  }
}

}  // namespace loader_test
}  // namespace tdstore
