// The compile cache under adversarial use: every answer a function gets from a dict is in its
// guard, the trace sees what the eager call saw, effects happen once, and graphs are never
// reused for other code. Each test compares with the eager function on the same input.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/frontend/tracer.h>

#include <atomic>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "storage/graph_record.h"
#include "storage/graph_seal.h"
#include "storage/store.h"
#include "tdstore/tdstore.h"
#include "tests/catalog_record.h"
#include "tests/child_process.h"
#include "tests/compile_options.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

using testing::TempDir;

using testing::no_persist;

at::Tensor plus_one(TensorDict& d) { return d.get("x") + 1; }

// A stored record's inside, and a record sealed with this user's key as the cache seals it.
std::string unsealed(const std::string& value, const std::string& key) {
  return std::string(storage::unseal(value, key, storage::Keyring::process()).record);
}
std::string resealed(const std::string& key, const std::string& record) {
  return storage::seal(*storage::Keyring::process().signing, key, record, 1);
}
at::Tensor plus_two(TensorDict& d) { return d.get("x") + 2; }

// Calls the compiled and the eager function on copies of the same dict state and expects the
// same result and the same dict afterwards.
template <class F>
void expect_same(CompiledFunction& compiled, F&& eager, TensorDict& td, TensorDict& twin,
                 const std::string& what) {
  at::Tensor want = eager(twin);
  at::Tensor got = compiled(td);
  ASSERT_EQ(want.defined(), got.defined()) << what;
  if (want.defined()) {
    EXPECT_TRUE(at::equal(want, got)) << what << "\n" << compiled.explain();
  }
  EXPECT_EQ(td.keys(), twin.keys()) << what;
  for (const auto& k : twin.keys())
    EXPECT_TRUE(at::equal(td.get(k), twin.get(k))) << what << " key " << k;
}

TEST(CompileGuard, BatchSizeIsObserved) {
  auto fn = [](TensorDict& td) { return at::ones({td.batch_size()[0]}) * 2; };
  auto compiled = compile("ones_like_batch", fn, no_persist());
  for (int64_t n : {3, 5, 3, 8}) {
    TensorDict td({n});
    EXPECT_TRUE(at::equal(compiled(td), fn(td))) << n << compiled.explain();
  }
  EXPECT_EQ(compiled.stats().compiles, 3) << compiled.explain();
  EXPECT_NE(compiled.explain().find("batch_size() [3] != [5]"), std::string::npos)
      << compiled.explain();
}

TEST(CompileGuard, AWriteDependsOnTheBatchSize) {
  auto fn = [](TensorDict& td) { td.set("y", at::zeros({td.batch_size()[0], 2})); };
  auto compiled = compile("write_batch", fn, no_persist());
  for (int64_t n : {2, 4}) {
    TensorDict td({n});
    compiled(td);
    EXPECT_EQ(td.get("y").sizes(), (std::vector<int64_t>{n, 2}));
  }
}

TEST(CompileGuard, AKeyErrorIsAnAnswer) {
  auto fn = [](TensorDict& td) {
    try {
      return td.get("x") * 2;
    } catch (const KeyError&) {
      return at::full({2}, -1.0);
    }
  };
  auto compiled = compile("default_branch", fn, no_persist());
  TensorDict without({2});
  TensorDict with({2});
  with.set("x", at::ones({2}));
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(at::equal(compiled(without), at::full({2}, -1.0)));
    EXPECT_TRUE(at::equal(compiled(with), at::ones({2}) * 2)) << compiled.explain();
  }
  EXPECT_EQ(compiled.stats().compiles, 2);
}

