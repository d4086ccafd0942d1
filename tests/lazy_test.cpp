// Lazy properties: computed once, stored with provenance, reused across processes, recomputed
// when a dependency or the version changes; atomic with their provenance under SIGKILL.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <random>

#include "storage/checksum.h"
#include "tdstore/tdstore.h"
#include "tests/kill_harness.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

using testing::TempDir;

// A property: the row-normalized "x", counting calls.
struct Normalize {
  int* calls;
  at::Tensor operator()(const TensorDict& td) const {
    ++*calls;
    at::Tensor x = td.get("x").to(at::kFloat);
    return x / x.sum(1, true);
  }
};

TensorDict make_store(const std::filesystem::path& dir) {
  auto td = TensorDict::create(dir, {4});
  td.set("x", at::arange(1, 13, at::kFloat).reshape({4, 3}));
  td.set("other", at::ones({4}));
  td.commit();
  return td;
}

TEST(Lazy, ComputedOnceThenReused) {
  TempDir t;
  auto td = make_store(t / "s");
  int calls = 0;
  at::Tensor a = td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  at::Tensor b = td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_TRUE(at::allclose(a.sum(1), at::ones({4})));
  EXPECT_EQ(td.lazy_stats().computed, 1);
  EXPECT_EQ(td.lazy_stats().reused, 1);
  td.set("other", at::ones({4}) * 3);  // not a dep
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  EXPECT_EQ(calls, 1);
  td.set("x", td.get("x").clone());  // same content: checksums equal, nothing to redo
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  EXPECT_EQ(calls, 1);
}

TEST(LazyChild, Reader) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  auto td = TensorDict::open(testing::child_arg(), OpenMode::ReadWrite);
  int calls = 0;
  at::Tensor v = td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  bool right = at::allclose(v.sum(1), at::ones({4}));
  _exit(!right ? 100 : calls == 0 ? testing::kChildPassed : calls);  // computed nothing: passed
}

TEST(Lazy, SecondProcessComputesNothing) {
  TempDir t;
  {
    auto td = make_store(t / "s");
    int calls = 0;
    td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
    EXPECT_EQ(calls, 1);
  }
  EXPECT_EQ(testing::run_child("LazyChild.Reader", (t / "s").string()), 0) << "calls in child";
}

