// Operations that write several keys apply whole or not at all (append, set_ragged, a dense
// value replacing a ragged key, a lazy property and its provenance), and handles that were
// moved from throw tdstore::Error instead of crashing.
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include "tdstore/tdstore.h"
#include "tests/fault_env.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace write_group_test {

using testing::TempDir;

constexpr int64_t kMiB = int64_t{1} << 20;

// Rows [start, start + n): "a" [n] float (small), "b" [n, 64 Ki] uint8 (64 KiB a row).
TensorDict big_rows(int64_t start, int64_t n) {
  TensorDict td({n});
  td.set("a", at::arange(start, start + n, at::kFloat));
  td.set("b", at::arange(start, start + n, at::kByte).unsqueeze(1).repeat({1, 64 * 1024}));
  return td;
}

void expect_state(const TensorDict& td, int64_t n) {
  TensorDict want = big_rows(0, n);
  ASSERT_EQ(td.batch_size(), std::vector<int64_t>{n});
  EXPECT_EQ(td.keys(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(at::equal(td.get("a"), want.get("a")));
  EXPECT_TRUE(at::equal(td.get("b"), want.get("b")));
}

// The arena reserve fits "a" grown by 64 rows but not "b": the append fails after it grew "a".
TEST(WriteGroup, AppendRefusedMidwayLeavesTheHandleAsItWas) {
  TempDir t;
  StoreOptions o;
  o.arena_reserve = 2 * kMiB;
  {
    auto td = TensorDict::create(t / "s", {4}, o);
    td.set("a", big_rows(0, 4).get("a"));
    td.set("b", big_rows(0, 4).get("b"));
    td.commit();
    EXPECT_THROW(td.append(big_rows(4, 64)), CapacityError);
    expect_state(td, 4);  // the staged state too: batch size, values, no half-grown key
    td.commit();          // commits nothing of the refused append
    expect_state(td, 4);
    td.append(big_rows(4, 8));  // fits: the handle still works
    expect_state(td, 12);
    td.commit();
  }
  auto td = TensorDict::open(t / "s");
  expect_state(td, 12);
  EXPECT_TRUE(td.verify().empty());
}

// Every write of the append fails in turn (the arena writes of "b"'s rows are large enough to
// be written at once, not combined until the commit): each failure leaves the handle unchanged.
TEST(WriteGroup, AppendFailingToWriteLeavesTheHandleAsItWas) {
  TempDir t;
  auto env = std::make_shared<testing::FaultEnv>();
  StoreOptions o;
  o.env = env;
  auto td = TensorDict::create(t / "s", {4}, o);
  td.set("a", big_rows(0, 4).get("a"));
  td.set("b", big_rows(0, 4).get("b"));
  td.commit();
  int failed_after_a_write = 0;
  for (int fail_at = 1;; ++fail_at) {
    ASSERT_LT(fail_at, 100) << "the append never completed";
    env->writes = 0;
    env->fail_write_at = fail_at;
    try {
      td.append(big_rows(4, 4));
    } catch (const IOError&) {
      env->fail_write_at = 0;
      if (fail_at > 1) ++failed_after_a_write;
      expect_state(td, 4);
      continue;
    }
    env->fail_write_at = 0;
    expect_state(td, 8);
    break;
  }
  EXPECT_GE(failed_after_a_write, 1) << "no failure landed inside the append";
  td.commit();
  expect_state(TensorDict::open(t / "s"), 8);
}

// A ragged key needs two slots (values, offsets); with one free, the dense key stays.
TEST(WriteGroup, SetRaggedRefusedKeepsTheCommittedDenseKey) {
  TempDir t;
  StoreOptions o;
  o.key_capacity = 2;
  auto td = TensorDict::create(t / "s", {3}, o);
  td.set("x", at::ones({3, 2}));
  td.set("y", at::zeros({3}));
  td.commit();
  std::vector<at::Tensor> rows{at::ones({1}), at::ones({2}), at::ones({3})};
  EXPECT_THROW(td.set_ragged("x", rows), CapacityError);
  EXPECT_FALSE(td.is_ragged("x"));
  EXPECT_TRUE(at::equal(td.get("x"), at::ones({3, 2})));
  EXPECT_EQ(td.keys(), (std::vector<std::string>{"x", "y"}));
  td.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_FALSE(r.is_ragged("x"));
  EXPECT_TRUE(at::equal(r.get("x"), at::ones({3, 2})));
  EXPECT_TRUE(r.verify().empty());
}

// A dense value replacing a ragged key erases its offsets in the same group; refused, the
// ragged key stays whole.
TEST(WriteGroup, DenseValueReplacingARaggedKeyAppliesWhole) {
  TempDir t;
  StoreOptions o;
  o.arena_reserve = 2 * kMiB;
  auto td = TensorDict::create(t / "s", {3}, o);
  std::vector<at::Tensor> rows{at::ones({1}), at::ones({2}), at::ones({3})};
  td.set_ragged("x", rows);
  td.commit();
  at::Tensor padded = td.get("x").clone();
  EXPECT_THROW(td.set("x", at::zeros({3, kMiB})), CapacityError);
  EXPECT_TRUE(td.is_ragged("x"));
  EXPECT_TRUE(at::equal(td.get("x"), padded));
  td.set("x", at::zeros({3, 5}));
  td.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_FALSE(r.is_ragged("x"));
  EXPECT_EQ(r.keys(), std::vector<std::string>{"x"});
  EXPECT_TRUE(r.verify().empty());
}

TEST(WriteGroup, LazyPropertyIsStoredWithItsProvenanceOrNotAtAll) {
  TempDir t;
  StoreOptions o;
  o.key_capacity = 1;
  int computed = 0;
  auto twice = [&](const TensorDict& d) {
    ++computed;
    return d.get("x") * 2;
  };
  auto td = TensorDict::create(t / "s", {3}, o);
  td.set("x", at::ones({3}));
  td.commit();
  EXPECT_THROW(td.get_or_compute("x2", {"x"}, twice, "v1"), CapacityError);
  EXPECT_EQ(td.keys(), std::vector<std::string>{"x"});
  td.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.keys(), std::vector<std::string>{"x"});
  EXPECT_TRUE(r.verify().empty());
  EXPECT_EQ(r.lazy_properties().size(), 0u);
}

TEST(MovedFrom, HandlesThrowTdstoreError) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {2});
  td.set("x", at::ones({2}));
  td.commit();
  TensorDict moved = std::move(td);
  EXPECT_THROW(td.keys(), Error);  // NOLINT(bugprone-use-after-move): the point of the test
  EXPECT_THROW(td.get("x"), Error);
  EXPECT_THROW(td.set("y", at::ones({2})), Error);
  EXPECT_THROW(td.commit(), Error);
  EXPECT_EQ(moved.keys(), std::vector<std::string>{"x"});
  td = TensorDict::open(t / "s");  // assigning makes it usable again
  EXPECT_EQ(td.keys(), std::vector<std::string>{"x"});

  auto reader = StoreReader::open(t / "s");
  StoreReader reader2 = std::move(reader);
  EXPECT_THROW(reader.entries(), Error);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(reader2.entries().size(), 1u);

  auto ds = Dataset::create(t / "d");
  Dataset ds2 = std::move(ds);
  EXPECT_THROW(ds.rows(), Error);  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(ds2.rows(), 0);

  auto f = compile("f", [](TensorDict& d) { return d.get("x") + 1; });
  CompiledFunction f2 = std::move(f);
  TensorDict in({2});
  in.set("x", at::ones({2}));
  EXPECT_THROW(f(in), Error);  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(at::equal(f2(in), at::ones({2}) + 1));
}

