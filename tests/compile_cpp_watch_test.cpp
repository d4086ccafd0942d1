// What a C++ body's trace would bake in runs eagerly (include/tdstore/compile.h, "Limits";
// src/run_watch.h): a value read into C++, a size that depends on values, a grad-mode switch
// inside the body, a captured tensor not in CompileOptions::inputs. Each case changes what the
// baked constant was between calls, so a graph hit would return another result than eager.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/batch_norm.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/eye.h>
#include <ATen/ops/linalg_cholesky.h>
#include <ATen/ops/masked_select.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <string>

#include "tdstore/tdstore.h"
#include "tests/compile_options.h"

namespace tdstore {
namespace compile_cpp_watch_test {

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

TEST(CompileCppWatch, BincountsSizeRunsEagerly) {
  auto r = follows_eager("bincount_size", [](TensorDict& td) {
    at::Tensor c = at::bincount((td.get("a") + 12).clamp_min(0).to(at::kLong));
    return c.to(at::kFloat).sum() / static_cast<double>(c.size(0));
  });
  EXPECT_EQ(r.stats.hits, 0) << r.explain;
}

// A body catching an operator's exception: the trace would continue untraced (libtorch leaves
// the tracer off after a throwing operator); it crashed the process before.
TEST(CompileCppWatch, AnExceptionCaughtInTheBodyNeverCrashesAndRunsEagerly) {
  auto compiled = compile(
      "caught",
      [](TensorDict& td) {
        at::Tensor x = td.get("x"), y;
        try {
          y = x.view({-1, 3});
        } catch (const std::exception&) {
          y = x.reshape({-1, 1});
        }
        return y * 2;
      },
      no_persist());
  for (int64_t n : {8, 8, 9, 8}) {
    TensorDict td;
    td.set("x", at::arange(n, at::kFloat));
    at::Tensor got = compiled(td);
    EXPECT_EQ(got.size(1), n % 3 == 0 ? 3 : 1) << n;
  }
}

// The first call succeeds, so the graph holds the try path; a later call whose graph throws
// runs eagerly and takes the body's catch path (a Cholesky with jitter).
TEST(CompileCppWatch, AGraphThatThrowsLeavesTheCallToEager) {
  auto fn = [](TensorDict& td) {
    at::Tensor k = td.get("k");
    try {
      return at::linalg_cholesky(k);
    } catch (const c10::Error&) {
      return at::linalg_cholesky(k.abs() + 10 * at::eye(3));
    }
  };
  auto compiled = compile("jitter", fn, no_persist());
  for (double d : {1.0, 2.0, -1.0, 3.0}) {
    TensorDict a, b;
    a.set("k", at::eye(3) * d);
    b.set("k", at::eye(3) * d);
    EXPECT_TRUE(at::allclose(compiled(b), fn(a))) << d << "\n" << compiled.explain();
  }
  EXPECT_GE(compiled.stats().hits, 2) << compiled.explain();
  // An error the body does not catch keeps its own type.
  auto gather = compile(
      "gather", [](TensorDict& td) { return td.get("x").index_select(0, td.get("i")); },
      no_persist());
  TensorDict td;
  td.set("x", at::arange(4, at::kFloat));
  td.set("i", at::arange(4, at::kLong));
  gather(td);
  gather(td);
  td.set("i", at::arange(4, at::kLong) + 2);
  EXPECT_THROW(gather(td), c10::IndexError) << gather.explain();
}

// Inputs the body updates in place (running statistics, an average): the eager result's
// backward still works on a miss (the trace's update and its undoing are no writes to
// autograd), and every call updates them once.
TEST(CompileCppWatch, InputsUpdatedInPlaceKeepBackwardWorking) {
  at::Tensor w = at::ones({3}).requires_grad_(true), ema = at::zeros({3});
  at::Tensor mean = at::zeros({3}), var = at::ones({3});
  CompileOptions o = no_persist();
  o.inputs = {w, ema, mean, var};
  auto compiled = compile(
      "in_place",
      [&](TensorDict& td) {
        at::Tensor x = td.get("x");
        at::Tensor y = at::batch_norm(x, w, {}, mean, var, /*training=*/true, 0.1, 1e-5, false);
        ema.mul_(0.5).add_(x.mean(0), 0.5);
        return (y * ema * w).sum();
      },
      o);
  at::Tensor e_w = w.detach().clone().requires_grad_(true), e_ema = ema.clone();
  at::Tensor e_mean = mean.clone(), e_var = var.clone();
  for (int i = 0; i < 4; ++i) {
    TensorDict td({4});
    td.set("x", at::arange(12, at::kFloat).reshape({4, 3}) * static_cast<double>(i + 1));
    at::Tensor got = compiled(td);
    ASSERT_NO_THROW(torch::autograd::backward({got})) << "call " << i;
    at::Tensor x = td.get("x");
    at::Tensor y = at::batch_norm(x, e_w, {}, e_mean, e_var, true, 0.1, 1e-5, false);
    e_ema.mul_(0.5).add_(x.mean(0), 0.5);
    at::Tensor want = (y * e_ema * e_w).sum();
    torch::autograd::backward({want});
    EXPECT_TRUE(at::allclose(got, want)) << i;
    EXPECT_TRUE(at::allclose(ema, e_ema)) << i;
    EXPECT_TRUE(at::allclose(mean, e_mean)) << i;
    EXPECT_TRUE(at::allclose(w.grad(), e_w.grad())) << i;
  }
  EXPECT_EQ(compiled.stats().compiles, 1) << compiled.explain();
}

TEST(CompileCppWatch, RequiresGradSetInTheBodyRunsEagerly) {
  auto r = follows_eager("made_leaf", [](TensorDict& td) {
    at::Tensor h = at::zeros({8});
    h.requires_grad_(true);
    return td.get("a") * h;
  });
  EXPECT_EQ(r.stats.hits, 0) << r.explain;
}

TEST(CompileCppWatch, FixedSizeIndexingStillCompiles) {
  auto r = follows_eager("fixed_index", [](TensorDict& td) {
    TensorDict picked = td.index(at::arange(7, -1, -1, at::kLong));
    return picked.get("a").repeat_interleave(2);
  });
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

}  // namespace compile_cpp_watch_test
}  // namespace tdstore
