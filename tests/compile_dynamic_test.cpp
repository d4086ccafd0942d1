// Automatic dynamic dim 0 (CompileOptions::dynamic_batch): one entry for every batch size when
// two sizes trace one graph, exact entries when a trace bakes a size in, and eager results at
// every size either way.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/relu.h>
#include <gtest/gtest.h>

#include "tdstore/tdstore.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace compile_dynamic_test {

using testing::TempDir;

const std::vector<int64_t> kSizes = {128, 96, 1, 7, 200, 1000, 96, 128};

// A weight the steps below capture: a graph input (a captured tensor not listed runs eagerly).
const at::Tensor kW = at::randn({4, 3});

CompileOptions no_persist(bool dynamic = true) {
  CompileOptions o;
  o.persist = false;
  o.inputs = {kW};
  o.dynamic_batch = dynamic;
  return o;
}

TensorDict batch(int64_t n) {
  TensorDict td({n});
  td.set("x", at::randn({n, 4}));
  td.set("label", at::randn({n}));
  td.set("unread", at::randn({n, 2}));
  return td;
}

// Shape-generic in dim 0: reads two batch keys, writes one, returns a per-row value.
at::Tensor step(TensorDict& td) {
  at::Tensor h = at::relu(td.get("x").matmul(kW));
  td.set("h", h);
  return h.sum(1) - td.get("label");
}

at::Tensor step_eager(const TensorDict& td) {
  return at::relu(td.get("x").matmul(kW)).sum(1) - td.get("label");
}

TEST(CompileDynamic, TwoSizesOneGraphBecomeOneEntryForEverySize) {
  auto compiled = compile("dyn_step", step, no_persist());
  for (int64_t n : kSizes) {
    TensorDict td = batch(n);
    at::Tensor want = step_eager(td);
    at::Tensor got = compiled(td);
    ASSERT_TRUE(at::allclose(got, want, 1e-5, 1e-6)) << "size " << n << "\n" << compiled.explain();
    EXPECT_TRUE(at::allclose(td.get("h"), at::relu(td.get("x").matmul(kW)))) << n;
  }
  auto s = compiled.stats();
  EXPECT_EQ(s.compiles, 2) << compiled.explain();  // 128, then 96: identical graphs
  EXPECT_EQ(s.entries, 1) << compiled.explain();
  EXPECT_EQ(s.fallbacks, 0) << compiled.explain();
  EXPECT_NE(compiled.explain().find("became dynamic in dim 0 (sizes 128 and 96"), std::string::npos)
      << compiled.explain();
  EXPECT_NE(compiled.explain().find("any size of dim 0"), std::string::npos) << compiled.explain();
}

TEST(CompileDynamic, OffKeepsOneEntryPerSize) {
  auto compiled = compile("dyn_off", step, no_persist(false));
  for (int64_t n : {128, 96, 7}) {
    TensorDict td = batch(n);
    EXPECT_TRUE(at::allclose(compiled(td), step_eager(td), 1e-5, 1e-6)) << n;
  }
  EXPECT_EQ(compiled.stats().compiles, 3);
  EXPECT_EQ(compiled.stats().entries, 3);
}

TEST(CompileDynamic, ASizeBakedIntoTheGraphKeepsExactEntries) {
  // view() with a size read into C++: the size is a constant of each trace.
  auto compiled = compile(
      "dyn_baked",
      [](TensorDict& td) {
        at::Tensor x = td.get("x");
        return x.view({x.size(0) * 4}) * 2;
      },
      no_persist());
  for (int64_t n : kSizes) {
    TensorDict td = batch(n);
    EXPECT_TRUE(at::allclose(compiled(td), td.get("x").view({n * 4}) * 2)) << n;
  }
  EXPECT_EQ(compiled.stats().entries, 6) << compiled.explain();  // one per distinct size
  EXPECT_NE(compiled.explain().find("a size is baked in"), std::string::npos) << compiled.explain();
}

TEST(CompileDynamic, ABatchSizeTheFunctionReadsKeepsExactEntries) {
  auto compiled = compile(
      "dyn_reads_size",
      [](TensorDict& td) { return td.get("x").sum(1) / static_cast<double>(td.batch_size()[0]); },
      no_persist());
  for (int64_t n : {128, 96, 7}) {
    TensorDict td = batch(n);
    EXPECT_TRUE(at::allclose(compiled(td), td.get("x").sum(1) / static_cast<double>(n))) << n;
  }
  EXPECT_EQ(compiled.stats().entries, 3) << compiled.explain();
}

TEST(CompileDynamic, ABranchOnASizeIsCaughtByTheTraceOfANewSize) {
  // Same graph at 128 and 200 (both take the first branch), another path below 100: the
  // dynamic entry's first call at 50 traces that size, whose graph differs.
  auto compiled = compile(
      "dyn_branch",
      [](TensorDict& td) {
        at::Tensor x = td.get("x");
        return x.size(0) > 100 ? x * 2 : x * 3;
      },
      no_persist());
  for (int64_t n : {128, 200}) {
    TensorDict td = batch(n);
    EXPECT_TRUE(at::allclose(compiled(td), td.get("x") * 2)) << n;
  }
  ASSERT_EQ(compiled.stats().entries, 1) << compiled.explain();
  for (int64_t n : {50, 50, 128, 200, 60, 60}) {
    TensorDict td = batch(n);
    EXPECT_TRUE(at::allclose(compiled(td), td.get("x") * (n > 100 ? 2 : 3))) << n << "\n"
                                                                             << compiled.explain();
  }
  EXPECT_NE(compiled.explain().find("dim 0 size 50 refused by the dynamic entry"),
            std::string::npos)
      << compiled.explain();
  // The dynamic entry keeps serving the sizes it proved; 50 and 60 have exact entries.
  EXPECT_EQ(compiled.stats().entries, 3) << compiled.explain();
}