TEST(Lazy, RecomputedWhenDepVersionOrPropertyChanges) {
  TempDir t;
  auto td = make_store(t / "s");
  int calls = 0;
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  td.set("x", td.get("x") * 2 + 1);
  td.commit();
  at::Tensor v = td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  EXPECT_EQ(calls, 2) << "dep changed";
  EXPECT_TRUE(at::allclose(v, td.get("x") / td.get("x").sum(1, true)));
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls}, "v2");
  EXPECT_EQ(calls, 3) << "version changed";
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls}, "v2");
  EXPECT_EQ(calls, 3);
  td.set("x_norm", at::ones({4, 3}));  // someone overwrote the property itself
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls}, "v2");
  EXPECT_EQ(calls, 4) << "property overwritten";
  EXPECT_TRUE(td.invalidate("x_norm"));
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls}, "v2");
  EXPECT_EQ(calls, 5) << "invalidated";
  td.erase("x");
  td.commit();
  try {
    td.get_or_compute("x_norm", {"x"}, Normalize{&calls}, "v2");
    FAIL() << "expected KeyError";
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("dependency 'x'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls, 5) << "fn is not called without its deps";
  auto info = td.lazy_info("x_norm");
  ASSERT_TRUE(info);
  EXPECT_FALSE(info->valid);
}

// Counts calls; returns the dep's bytes reinterpreted as float, per row, so that any change
// of the dependency's spec would change what eager code computes.
struct RowSum {
  int* calls;
  at::Tensor operator()(const TensorDict& td) const {
    ++*calls;
    at::Tensor x = td.get("x");
    return x.reshape({x.size(0), -1}).to(at::kDouble).sum(1);
  }
};

void expect_spec_changes_recompute(TensorDict& td) {
  int calls = 0;
  td.set("x", at::arange(1, 13, at::kFloat).reshape({4, 3}));
  td.get_or_compute("x_sum", {"x"}, RowSum{&calls});
  // The same bytes as int32: a different dtype is a different input.
  td.set("x", td.get("x").clone().view(at::kInt));
  at::Tensor as_int = td.get_or_compute("x_sum", {"x"}, RowSum{&calls});
  EXPECT_EQ(calls, 2) << "dtype changed over the same bytes";
  EXPECT_TRUE(at::equal(as_int, td.get("x").reshape({4, -1}).to(at::kDouble).sum(1)));
  // The same bytes and dtype in another shape.
  td.set("x", td.get("x").clone().unsqueeze(1));
  td.get_or_compute("x_sum", {"x"}, RowSum{&calls});
  EXPECT_EQ(calls, 3) << "shape changed over the same bytes";
  td.get_or_compute("x_sum", {"x"}, RowSum{&calls});
  EXPECT_EQ(calls, 3);
}

TEST(Lazy, DependencySpecIsPartOfItsFingerprint) {
  TempDir t;
  auto store = TensorDict::create(t / "s", {4});
  expect_spec_changes_recompute(store);
  auto mem = TensorDict({4});
  expect_spec_changes_recompute(mem);
}

void expect_offsets_change_recomputes(TensorDict& td) {
  int calls = 0;
  auto lengths = [&calls](const TensorDict& d) {
    ++calls;
    auto r = d.get_ragged("tokens");
    return (r.offsets.slice(0, 1) - r.offsets.slice(0, 0, -1)).clone();
  };
  at::Tensor values = at::arange(10, at::kLong);
  td.set_ragged("tokens", values, at::tensor(std::vector<int64_t>{0, 2, 5, 9, 10}));
  at::Tensor a = td.get_or_compute("tokens_len", {"tokens"}, lengths);
  // The same values split differently.
  td.set_ragged("tokens", values, at::tensor(std::vector<int64_t>{0, 1, 2, 3, 10}));
  at::Tensor b = td.get_or_compute("tokens_len", {"tokens"}, lengths);
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(at::equal(b, at::tensor(std::vector<int64_t>{1, 1, 1, 7}))) << b;
  td.get_or_compute("tokens_len", {"tokens"}, lengths);
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(at::equal(a, b));
}

TEST(Lazy, RaggedDependencyIncludesItsOffsets) {
  TempDir t;
  auto store = TensorDict::create(t / "s", {4});
  expect_offsets_change_recomputes(store);
  store.commit();
  auto mem = TensorDict({4});
  expect_offsets_change_recomputes(mem);
}

void expect_transitive_validity(TensorDict& td) {
  int calls_a = 0, calls_b = 0;
  auto a = [&calls_a](const TensorDict& d) {
    ++calls_a;
    return d.get("x") * 2;
  };
  // B reads A through get_or_compute: asking for B revalidates A first, in order.
  auto b = [&](const TensorDict& d) {
    ++calls_b;
    return const_cast<TensorDict&>(d).get_or_compute("a", {"x"}, a) + 1;
  };
  td.set("x", at::ones({4}));
  td.get_or_compute("a", {"x"}, a);  // a dependency exists before its dependents are asked for
  EXPECT_TRUE(at::equal(td.get_or_compute("b", {"a"}, b), at::full({4}, 3.0)));
  EXPECT_EQ(calls_a, 1);
  EXPECT_EQ(calls_b, 1);
  td.set("x", at::full({4}, 5.0));  // A's input changes; B is asked for first
  EXPECT_TRUE(at::equal(td.get_or_compute("b", {"a"}, b), at::full({4}, 11.0)));
  EXPECT_EQ(calls_a, 2);
  EXPECT_EQ(calls_b, 2);
  auto info = td.lazy_info("b");
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->valid);
  EXPECT_TRUE(at::equal(td.get_or_compute("b", {"a"}, b), at::full({4}, 11.0)));
  EXPECT_EQ(calls_b, 2);
  // B that reads A as a plain key cannot revalidate it: a clear error, never the stale chain.
  td.set("x", at::full({4}, 7.0));
  auto plain = [](const TensorDict& d) { return d.get("a") + 1; };
  try {
    td.get_or_compute("b", {"a"}, plain);
    FAIL() << "expected an error about the stale lazy property 'a'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'a', which is stale"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(td.lazy_info("b")->valid);
  EXPECT_TRUE(at::equal(td.get_or_compute("b", {"a"}, b), at::full({4}, 15.0)));
}

TEST(Lazy, ValidityIsTransitive) {
  TempDir t;
  auto store = TensorDict::create(t / "s", {4});
  expect_transitive_validity(store);
  auto mem = TensorDict({4});
  expect_transitive_validity(mem);
}

void expect_append_drops_properties(TensorDict& td) {
  int calls = 0;
  td.set("x", at::arange(1, 13, at::kFloat).reshape({4, 3}));
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  TensorDict rows({2});
  rows.set("x", at::ones({2, 3}));
  td.append(rows);  // rows without the property: it is dropped, not demanded
  EXPECT_FALSE(td.contains("x_norm"));
  at::Tensor v = td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(v.size(0), 6);
  EXPECT_TRUE(at::allclose(v, td.get("x") / td.get("x").sum(1, true)));
  // Rows holding a plain key of the dict are still required to hold it.
  td.set("y", at::zeros({6}));
  EXPECT_THROW(td.append(rows), KeyError);
}

TEST(Lazy, AppendDropsPropertiesTheRowsDoNotHold) {
  TempDir t;
  auto store = TensorDict::create(t / "s", {4});
  expect_append_drops_properties(store);
  store.commit();
  EXPECT_EQ(TensorDict::open(t / "s").batch_size()[0], 6);
  auto mem = TensorDict({4});
  expect_append_drops_properties(mem);
}

TEST(Lazy, ProvenanceIsListed) {
  TempDir t;
  {
    auto td = make_store(t / "s");
    int calls = 0;
    td.get_or_compute("feat/x_norm", {"x", "other"}, Normalize{&calls}, "v1");
  }
  auto td = TensorDict::open(t / "s");
  auto props = td.lazy_properties();
  ASSERT_EQ(props.size(), 1u);
  const auto& p = props[0];
  EXPECT_EQ(p.key, "feat/x_norm");
  EXPECT_EQ(p.version, "v1");
  ASSERT_EQ(p.deps.size(), 2u);
  EXPECT_EQ(p.deps[0].first, "other");
  EXPECT_EQ(p.deps[1].first, "x");
  at::Tensor x = td.get("x").contiguous();
  ASSERT_EQ(p.dep_checksums.size(), 2u);
  EXPECT_EQ(p.dep_checksums[1], storage::xxh3(x.data_ptr(), x.numel() * 4));
  EXPECT_TRUE(p.valid);
  EXPECT_TRUE(p.persisted);
  EXPECT_GT(p.computed_at_ns, 0);
  EXPECT_GE(p.compute_ns, 0);
  EXPECT_EQ(td.sub("feat").lazy_properties().size(), 1u);
}

TEST(Lazy, ReadOnlyStoreComputesInMemoryAndPersistsNothing) {
  TempDir t;
  { make_store(t / "s"); }
  int calls = 0;
  {
    auto ro = TensorDict::open(t / "s");
    at::Tensor v = ro.get_or_compute("x_norm", {"x"}, Normalize{&calls});
    EXPECT_TRUE(at::allclose(v.sum(1), at::ones({4})));
    ro.get_or_compute("x_norm", {"x"}, Normalize{&calls});
    EXPECT_EQ(calls, 1) << "kept for this handle";
    EXPECT_EQ(ro.lazy_stats().not_persisted, 1);
    EXPECT_FALSE(ro.contains("x_norm"));
    auto info = ro.lazy_info("x_norm");
    ASSERT_TRUE(info);
    EXPECT_FALSE(info->persisted);
  }
  auto ro = TensorDict::open(t / "s");
  EXPECT_FALSE(ro.contains("x_norm"));
  EXPECT_TRUE(ro.lazy_properties().empty());
}

TEST(Lazy, InMemoryDict) {
  TensorDict td({4});
  td.set("x", at::arange(1, 13, at::kFloat).reshape({4, 3}));
  int calls = 0;
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  EXPECT_EQ(calls, 1);
  td.set("x", td.get("x") + 1);
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls});
  EXPECT_EQ(calls, 2);
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls}, "v2");
  EXPECT_EQ(calls, 3);
  td.set("x_norm", at::ones({4, 3}));
  td.get_or_compute("x_norm", {"x"}, Normalize{&calls}, "v2");
  EXPECT_EQ(calls, 4);
  ASSERT_TRUE(td.lazy_info("x_norm"));
  EXPECT_TRUE(td.lazy_info("x_norm")->valid);
  EXPECT_FALSE(td.lazy_info("x_norm")->persisted);
  td.erase("x");
  EXPECT_THROW(td.get_or_compute("x_norm", {"x"}, Normalize{&calls}, "v2"), KeyError);
}

