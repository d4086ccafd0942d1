// TensorDict::close and Dataset::close: every handle sharing the state is closed at once, the
// writer lock and mapping are released now, views handed out stay valid, later calls throw
// ClosedError naming the store.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include "tdstore/tdstore.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

using testing::TempDir;

template <class F>
std::string closed_message(F f) {
  try {
    f();
  } catch (const ClosedError& e) {
    return e.what();
  }
  return "no ClosedError";
}

TEST(Close, ClosesEveryHandleAndReleasesTheWriterLock) {
  TempDir t;
  const auto dir = t / "s";
  TensorDict td = TensorDict::create(dir, {4});
  td.set("x", at::arange(4));
  td.set("n/y", at::ones({4, 2}));
  td.commit();
  td.set("staged", at::ones({4}));  // not committed: discarded by close()
  TensorDict copy = td;
  TensorDict sub = td.sub("n");
  at::Tensor view = td.get("x");
  EXPECT_THROW(TensorDict::open(dir, OpenMode::ReadWrite), LockError);
  sub.close();  // through any handle
  EXPECT_TRUE(td.closed() && copy.closed() && sub.closed());
  EXPECT_TRUE(at::equal(view, at::arange(4))) << "a view handed out stays valid";
  for (const std::string& m :
       {closed_message([&] { td.get("x"); }), closed_message([&] { (void)copy.keys(); }),
        closed_message([&] { sub.get("y"); }), closed_message([&] { td.commit(); })})
    EXPECT_NE(m.find(dir.string()), std::string::npos) << m;
  EXPECT_NO_THROW(td.close()) << "idempotent";
  EXPECT_EQ(td.to_string(), "TensorDict(closed, was " + dir.string() + ")");

  TensorDict w = TensorDict::open(dir, OpenMode::ReadWrite);  // the lock is free, handles alive
  EXPECT_EQ(w.keys(), (std::vector<std::string>{"n/y", "x"})) << "staged key discarded";
}

TEST(Close, InMemoryDictsAndLoadersOverAClosedDict) {
  TensorDict mem({3});
  mem.set("a", at::ones({3}));
  Loader loader(mem, [] {
    LoaderOptions o;
    o.batch_size = 2;
    return o;
  }());
  mem.close();
  EXPECT_TRUE(mem.closed());
  EXPECT_NE(closed_message([&] { loader.set_epoch(1); }), "no ClosedError");
  EXPECT_EQ(mem.to_string(), "TensorDict(closed, was in-memory TensorDict)");
}

TEST(Close, ALoaderWithoutFeaturesOutlivesItsClosedStoreQuietly) {
  TempDir t;
  TensorDict td = TensorDict::create(t / "s", {4});
  td.set("a", at::ones({4}));
  td.commit();
  ::testing::internal::CaptureStderr();
  {
    Loader loader(td, [] {
      LoaderOptions o;
      o.batch_size = 2;
      return o;
    }());
    for (TensorDict b : loader) EXPECT_EQ(b.batch_size()[0], 2);
    td.close();
  }  // nothing to store: the closed store is not touched, nothing is reported
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(Close, DatasetClosesItsReadersNotItsShards) {
  TempDir t;
  Dataset ds = Dataset::create(t / "d");
  TensorDict shard = ds.shard(0);
  TensorDict rows({5});
  rows.set("x", at::arange(5));
  shard.append(rows);
  shard.commit();
  ds.publish();
  Dataset copy = ds;
  ds.close();
  EXPECT_TRUE(copy.closed());
  EXPECT_NE(closed_message([&] { (void)copy.rows(); }).find((t / "d").string()), std::string::npos);
  EXPECT_FALSE(shard.closed()) << "a shard handle is its own dict";
  EXPECT_EQ(shard.batch_size()[0], 5);
  Dataset again = Dataset::open(t / "d");
  EXPECT_EQ(again.rows(), 5);
}

}  // namespace
}  // namespace tdstore