TEST(CompileGuard, AttributesAreObserved) {
  auto fn = [](TensorDict& td) {
    at::Tensor x = td.get("x");
    return td.attr("mode") == std::optional<std::string>("double") ? x * 2 : x;
  };
  auto compiled = compile("attr_branch", fn, no_persist());
  TensorDict td({2});
  td.set("x", at::ones({2}));
  EXPECT_TRUE(at::equal(compiled(td), at::ones({2})));
  td.set_attr("mode", "double");
  EXPECT_TRUE(at::equal(compiled(td), at::ones({2}) * 2)) << compiled.explain();
  td.set_attr("mode", "other");
  EXPECT_TRUE(at::equal(compiled(td), at::ones({2}))) << compiled.explain();
  EXPECT_TRUE(at::equal(compiled(td), at::ones({2})));
  EXPECT_EQ(compiled.stats().hits, 1) << compiled.explain();
}

TEST(CompileGuard, AttrNamesGenerationAndPersistenceAreObserved) {
  TempDir t;
  auto fn = [](TensorDict& td) {
    at::Tensor x = td.get("x");
    double g = static_cast<double>(td.generation());
    return (td.is_persistent() ? x * 10 : x) + g + static_cast<double>(td.attr_names().size());
  };
  auto compiled = compile("many_answers", fn, no_persist());
  TensorDict mem({2});
  mem.set("x", at::ones({2}));
  auto store = TensorDict::create(t / "s", {2});
  store.set("x", at::ones({2}));
  store.commit();
  for (int round = 0; round < 2; ++round) {
    EXPECT_TRUE(at::equal(compiled(mem), fn(mem))) << compiled.explain();
    EXPECT_TRUE(at::equal(compiled(store), fn(store))) << compiled.explain();
    store.set_attr("a" + std::to_string(round), "1");
    store.commit();  // a new generation and a new attribute: both observed
    EXPECT_TRUE(at::equal(compiled(store), fn(store))) << compiled.explain();
  }
}

TEST(CompileGuard, HasPrefixIsObserved) {
  auto fn = [](TensorDict& td) {
    at::Tensor x = td.get("x");
    return td.has_prefix("extra") ? x + 1 : x - 1;
  };
  auto compiled = compile("prefix_branch", fn, no_persist());
  TensorDict td({2});
  td.set("x", at::zeros({2}));
  EXPECT_TRUE(at::equal(compiled(td), at::full({2}, -1.0)));
  td.set("extra/a", at::zeros({2}));
  EXPECT_TRUE(at::equal(compiled(td), at::ones({2}))) << compiled.explain();
  td.erase("extra/a");
  EXPECT_TRUE(at::equal(compiled(td), at::full({2}, -1.0))) << compiled.explain();
}

TEST(CompileGuard, RaggedKeysAreTracedAsTheyAre) {
  auto fn = [](TensorDict& td) {
    if (td.is_ragged("tokens")) return td.get_ragged("tokens").values.sum() * 1.0;
    return td.get("tokens").sum() * 100.0;
  };
  auto compiled = compile("ragged_branch", fn, no_persist());
  TensorDict td({2});
  td.set_ragged("tokens", std::vector<at::Tensor>{at::ones({3}), at::ones({1})});
  TensorDict dense({2});
  dense.set("tokens", at::ones({2, 2}));
  for (int i = 0; i < 3; ++i) {  // record, then graph calls: the same answer every time
    EXPECT_TRUE(at::equal(compiled(td), fn(td))) << i << compiled.explain();
    EXPECT_TRUE(at::equal(compiled(dense), fn(dense))) << i << compiled.explain();
  }
  EXPECT_EQ(compiled.stats().compiles, 2);
  EXPECT_EQ(compiled.stats().hits, 4);
}

TEST(CompileGuard, AttributesAreSeenByTheTrace) {
  auto fn = [](TensorDict& td) {
    auto s = td.attr("scale");
    return td.get("x") * (s ? std::stod(*s) : 1.0);
  };
  auto compiled = compile("attr_scale", fn, no_persist());
  TensorDict td({2});
  td.set("x", at::ones({2}));
  td.set_attr("scale", "3");
  EXPECT_TRUE(at::equal(compiled(td), at::full({2}, 3.0)));
  EXPECT_TRUE(at::equal(compiled(td), at::full({2}, 3.0)))
      << "the graph call: " << compiled.explain();
  EXPECT_EQ(compiled.stats().hits, 1);
}

