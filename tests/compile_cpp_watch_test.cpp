// What a C++ body's trace would bake in runs eagerly (include/tdstore/compile.h, "Limits";
// src/run_watch.h): a value read into C++, a size that depends on values, a grad-mode switch
// inside the body, a captured tensor not in CompileOptions::inputs. Each case changes what the
// baked constant was between calls, so a graph hit would return another result than eager.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/masked_select.h>
#include <ATen/ops/ones.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tdstore/tdstore.h"
#include "tests/compile_options.h"

namespace tdstore {
namespace {

using testing::no_persist;

// Call i's data: values that move across the thresholds the bodies below branch on.
TensorDict batch(int i) {
  TensorDict td({8});
  td.set("a", at::arange(8, at::kFloat) - static_cast<double>(2 * i));
  return td;
}

struct Outcome {
  CompileStats stats;
  std::string explain;
};

// Compiled fn equals eager fn (values and requires_grad) on six calls; `between(i)` runs before
// call i on both sides.
Outcome follows_eager(
    const char* name, std::function<at::Tensor(TensorDict&)> fn, CompileOptions o = no_persist(),
    std::function<void(int)> between = [](int) {}) {
  auto compiled = compile(name, fn, o);
  for (int i = 0; i < 6; ++i) {
    between(i);
    TensorDict a = batch(i), b = batch(i);
    at::Tensor want = fn(a);
    at::Tensor got = compiled(b);
    EXPECT_TRUE(at::equal(got.detach(), want.detach()))
        << name << " call " << i << ": " << got << " vs " << want << "\n"
        << compiled.explain();
    EXPECT_EQ(got.requires_grad(), want.requires_grad()) << name << " call " << i;
  }
  return {compiled.stats(), compiled.explain()};
}

TEST(CompileCppWatch, AValueReadIntoCxxRunsEagerly) {
  auto r = follows_eager("item_branch", [](TensorDict& td) {
    at::Tensor x = td.get("a");
    return x.sum().item<float>() > 0 ? x * 2 : x - 1;
  });
  EXPECT_EQ(r.stats.hits, 0);
  EXPECT_NE(r.explain.find("reads a tensor's value into C++"), std::string::npos) << r.explain;
}

TEST(CompileCppWatch, AtEqualRunsEagerly) {
  auto r = follows_eager("equal_branch", [](TensorDict& td) {
    at::Tensor x = td.get("a");
    return at::equal(x, x.abs()) ? x + 1 : x;
  });
  EXPECT_EQ(r.stats.hits, 0);
}

TEST(CompileCppWatch, ASizeThatDependsOnValuesRunsEagerly) {
  auto r = follows_eager("mask_count", [](TensorDict& td) {
    at::Tensor x = td.get("a");
    return x + static_cast<double>(at::masked_select(x, x > 0).size(0));
  });
  EXPECT_EQ(r.stats.hits, 0);
  EXPECT_NE(r.explain.find("masked_select"), std::string::npos) << r.explain;
}

TEST(CompileCppWatch, IndexingTheDictWithAMaskRunsEagerly) {
  auto r = follows_eager("mask_index", [](TensorDict& td) {
    TensorDict kept = td.index(td.get("a") > 0);
    return td.get("a") * static_cast<double>(kept.batch_size()[0]);
  });
  EXPECT_EQ(r.stats.hits, 0);
}

TEST(CompileCppWatch, AGradModeSwitchInsideTheBodyRunsEagerly) {
  at::Tensor w = at::ones({8}).requires_grad_(true);
  CompileOptions o = no_persist();
  o.inputs = {w};
  auto r = follows_eager(
      "no_grad_block",
      [&w](TensorDict& td) {
        at::Tensor target;
        {
          at::NoGradGuard no_grad;  // the target-network pattern: no gradient into w here
          target = td.get("a") * w;
        }
        return target + td.get("a");
      },
      o);
  EXPECT_EQ(r.stats.hits, 0);
  EXPECT_NE(r.explain.find("grad mode"), std::string::npos) << r.explain;
}

TEST(CompileCppWatch, ACapturedTensorNotInInputsRunsEagerly) {
  at::Tensor scale = at::ones({8});
  auto r = follows_eager(
      "captured_tensor", [&scale](TensorDict& td) { return td.get("a") * scale; }, no_persist(),
      [&scale](int i) { scale.fill_(static_cast<double>(i)); });
  EXPECT_EQ(r.stats.hits, 0);
  EXPECT_NE(r.explain.find("CompileOptions::inputs"), std::string::npos) << r.explain;
}

TEST(CompileCppWatch, ACapturedTensorInInputsCompiles) {
  at::Tensor scale = at::ones({8});
  CompileOptions o = no_persist();
  o.inputs = {scale};
  auto r = follows_eager(
      "listed_tensor", [&scale](TensorDict& td) { return td.get("a") * scale + at::arange(8); }, o,
      [&scale](int i) { scale.fill_(static_cast<double>(i)); });
  EXPECT_EQ(r.stats.compiles, 1) << r.explain;
  EXPECT_EQ(r.stats.hits, 5) << r.explain;
}

TEST(CompileCppWatch, ValueFreeBodiesStillCompile) {
  // Sizes of the dict's tensors are guarded; reductions and masks that keep shapes are traced.
  auto r = follows_eager("value_free", [](TensorDict& td) {
    at::Tensor x = td.get("a");
    return (x * (x > 0)).sum() + static_cast<double>(x.size(0));
  });
  EXPECT_EQ(r.stats.compiles, 1) << r.explain;
  EXPECT_EQ(r.stats.hits, 5) << r.explain;
}

}  // namespace
}  // namespace tdstore