// ---- two writer processes racing for the same property

// "<store>|<log>|<fifo>": computes the property; its fn logs the call, reports "computing" and
// waits for a byte on the fifo, so that the parent can start the other racer meanwhile.
TEST(LazyChild, Racer) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  std::string arg = testing::child_arg();
  auto bar = arg.find('|'), bar2 = arg.rfind('|');
  std::string dir = arg.substr(0, bar), log = arg.substr(bar + 1, bar2 - bar - 1),
              fifo = arg.substr(bar2 + 1);
  StoreOptions o;
  o.lock_timeout_ms = 300000;
  testing::report("opening");
  auto td = TensorDict::open(dir, OpenMode::ReadWrite, o);
  td.get_or_compute("slow", {"x"}, [&](const TensorDict& d) {
    std::ofstream(log, std::ios::app) << getpid() << "\n";
    testing::report("computing");
    std::ifstream go(fifo);  // blocks until the parent opens the fifo
    char c;
    go.get(c);
    return d.get("x") * 10;
  });
  _exit(testing::kChildPassed);
}

// The second racer starts while the first computes; it must read the first one's result.
TEST(Lazy, RacingWritersComputeOnce) {
  TempDir t;
  { make_store(t / "s"); }
  ASSERT_EQ(mkfifo((t / "go").c_str(), 0600), 0);
  std::string arg =
      (t / "s").string() + "|" + (t / "calls.log").string() + "|" + (t / "go").string();
  testing::Child a = testing::Child::test("LazyChild.Racer", arg);
  ASSERT_TRUE(a.wait_for("computing"));
  testing::Child b = testing::Child::test("LazyChild.Racer", arg);
  ASSERT_TRUE(b.wait_for("opening"));  // about to wait for the writer lock a holds
  std::ofstream(t / "go") << 'g';
  EXPECT_EQ(a.wait(), 0);
  // b must not compute; if it does, a byte waits for it so that it fails below instead of hanging.
  const int spare = ::open((t / "go").c_str(), O_RDWR | O_NONBLOCK);
  ASSERT_EQ(::write(spare, "g", 1), 1);
  EXPECT_EQ(b.wait(), 0);
  ::close(spare);
  std::ifstream in(t / "calls.log");
  int lines = 0;
  for (std::string l; std::getline(in, l);) ++lines;
  EXPECT_EQ(lines, 1) << "one process computes, the other reads";
  auto td = TensorDict::open(t / "s");
  EXPECT_TRUE(at::equal(td.get("slow"), td.get("x") * 10));
  EXPECT_TRUE(td.lazy_info("slow")->valid);
}