TEST(CompileGuard, CheckFirstRunAppliesInPlaceUpdatesOnce) {
  CompileOptions o = no_persist();
  o.check_first_run = true;
  auto compiled = compile(
      "bump",
      [](TensorDict& td) {
        td.get("x").add_(1);
        return td.get("x") * 1;
      },
      o);
  TensorDict td({2});
  td.set("x", at::zeros({2}));
  compiled(td);  // eager, recorded and traced
  EXPECT_TRUE(at::equal(td.get("x"), at::ones({2})));
  compiled(td);  // the checked first graph call
  EXPECT_TRUE(at::equal(td.get("x"), at::full({2}, 2.0))) << compiled.explain();
  at::Tensor r = compiled(td);  // a plain graph call
  EXPECT_TRUE(at::equal(td.get("x"), at::full({2}, 3.0)));
  EXPECT_TRUE(at::equal(r, at::full({2}, 3.0)));
  EXPECT_EQ(compiled.stats().hits, 2) << compiled.explain();
  EXPECT_EQ(compiled.stats().fallbacks, 0) << compiled.explain();
}

// A first-call check whose eager run throws checks nothing: while eager throws, every call
// does, in this process (check_first_run) and in the next (a loaded graph).
std::atomic<bool> g_refuse{false};

at::Tensor refusing(TensorDict& td) {
  if (g_refuse) throw KeyError("refused by the function's own state");
  return td.get("x") * 2;
}

TEST(CompileGuard, ACheckWhoseEagerRunThrowsLeavesTheEntryUnchecked) {
  CompileOptions o = no_persist();
  o.check_first_run = true;
  auto compiled = compile("refusing", refusing, o);
  TensorDict td({2});
  td.set("x", at::ones({2}));
  g_refuse = false;
  compiled(td);  // recorded and traced
  g_refuse = true;
  EXPECT_THROW(compiled(td), KeyError);  // the check's eager run throws
  EXPECT_THROW(compiled(td), KeyError) << "the graph served a call eager refuses";
  g_refuse = false;
  EXPECT_TRUE(at::equal(compiled(td), at::full({2}, 2.0)));  // checked now
  EXPECT_TRUE(at::equal(compiled(td), at::full({2}, 2.0)));
  EXPECT_EQ(compiled.stats().hits, 2) << compiled.explain();
}

TEST(CompileGuard, ALoadedGraphWhoseFirstEagerRunThrowsStaysUnchecked) {
  TempDir t;
  {
    auto store = TensorDict::create(t / "g", {});
    store.commit();
  }
  CompileOptions o;
  o.store = t / "g";
  TensorDict td({2});
  td.set("x", at::ones({2}));
  g_refuse = false;
  {
    auto first = compile("refusing_loaded", refusing, o);
    first(td);
  }
  auto again = compile("refusing_loaded", refusing, o);
  g_refuse = true;
  EXPECT_THROW(again(td), KeyError);
  EXPECT_THROW(again(td), KeyError) << "the loaded graph served a call eager refuses";
  g_refuse = false;
  EXPECT_TRUE(at::equal(again(td), at::full({2}, 2.0)));
  EXPECT_EQ(again.stats().loads, 1) << again.explain();
}