// update() and set(key, sub-dict) apply whole or not at all: a store that refuses a leaf (its
// key directory full) leaves the dict as it was, staged and committed; in memory a refused
// leaf (a batch size that does not fit) does too. set(key, sub-dict) replaces what is under the
// prefix, including from a view of the same dict.
TEST(WriteGroup, UpdateAndSubDictAssignmentApplyWholeOrNotAtAll) {
  TempDir t;
  StoreOptions o;
  o.key_capacity = 4;
  auto td = TensorDict::create(t / "s", {4}, o);
  td.set("n/x", at::zeros({4}));
  td.set("n/y", at::ones({4}));
  td.commit();
  const std::vector<std::string> before{"n/x", "n/y"};
  TensorDict five({4});
  for (const char* k : {"a", "b", "c", "d", "e"}) five.set(k, at::ones({4}));
  EXPECT_THROW(td.set("n", five), CapacityError);
  EXPECT_EQ(td.keys(), before);
  TensorDict three({4});
  for (const char* k : {"a", "b", "c"}) three.set(k, at::ones({4}));
  EXPECT_THROW(td.update(three), CapacityError);
  EXPECT_EQ(td.keys(), before);
  TensorDict two({4});
  two.set("p", at::arange(4, at::kFloat));
  two.set("q/r", at::zeros({4, 2}));
  td.set("n", two);  // replaces n/x and n/y
  EXPECT_EQ(td.keys(), (std::vector<std::string>{"n/p", "n/q/r"}));
  td.set("m", td.sub("n"));  // a view of this dict as the value
  td.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"m/p", "m/q/r", "n/p", "n/q/r"}));
  EXPECT_TRUE(at::equal(r.get("m/p"), at::arange(4, at::kFloat)));
  EXPECT_TRUE(r.verify().empty());

  TensorDict mem({4});
  mem.set("n/x", at::zeros({4}));
  TensorDict bad({4});
  bad.set("ok", at::ones({4}));
  bad.set("wide", at::ones({4, 3}));
  TensorDict other_batch({3});
  other_batch.set("short", at::ones({3}));
  EXPECT_THROW(mem.set("n", other_batch), ShapeError);
  EXPECT_EQ(mem.keys(), std::vector<std::string>{"n/x"});
  mem.set("n", bad);
  EXPECT_EQ(mem.keys(), (std::vector<std::string>{"n/ok", "n/wide"}));
  TensorDict leaf_under_prefix({4});
  leaf_under_prefix.set("a", at::ones({4}));  // set first, then taken back
  leaf_under_prefix.set("n", at::ones({4}));  // "n" is a prefix of mem's keys: refused
  EXPECT_THROW(mem.update(leaf_under_prefix), KeyError);
  EXPECT_EQ(mem.keys(), (std::vector<std::string>{"n/ok", "n/wide"}));
}

}  // namespace write_group_test
}  // namespace tdstore