// ---- crash injection: properties and provenance become visible together

at::Tensor state_x(int64_t n) { return at::full({4, 3}, static_cast<double>(n), at::kDouble); }

TEST(LazyChild, Computer) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  auto td = TensorDict::open(testing::child_arg(), OpenMode::ReadWrite);
  int64_t n = td.contains("x") ? td.get("x")[0][0].item<int64_t>() : 0;
  testing::report("ready", n);
  for (;;) {
    testing::report("begin", ++n);
    td.set("x", state_x(n));
    td.commit();
    for (int p = 0; p < 3; ++p)
      td.get_or_compute("double" + std::to_string(p), {"x"},
                        [p](const TensorDict& d) { return d.get("x") * 2 + p; });
    testing::report("done", n);
  }
}

// The computer is killed inside its k-th round of commits (counted in its reports) until 15
// kills landed mid-round.
TEST(Lazy, KilledComputerNeverPairsPropertyWithForeignProvenance) {
  TempDir t;
  { make_store(t / "s"); }
  {
    auto td = TensorDict::open(t / "s", OpenMode::ReadWrite);
    td.set("x", state_x(0));
    td.commit();
  }
  std::mt19937 rng(7);
  int checked_valid = 0;
  testing::KillRounds rounds(15, 150);
  while (rounds.more(checked_valid ? "" : "a kill that left a valid property")) {
    testing::Child computer = testing::Child::test("LazyChild.Computer", (t / "s").string());
    ASSERT_TRUE(computer.wait_for("ready"));
    ASSERT_TRUE(computer.wait_for("begin", 1 + static_cast<int>(rng() % 3)));
    const testing::Killed k = computer.kill();
    ASSERT_TRUE(k.signaled) << "the computer exited with " << k.code;
    rounds.count(k);
    auto td = TensorDict::open(t / "s");
    for (const auto& info : td.lazy_properties()) {
      ASSERT_EQ(info.deps.size(), 1u);
      int p = info.key.back() - '0';
      at::Tensor prop = td.get(info.key);
      // The x this property was computed from, and its checksum: must be the provenance's.
      at::Tensor source = ((prop - p) / 2).contiguous();
      ASSERT_EQ(info.dep_checksums.size(), 1u);
      EXPECT_EQ(storage::xxh3(source.data_ptr(), source.numel() * 8), info.dep_checksums[0])
          << info.key << " paired with provenance it was not computed from";
      if (info.valid) {
        ++checked_valid;
        EXPECT_TRUE(at::equal(prop, td.get("x") * 2 + p)) << info.key;
      }
    }
    if (HasFailure()) return;
  }
  EXPECT_GT(checked_valid, 0);
}

}  // namespace
}  // namespace tdstore