TEST(CompileGuard, ErasingAnAbsentKeyFailsLikeEager) {
  auto fn = [](TensorDict& td) {
    td.erase("tmp");
    return td.get("x") + 1;
  };
  auto compiled = compile("erase_tmp", fn, no_persist());
  for (int i = 0; i < 2; ++i) {
    TensorDict td({2});
    td.set("x", at::zeros({2}));
    td.set("tmp", at::zeros({2}));
    EXPECT_TRUE(at::equal(compiled(td), at::ones({2})));
    EXPECT_FALSE(td.contains("tmp"));
    EXPECT_THROW(compiled(td), KeyError) << "tmp is gone: eager throws, so must the compiled call";
  }
  auto catching = compile(
      "erase_or_flag",
      [](TensorDict& td) {
        try {
          td.erase("tmp");
        } catch (const KeyError&) {
          td.set("flag", at::ones({2}));
        }
      },
      no_persist());
  for (int i = 0; i < 2; ++i) {
    TensorDict with({2}), without({2});
    with.set("tmp", at::zeros({2}));
    TensorDict with_twin = with.clone(), without_twin = without.clone();
    expect_same(
        catching,
        [](TensorDict& td) {
          try {
            td.erase("tmp");
          } catch (const KeyError&) {
            td.set("flag", at::ones({2}));
          }
          return at::Tensor();
        },
        with, with_twin, "with tmp");
    expect_same(
        catching,
        [](TensorDict& td) {
          try {
            td.erase("tmp");
          } catch (const KeyError&) {
            td.set("flag", at::ones({2}));
          }
          return at::Tensor();
        },
        without, without_twin, "without tmp");
  }
  EXPECT_EQ(catching.stats().compiles, 2);
}

TEST(CompileGuard, WritesRefusedByTheDictAreObserved) {
  TempDir t;
  {
    auto w = TensorDict::create(t / "s", {2});
    w.set("x", at::ones({2}));
    w.commit();
  }
  auto fn = [](TensorDict& td) {
    try {
      td.set("y", td.get("x") * 2);
      return at::ones({1});
    } catch (const ReadOnlyError&) {
      return at::zeros({1});
    }
  };
  auto compiled = compile("maybe_write", fn, no_persist());
  auto reader = TensorDict::open(t / "s");
  auto writer = TensorDict::open(t / "s", OpenMode::ReadWrite);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(at::equal(compiled(reader), at::zeros({1}))) << compiled.explain();
    EXPECT_TRUE(at::equal(compiled(writer), at::ones({1}))) << compiled.explain();
  }
  EXPECT_TRUE(at::equal(writer.get("y"), at::full({2}, 2.0)));
  // A leaf cannot be set under a leaf: set("x/z") fails on this dict, succeeds where x is absent.
  auto nested = compile(
      "nested_write",
      [](TensorDict& td) {
        try {
          td.set("x/z", at::ones({2}));
          return at::ones({1});
        } catch (const KeyError&) {
          return at::zeros({1});
        }
      },
      no_persist());
  TensorDict has_x({2}), no_x({2});
  has_x.set("x", at::ones({2}));
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(at::equal(nested(has_x), at::zeros({1})));
    EXPECT_TRUE(at::equal(nested(no_x), at::ones({1}))) << nested.explain();
  }
}

TEST(CompileGuard, KeySetAfterOwnWritesIsExact) {
  // The call erases one key and adds another, then counts: the count depends on the other keys.
  auto fn = [](TensorDict& td) {
    if (td.contains("old")) td.erase("old");
    td.set("new", at::ones({2}));
    return at::full({1}, static_cast<double>(td.size()));
  };
  auto compiled = compile("count_after_writes", fn, no_persist());
  for (int extra = 0; extra < 3; ++extra) {
    for (bool old : {true, false}) {
      TensorDict td({2});
      for (int k = 0; k < extra; ++k) td.set("k" + std::to_string(k), at::zeros({2}));
      if (old) td.set("old", at::zeros({2}));
      TensorDict twin = td.clone();
      expect_same(compiled, fn, td, twin, "extra " + std::to_string(extra));
    }
  }
}

TEST(CompileGuard, UnsupportedCallsRunEagerlyWithAReason) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {2});
  td.set("x", at::ones({2}));
  td.commit();
  auto compiled = compile(
      "verifies",
      [](TensorDict& d) {
        return at::full({1}, static_cast<double>(d.verify().size())) + d.get("x").sum();
      },
      no_persist());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(compiled(td), at::full({1}, 2.0)));
  EXPECT_EQ(compiled.stats().compiles, 0);
  EXPECT_EQ(compiled.stats().fallbacks, 2);
  EXPECT_NE(compiled.explain().find("calls verify()"), std::string::npos) << compiled.explain();
}

