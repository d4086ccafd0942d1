// The compile cache: keyed by what a function observes, never by how many keys a dict holds.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tdstore/tdstore.h"
#include "tests/child_process.h"
#include "tests/compile_options.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

using testing::TempDir;

using testing::no_persist;

// The reported reproducer: dicts holding 0..9 keys; the function sets "new" and returns it.
TEST(Compile, AddingAKeyNeverRecompilesWhateverTheDictSize) {
  auto fn = [](TensorDict& td) {
    td.set("new", at::ones({4}));
    return td.get("new");
  };
  auto compiled = compile("add_key", fn, no_persist());
  for (int n = 0; n < 10; ++n) {
    TensorDict td;
    for (int k = 0; k < n; ++k) td.set("k" + std::to_string(k), at::zeros({2}));
    TensorDict eager_td;
    at::Tensor expect = fn(eager_td);
    at::Tensor got = compiled(td);
    EXPECT_TRUE(at::equal(got, expect)) << n;
    EXPECT_TRUE(at::equal(td.get("new"), expect)) << "the write reaches the caller's dict";
    EXPECT_EQ(td.size(), n + 1);
  }
  auto s = compiled.stats();
  EXPECT_EQ(s.compiles, 1) << compiled.explain();
  EXPECT_EQ(s.hits, 9);
  EXPECT_EQ(s.fallbacks, 0);
}

TEST(Compile, OptionalFieldCompilesTwice) {
  auto compiled = compile(
      "masked",
      [](TensorDict& td) {
        at::Tensor x = td.get("x");
        return td.contains("mask") ? x * td.get("mask") : x + 1;
      },
      no_persist());
  for (int i = 0; i < 20; ++i) {
    TensorDict td({3});
    td.set("x", at::arange(3, at::kFloat) + i);
    if (i % 2) td.set("mask", at::ones({3}) * 2);
    for (int k = 0; k < i; ++k) td.set("noise" + std::to_string(k), at::zeros({3}));
    at::Tensor expect =
        i % 2 ? (at::arange(3, at::kFloat) + i) * 2 : at::arange(3, at::kFloat) + i + 1;
    EXPECT_TRUE(at::equal(compiled(td), expect)) << i;
  }
  EXPECT_EQ(compiled.stats().compiles, 2) << compiled.explain();
  EXPECT_EQ(compiled.stats().hits, 18);
}

TEST(Compile, LazyCachingPatternCompilesTwice) {
  auto compiled = compile(
      "lazy_pattern",
      [](TensorDict& td) {
        if (!td.contains("prop")) td.set("prop", td.get("x") * 2);
        return td.get("prop") + 1;
      },
      no_persist());
  TensorDict td({2});
  td.set("x", at::ones({2, 3}));
  for (int i = 0; i < 12; ++i) EXPECT_TRUE(at::equal(compiled(td), at::ones({2, 3}) * 3));
  EXPECT_EQ(compiled.stats().compiles, 2) << compiled.explain();
}

TEST(Compile, EnrichedBatchCompilesOnce) {
  at::Tensor w = at::randn({4, 2});
  CompileOptions o = no_persist();
  o.inputs = {w};  // a captured tensor is a graph input (not listed, the call runs eagerly)
  auto compiled = compile(
      "enrich", [w](TensorDict& td) { td.set("pred", td.get("obs").matmul(w)); }, o);
  TensorDict td({8});
  td.set("obs", at::randn({8, 4}));
  for (int i = 0; i < 10; ++i) {
    at::Tensor out = compiled(td);
    EXPECT_FALSE(out.defined()) << "void function";
    EXPECT_TRUE(at::allclose(td.get("pred"), td.get("obs").matmul(w)));
    td.set("metric" + std::to_string(i), at::zeros({8}));  // the loop enriches the batch too
    td.set("obs", at::randn({8, 4}));
  }
  EXPECT_EQ(compiled.stats().compiles, 1) << compiled.explain();
}