// Both branches agree on the first batch of the new size (non-negative data): an output
// comparison would admit the size, and later batches of it would take the wrong branch.
TEST(CompileDynamic, ABranchThatAgreesOnTheFirstBatchIsStillRefused) {
  auto compiled = compile(
      "dyn_benign",
      [](TensorDict& td) {
        at::Tensor x = td.get("x");
        return x.size(0) > 100 ? x.abs() : x * 1;
      },
      no_persist());
  for (int64_t n : {128, 200}) {
    TensorDict td = batch(n);
    compiled(td);
  }
  ASSERT_EQ(compiled.stats().entries, 1) << compiled.explain();
  TensorDict benign = batch(50);
  benign.set("x", benign.get("x").abs());
  EXPECT_TRUE(at::equal(compiled(benign), benign.get("x")));
  for (int round = 0; round < 3; ++round) {
    TensorDict td = batch(50);  // negative values: the branches differ
    EXPECT_TRUE(at::equal(compiled(td), td.get("x"))) << round << "\n" << compiled.explain();
  }
}

// A size whose eager run throws is not admitted: every call at it runs eagerly, and throws.
TEST(CompileDynamic, ASizeWhoseEagerRunThrowsIsNeverServedByTheGraph) {
  auto compiled = compile(
      "dyn_throw",
      [](TensorDict& td) {
        at::Tensor x = td.get("x");
        if (x.size(0) == 13) throw ShapeError("13 rows are not allowed");
        return x * 2;
      },
      no_persist());
  for (int64_t n : {128, 200}) {
    TensorDict td = batch(n);
    compiled(td);
  }
  ASSERT_EQ(compiled.stats().entries, 1) << compiled.explain();
  for (int round = 0; round < 3; ++round) {
    TensorDict td = batch(13);
    EXPECT_THROW(compiled(td), ShapeError) << round << "\n" << compiled.explain();
  }
  TensorDict td = batch(14);
  EXPECT_TRUE(at::allclose(compiled(td), td.get("x") * 2));
}

TEST(CompileDynamic, EveryOtherSpecStaysInTheGuard) {
  auto compiled = compile("dyn_specs", step, no_persist());
  for (int64_t n : {128, 96}) {
    TensorDict td = batch(n);
    compiled(td);
  }
  ASSERT_EQ(compiled.stats().entries, 1);
  auto expect_miss = [&](TensorDict td, const char* what) {
    int64_t before = compiled.stats().compiles;
    at::Tensor want = step_eager(td);
    EXPECT_TRUE(at::allclose(compiled(td), want, 1e-5, 1e-6)) << what;
    EXPECT_EQ(compiled.stats().compiles, before + 1) << what << "\n" << compiled.explain();
  };
  TensorDict trailing({64});  // a trailing size
  trailing.set("x", at::randn({64, 4}));
  trailing.set("label", at::randn({64, 1}));
  expect_miss(trailing, "label [64, 1] (trailing size) broadcasts: another trace");
  TensorDict dtype({64});
  dtype.set("x", at::randn({64, 4}));
  dtype.set("label", at::randn({64}).to(at::kDouble));
  expect_miss(dtype, "a double label");
  TensorDict strides({64});
  strides.set("x", at::randn({4, 64}).t());
  strides.set("label", at::randn({64}));
  expect_miss(strides, "transposed x: other strides");
  TensorDict grad({64});
  grad.set("x", at::randn({64, 4}).requires_grad_(true));
  grad.set("label", at::randn({64}));
  expect_miss(grad, "x requires grad");
  {
    at::NoGradGuard no_grad;
    expect_miss(batch(64), "grad mode off");
  }
  TensorDict unbatched;  // dims 0 that disagree: no single size B
  unbatched.set("x", at::randn({50, 4}));
  unbatched.set("label", at::randn({1}));
  expect_miss(unbatched, "x [50, 4] with label [1]");
}

at::Tensor stored_step(TensorDict& td) { return at::relu(td.get("x").matmul(kW)).sum(1); }

TEST(CompileDynamic, ADynamicEntryPersistsAndLoadsAsOne) {
  TempDir t;
  {
    auto store = TensorDict::create(t / "g", {});
    store.commit();
  }
  CompileOptions o;
  o.store = t / "g";  // graphs of in-memory batches go to this store's catalog
  o.inputs = {kW};
  {
    auto compiled = compile("dyn_persist", stored_step, o);
    for (int64_t n : {128, 96}) {
      TensorDict td = batch(n);
      compiled(td);
    }
    ASSERT_EQ(compiled.stats().entries, 1) << compiled.explain();
  }
  auto again = compile("dyn_persist", stored_step, o);
  for (int64_t n : {7, 128, 96, 1000}) {
    TensorDict td = batch(n);
    EXPECT_TRUE(at::allclose(again(td), at::relu(td.get("x").matmul(kW)).sum(1), 1e-5, 1e-6)) << n;
  }
  auto s = again.stats();
  EXPECT_EQ(s.loads, 1) << again.explain();  // the dynamic entry, not the two exact ones
  EXPECT_EQ(s.compiles, 0) << again.explain();
  EXPECT_EQ(s.entries, 1) << again.explain();
  EXPECT_EQ(s.fallbacks, 0) << again.explain();
}

}  // namespace compile_dynamic_test
}  // namespace tdstore