TEST(CompileGuard, UntraceableEntriesAreBoundedAndCounted) {
  CompileOptions o = no_persist();
  o.cache_limit = 3;
  auto compiled = compile(
      "never_traces",
      [](TensorDict& td) {
        if (torch::jit::tracer::isTracing()) throw std::runtime_error("not under the tracer");
        return td.get("x") + 1;
      },
      o);
  for (int n = 1; n <= 6; ++n) {
    TensorDict td({n});
    td.set("x", at::zeros({n}));
    EXPECT_TRUE(at::equal(compiled(td), at::ones({n})));
  }
  auto s = compiled.stats();
  EXPECT_EQ(s.compiles, 0);
  EXPECT_EQ(s.fallbacks, 3) << "calls past the limit of 3 eager entries" << compiled.explain();
  EXPECT_NE(compiled.explain().find("cache_limit 3 reached"), std::string::npos)
      << compiled.explain();
}

TEST(CompileGuard, NestedCompiledCallsRunInsideTheOuterRecording) {
  auto inner = compile(
      "inner", [](TensorDict& td) { return td.get("x") * 2; }, no_persist());
  auto outer = compile(
      "outer", [&inner](TensorDict& td) { return inner(td) + td.batch_size()[0]; }, no_persist());
  for (int64_t n : {2, 3, 2}) {
    TensorDict td({n});
    td.set("x", at::ones({n}));
    EXPECT_TRUE(at::equal(outer(td), at::ones({n}) * 2 + n)) << outer.explain();
  }
  EXPECT_EQ(outer.stats().compiles, 2);
}

// ---- lazy properties inside compiled functions

TEST(CompileGuard, LazyPropertyOnAReadOnlyStore) {
  TempDir t;
  {
    auto w = TensorDict::create(t / "s", {3});
    w.set("x", at::arange(3, at::kFloat));
    w.commit();
  }
  auto reader = TensorDict::open(t / "s");
  auto fn = [](TensorDict& td) {
    return td.get_or_compute("double", {"x"}, [](const TensorDict& d) { return d.get("x") * 2; }) +
           1;
  };
  auto compiled = compile("lazy_ro", fn, no_persist());
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(at::equal(compiled(reader), at::arange(3, at::kFloat) * 2 + 1));
  EXPECT_EQ(reader.lazy_stats().computed, 1) << compiled.explain();
}

// ---- graphs are never reused for other code

TEST(CompileGuard, SameNameOtherFunctionNeverSharesGraphs) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {2});
  td.set("x", at::ones({2}));
  td.commit();
  auto a = compile("same_name", [](TensorDict& d) { return d.get("x") * 2; });
  EXPECT_TRUE(at::equal(a(td), at::full({2}, 2.0)));
  auto b = compile("same_name", [](TensorDict& d) { return d.get("x") * 3; });
  EXPECT_TRUE(at::equal(b(td), at::full({2}, 3.0)));
  EXPECT_TRUE(at::equal(b(td), at::full({2}, 3.0)));
  EXPECT_EQ(b.stats().loads, 0) << b.explain();
  EXPECT_NE(b.explain().find("another function was compiled under the name"), std::string::npos)
      << b.explain();
  // Plain functions of one signature are told apart by their address in their object.
  auto p1 = compile("plain_function", plus_one);
  EXPECT_TRUE(at::equal(p1(td), at::full({2}, 2.0)));
  auto p2 = compile("plain_function", plus_two);
  EXPECT_TRUE(at::equal(p2(td), at::full({2}, 3.0)));
  EXPECT_EQ(p2.stats().loads, 0) << p2.explain();
  // The identity a caller adds keeps apart what the code cannot show.
  for (double scale : {4.0, 5.0}) {
    CompileOptions o;
    o.code_identity = "scale=" + std::to_string(scale);
    auto c = compile(
        "captured", [scale](TensorDict& d) { return d.get("x") * scale; }, o);
    EXPECT_TRUE(at::equal(c(td), at::full({2}, scale)));
    EXPECT_EQ(c.stats().loads, 0) << c.explain();
  }
}