TEST(Compile, ShapeAndDtypeChangesRecompileOnceEach) {
  auto compiled = compile(
      "norm",
      [](TensorDict& td) {
        at::Tensor x = td.get("obs");
        return x / x.sum(-1, true);
      },
      no_persist());
  auto run = [&](at::Tensor obs) {
    TensorDict td({obs.size(0)});
    td.set("obs", obs);
    at::Tensor got = compiled(td);
    EXPECT_EQ(got.sizes(), obs.sizes());
    EXPECT_TRUE(at::allclose(got, obs / obs.sum(-1, true)));
  };
  run(at::arange(1, 9, at::kFloat).reshape({4, 2}));
  run(at::arange(1, 9, at::kFloat).reshape({4, 2}) + 1);
  EXPECT_EQ(compiled.stats().compiles, 1);
  run(at::arange(1, 13, at::kFloat).reshape({6, 2}));  // shape change
  EXPECT_EQ(compiled.stats().compiles, 2);
  run(at::arange(1, 13, at::kDouble).reshape({6, 2}));  // dtype change
  EXPECT_EQ(compiled.stats().compiles, 3);
  run(at::arange(1, 13, at::kFloat).reshape({6, 2}) * 3);
  run(at::arange(1, 9, at::kFloat).reshape({4, 2}) * 3);
  EXPECT_EQ(compiled.stats().compiles, 3);
  EXPECT_NE(compiled.explain().find("get(\"obs\") sizes [4, 2] != [6, 2]"), std::string::npos)
      << compiled.explain();
  EXPECT_NE(compiled.explain().find("get(\"obs\") dtype float32 != float64"), std::string::npos)
      << compiled.explain();
}

TEST(Compile, IteratingKeysRecompilesWhenTheKeySetChanges) {
  auto compiled = compile(
      "sum_all",
      [](TensorDict& td) {
        at::Tensor total = at::zeros({2});
        for (const auto& k : td.keys()) total = total + td.get(k);
        return total;
      },
      no_persist());
  TensorDict td({2});
  td.set("a", at::ones({2}));
  EXPECT_TRUE(at::equal(compiled(td), at::ones({2})));
  td.set("b", at::ones({2}));
  EXPECT_TRUE(at::equal(compiled(td), at::ones({2}) * 2)) << "correctness beats caching";
  EXPECT_TRUE(at::equal(compiled(td), at::ones({2}) * 2));
  EXPECT_EQ(compiled.stats().compiles, 2);
  EXPECT_NE(compiled.explain().find("keys() changed (1 keys != 2 keys)"), std::string::npos)
      << compiled.explain();
}

TEST(Compile, WritesAndInPlaceUpdatesAreReplayed) {
  auto compiled = compile(
      "update",
      [](TensorDict& td) {
        td.get("count").add_(1);
        td.set("double", td.get("x") * 2);
        td.erase("scratch");
      },
      no_persist());
  TensorDict td;
  td.set("count", at::zeros({1}));
  td.set("x", at::ones({3}));
  for (int i = 0; i < 4; ++i) {
    td.set("scratch", at::zeros({1}));
    compiled(td);
    EXPECT_FALSE(td.contains("scratch"));
    EXPECT_EQ(td.get("count").item<float>(), i + 1) << "in-place update applied exactly once";
    EXPECT_TRUE(at::equal(td.get("double"), at::ones({3}) * 2));
  }
  EXPECT_EQ(compiled.stats().compiles, 1);
  EXPECT_EQ(compiled.stats().hits, 3);
}

TEST(Compile, WritesReachAPersistentStore) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {4});
  td.set("x", at::arange(4, at::kFloat));
  td.commit();
  auto compiled = compile(
      "store_write", [](TensorDict& d) { d.set("y", d.get("x") + 10); }, no_persist());
  compiled(td);
  td.set("x", at::arange(4, at::kFloat) * 2);
  compiled(td);
  td.commit();
  EXPECT_EQ(compiled.stats().hits, 1);
  EXPECT_TRUE(at::equal(TensorDict::open(t / "s").get("y"), at::arange(4, at::kFloat) * 2 + 10));
}

TEST(Compile, TrainingStepMatchesEager) {
  at::Tensor w1 = (at::randn({4, 8}) * 0.5).requires_grad_(true);
  at::Tensor w2 = (at::randn({8, 1}) * 0.5).requires_grad_(true);
  at::Tensor e1 = w1.detach().clone().requires_grad_(true);
  at::Tensor e2 = w2.detach().clone().requires_grad_(true);
  auto loss_of = [](const at::Tensor& x, const at::Tensor& y, const at::Tensor& a,
                    const at::Tensor& b) {
    return (x.matmul(a).relu().matmul(b) - y).pow(2).mean();
  };
  CompileOptions o = no_persist();
  o.inputs = {w1, w2};
  auto step = compile(
      "train", [&](TensorDict& td) { return loss_of(td.get("x"), td.get("y"), w1, w2); }, o);
  for (int i = 0; i < 5; ++i) {
    TensorDict batch({16});
    batch.set("x", at::randn({16, 4}));
    batch.set("y", at::randn({16, 1}));
    at::Tensor loss = step(batch);
    loss.backward();
    at::Tensor eager = loss_of(batch.get("x"), batch.get("y"), e1, e2);
    eager.backward();
    EXPECT_TRUE(at::allclose(loss, eager, 1e-5, 1e-6)) << i;
    EXPECT_TRUE(at::allclose(w1.grad(), e1.grad(), 1e-5, 1e-6)) << i;
    EXPECT_TRUE(at::allclose(w2.grad(), e2.grad(), 1e-5, 1e-6)) << i;
    at::NoGradGuard no_grad;  // SGD: the next call must see the updated weights
    for (auto* p : {&w1, &w2, &e1, &e2}) {
      p->sub_(p->grad() * 0.1);
      p->grad().zero_();
    }
  }
  EXPECT_EQ(step.stats().compiles, 1) << step.explain();
  EXPECT_EQ(step.stats().hits, 4);
}

TEST(Compile, PastCacheLimitRunsEagerly) {
  CompileOptions o = no_persist();
  o.cache_limit = 2;
  auto compiled = compile(
      "limited", [](TensorDict& td) { return td.get("x") * 2; }, o);
  for (int n = 1; n <= 5; ++n) {
    TensorDict td({n});  // trailing sizes change too: never one dynamic entry
    td.set("x", at::ones({n, n}));
    EXPECT_TRUE(at::equal(compiled(td), at::ones({n, n}) * 2));
  }
  auto s = compiled.stats();
  EXPECT_EQ(s.compiles, 2);
  EXPECT_EQ(s.fallbacks, 3);
  EXPECT_NE(compiled.explain().find("cache_limit 2 reached"), std::string::npos)
      << compiled.explain();
}

TEST(Compile, UntraceableFunctionRunsEagerlyWithAReason) {
  int calls = 0;  // call 1 records, call 2 is the trace: it throws there
  auto compiled = compile(
      "bad",
      [&calls](TensorDict& td) {
        if (++calls == 2) throw std::runtime_error("no tracing here");
        return td.get("x") + 1;
      },
      no_persist());
  TensorDict td;
  td.set("x", at::zeros({2}));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(compiled(td), at::ones({2})));
  EXPECT_EQ(compiled.stats().compiles, 0);
  EXPECT_EQ(compiled.stats().fallbacks, 2);
  EXPECT_NE(compiled.explain().find("untraceable: no tracing here"), std::string::npos)
      << compiled.explain();
}

// A value read through raw memory is the one read the engine cannot watch (item() and
// friends make the entry eager: tests/compile_cpp_watch_test.cpp); check_first_run catches it.
TEST(Compile, CheckFirstRunCatchesValueDependentCode) {
  CompileOptions o = no_persist();
  o.check_first_run = true;
  auto compiled = compile(
      "branchy",
      [](TensorDict& td) {
        at::Tensor x = td.get("x");
        return x.data_ptr<float>()[0] > 0 ? x * 2 : x * -1;  // baked in by the trace
      },
      o);
  TensorDict pos;
  pos.set("x", at::ones({2}));
  TensorDict neg;
  neg.set("x", at::ones({2}) * -1);
  EXPECT_TRUE(at::equal(compiled(pos), at::ones({2}) * 2));
  EXPECT_TRUE(at::equal(compiled(neg), at::ones({2}))) << "checked against eager, not trusted";
  EXPECT_NE(compiled.explain().find("differs from eager"), std::string::npos) << compiled.explain();
}

TEST(Compile, SubDictCalls) {
  auto compiled = compile(
      "next_sum", [](TensorDict& td) { return td.get("obs").sum(0); }, no_persist());
  TensorDict td({2});
  td.set("next/obs", at::ones({2, 3}));
  td.set("obs", at::zeros({2, 3}));
  auto next = td.sub("next");
  EXPECT_TRUE(at::equal(compiled(next), at::ones({3}) * 2));
  EXPECT_TRUE(at::equal(compiled(next), at::ones({3}) * 2));
  EXPECT_TRUE(at::equal(compiled(td), at::zeros({3})));
  EXPECT_EQ(compiled.stats().compiles, 2) << "different keys are different guards";
}

// ---- persistence across processes