using PluginRun = at::Tensor (*)(TensorDict&, CompileStats*);

PluginRun load_plugin(const char* path) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  EXPECT_NE(h, nullptr) << dlerror();
  return h ? reinterpret_cast<PluginRun>(dlsym(h, "scaled_plugin_run")) : nullptr;
}

TEST(CompileGuard, ARebuiltSharedLibraryNeverLoadsItsOldGraphs) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {2});
  td.set("x", at::ones({2}));
  td.commit();
  PluginRun old_build = load_plugin(TDSTORE_PLUGIN_SCALE2);
  PluginRun new_build = load_plugin(TDSTORE_PLUGIN_SCALE3);
  ASSERT_TRUE(old_build && new_build);
  CompileStats s;
  EXPECT_TRUE(at::equal(old_build(td, &s), at::full({2}, 2.0)));
  EXPECT_EQ(s.compiles, 1);
  EXPECT_TRUE(at::equal(new_build(td, &s), at::full({2}, 3.0)));
  EXPECT_EQ(s.loads, 0) << "the other build's graph must not be loaded";
  EXPECT_EQ(s.compiles, 1);
  EXPECT_TRUE(at::equal(old_build(td, &s), at::full({2}, 2.0)));
  EXPECT_EQ(s.loads, 1) << "its own graph is still there";
}

// A captured value no key shows: the graph stored by the first run is checked against eager
// on its first call in the second run, and retraced.
TEST(CompileGuardChild, CapturedScale) {
  const char* arg = testing::child_arg();
  if (!arg) GTEST_SKIP() << "runs as a child";
  std::string s(arg);
  auto sep = s.find('|');
  const double scale = std::stod(s.substr(sep + 1));
  auto td = TensorDict::open(s.substr(0, sep), OpenMode::ReadWrite);
  auto compiled = compile("captured_scale", [scale](TensorDict& d) { return d.get("x") * scale; });
  bool right = true;
  for (int i = 0; i < 3; ++i) right = right && at::equal(compiled(td), at::full({2}, scale));
  auto st = compiled.stats();
  std::cerr << compiled.explain();
  if (!right) _exit(3);
  if (scale == 2.0) _exit(st.compiles == 1 ? testing::kChildPassed : 4);
  // Second run: loaded, found to differ on its first call, retraced; then served by graphs.
  bool retraced = compiled.explain().find("retraced") != std::string::npos;
  _exit(st.loads == 1 && st.compiles == 1 && retraced && st.hits == 2 ? testing::kChildPassed : 5);
}

TEST(CompileGuard, ACapturedValueChangedBetweenRunsIsCaught) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "s", {2});
    td.set("x", at::ones({2}));
    td.commit();
  }
  const std::string path = (t / "s").string();
  EXPECT_EQ(testing::run_child("CompileGuardChild.CapturedScale", path + "|2"), 0);
  EXPECT_EQ(testing::run_child("CompileGuardChild.CapturedScale", path + "|3"), 0);
}

std::vector<std::string> graph_keys(const std::filesystem::path& store) {
  auto s = storage::Store::open(store, OpenMode::ReadOnly, {});
  std::vector<std::string> keys;
  for (const auto& [k, v] : s->scan_cache("graph/")) keys.push_back(k);
  return keys;
}

TEST(CompileGuardChild, DamagedRecord) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  auto td = TensorDict::open(testing::child_arg(), OpenMode::ReadWrite);  // must not throw
  auto compiled = compile("damaged", plus_one);
  bool right =
      at::equal(compiled(td), at::full({2}, 2.0)) && at::equal(compiled(td), at::full({2}, 2.0));
  bool skipped = compiled.explain().find("skipped") != std::string::npos;
  std::cerr << compiled.explain();
  _exit(right && skipped && compiled.stats().compiles == 1 ? testing::kChildPassed : 3);
}