at::Tensor persisted_fn(TensorDict& td) {
  td.set("scaled", td.get("x") * 3);
  return td.get("x").sum(0);
}

TEST(CompileChild, LoadsGraphs) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  auto td = TensorDict::open(testing::child_arg(), OpenMode::ReadWrite);
  auto compiled = compile("persisted", persisted_fn);
  at::Tensor r = compiled(td);
  bool right = at::equal(r, td.get("x").sum(0)) && at::equal(td.get("scaled"), td.get("x") * 3);
  auto s = compiled.stats();
  if (!(right && s.compiles == 0 && s.loads == 1 && s.hits == 1)) std::cerr << compiled.explain();
  _exit(right && s.compiles == 0 && s.loads == 1 && s.hits == 1 ? testing::kChildPassed : 1);
}

TEST(Compile, SecondProcessLoadsInsteadOfTracing) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "s", {5});
    td.set("x", at::arange(20, at::kFloat).reshape({5, 4}));
    td.commit();
    auto compiled = compile("persisted", persisted_fn);
    compiled(td);
    td.commit();
    EXPECT_EQ(compiled.stats().compiles, 1);
  }
  EXPECT_EQ(testing::run_child("CompileChild.LoadsGraphs", (t / "s").string()), 0);
}

// ---- lazy properties inside compiled functions

at::Tensor lazy_fn(TensorDict& td) {
  at::Tensor norm = td.get_or_compute(
      "norm", {"x"}, [](const TensorDict& d) { return d.get("x") / d.get("x").sum(); });
  return norm * 2;
}

TEST(CompileChild, LazyNextRun) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  auto td = TensorDict::open(testing::child_arg(), OpenMode::ReadWrite);
  auto compiled = compile("lazy_fn", lazy_fn);
  at::Tensor r = compiled(td);
  bool right = at::allclose(r, td.get("x") / td.get("x").sum() * 2);
  auto s = compiled.stats();
  bool reused = td.lazy_stats().computed == 0;
  _exit(right && s.compiles == 0 && s.loads >= 1 && reused ? testing::kChildPassed : 1);
}

TEST(Compile, LazyPropertyCompilesTwiceAndNextRunComputesNothing) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "s", {4});
    td.set("x", at::arange(1, 5, at::kFloat));
    td.commit();
    auto compiled = compile("lazy_fn", lazy_fn);
    for (int i = 0; i < 6; ++i) EXPECT_TRUE(at::allclose(compiled(td), td.get("x") / 5));
    EXPECT_EQ(compiled.stats().compiles, 2) << compiled.explain();  // absent, then present
    EXPECT_EQ(td.lazy_stats().computed, 1);
    td.set("x", at::arange(2, 6, at::kFloat));  // the dep changes: recomputed through the graph
    td.commit();
    EXPECT_TRUE(at::allclose(compiled(td), td.get("x") / 7));
    EXPECT_EQ(compiled.stats().compiles, 2) << compiled.explain();
    EXPECT_EQ(td.lazy_stats().computed, 2);
    EXPECT_TRUE(td.lazy_info("norm")->valid);
  }
  EXPECT_EQ(testing::run_child("CompileChild.LazyNextRun", (t / "s").string()), 0);
}

// A process forks while another of its threads is inside a compiled call (holding the
// function's lock, its body waiting): the child has only the forking thread, and its own call
// of the function must not wait for a lock no thread of it holds.
TEST(Compile, AChildForkedDuringAnotherThreadsCallCanCallTheFunction) {
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false, release = false;
  std::atomic<bool> block{true};
  auto compiled = compile(
      "fork_during_call",
      [&](TensorDict& td) {
        if (block.exchange(false)) {  // the first call waits inside the function
          std::unique_lock lock(mu);
          inside = true;
          cv.notify_all();
          cv.wait(lock, [&] { return release; });
        }
        return td.get("x") + 1;
      },
      no_persist());
  std::thread caller([&] {
    TensorDict td({2});
    td.set("x", at::zeros({2}));
    compiled(td);
  });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return inside; });
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    TensorDict td({2});
    td.set("x", at::ones({2}));
    bool ok = false;
    try {
      ok = at::equal(compiled(td), at::ones({2}) + 1);
    } catch (...) {
    }
    _exit(ok ? 0 : 3);
  }
  int status = 0;
  const pid_t waited = ::waitpid(pid, &status, 0);
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  caller.join();
  ASSERT_EQ(waited, pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace tdstore