TEST(CompileGuard, ADamagedCacheRecordNeverBlocksTheStore) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "s", {2});
    td.set("x", at::ones({2}));
    td.commit();
    auto compiled = compile("damaged", plus_one);
    compiled(td);
  }
  auto keys = graph_keys(t / "s");
  ASSERT_EQ(keys.size(), 1u);
  testing::overwrite_catalog_record(t / "s", keys[0],
                                    "junk");  // not even a versioned catalog value
  EXPECT_EQ(testing::run_child("CompileGuardChild.DamagedRecord", (t / "s").string()), 0);
  // A new process persisted a good record over it: the store verifies clean again.
  EXPECT_TRUE(TensorDict::open(t / "s").verify().empty());
  testing::overwrite_catalog_record(t / "s", keys[0], "junk");
  auto bad = TensorDict::open(t / "s").verify();
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0], "/catalog/" + keys[0]);
}

TEST(CompileGuardChild, AlteredGuard) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  auto td = TensorDict::open(testing::child_arg(), OpenMode::ReadWrite);
  auto compiled = compile("altered", plus_one);
  bool right = at::equal(compiled(td), at::full({3}, 2.0));
  bool refused = compiled.explain().find("does not hash to its key") != std::string::npos;
  std::cerr << compiled.explain();
  _exit(right && refused && compiled.stats().loads == 0 ? testing::kChildPassed : 3);
}

TEST(CompileGuard, AStoredGuardIsCheckedAgainstItsKey) {
  TempDir t;
  std::string key, value;
  {
    auto td = TensorDict::create(t / "s", {3});
    td.set("x", at::ones({3}));
    td.commit();
    auto compiled = compile("altered", plus_one);
    compiled(td);
    auto s = storage::Store::open(t / "s", OpenMode::ReadOnly, {});  // cache writes need no writer
    auto records = s->scan_cache("graph/altered/");
    ASSERT_EQ(records.size(), 1u);
    std::tie(key, value) = records[0];
    // Alter the guard inside the record: accept any size of "x" (its sizes [3] become [4]).
    // Sealed again with this user's key: the check against the key is the last line of defense
    // behind the seal (a record this user's own key signed, crafted).
    auto record = storage::decode_graph_record(unsealed(value, key), key);
    record.meta["observations"][0]["spec"]["sizes"] = {4};
    s->put_cache(key, resealed(key, storage::encode_graph_record(record.meta, record.module)));
  }
  EXPECT_EQ(testing::run_child("CompileGuardChild.AlteredGuard", (t / "s").string()), 0);
}

TEST(CompileGuardChild, CraftedNumbers) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  auto td = TensorDict::open(testing::child_arg(), OpenMode::ReadWrite);
  auto compiled = compile("crafted", plus_one);
  bool right = at::equal(compiled(td), at::full({3}, 2.0));
  bool refused = compiled.explain().find("not an integer in range") != std::string::npos;
  std::cerr << compiled.explain();
  _exit(right && refused && compiled.stats().loads == 0 ? testing::kChildPassed : 3);
}

// A stored guard's numbers are taken only when they are integers in range: a float or an
// out-of-range size (which a cast to int64_t would make undefined) skips the record.
TEST(CompileGuard, AStoredGuardWithCraftedNumbersIsSkipped) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "s", {3});
    td.set("x", at::ones({3}));
    td.commit();
    compile("crafted", plus_one)(td);
  }
  auto s = storage::Store::open(t / "s", OpenMode::ReadOnly, {});
  auto records = s->scan_cache("graph/crafted/");
  ASSERT_EQ(records.size(), 1u);
  const auto& [key, value] = records[0];
  for (nlohmann::json size :
       {nlohmann::json(3.5), nlohmann::json(1e300), nlohmann::json(uint64_t{1} << 63)}) {
    auto record = storage::decode_graph_record(unsealed(value, key), key);
    record.meta["observations"][0]["spec"]["sizes"] = {size};
    s->put_cache(key, resealed(key, storage::encode_graph_record(record.meta, record.module)));
    EXPECT_EQ(testing::run_child("CompileGuardChild.CraftedNumbers", (t / "s").string()), 0)
        << size;
    s->put_cache(key, value);
  }
}

}  // namespace
}  // namespace tdstore
