// TensorDict API: round trips, tensordict operations, errors, persistence across processes.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tdstore/tdstore.h"
#include "tests/child_process.h"
#include "tests/error_message.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

using testing::TempDir;

// Every registry dtype, with a deterministic non-trivial value of the given shape.
std::vector<std::pair<std::string, at::Tensor>> sample_tensors() {
  std::vector<std::pair<std::string, at::Tensor>> out;
  auto base = [](std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return (at::arange(n, at::kDouble) * 1.25 - 3).reshape(shape);
  };
  const std::vector<std::pair<std::string, at::ScalarType>> types = {
      {"bool", at::kBool},
      {"uint8", at::kByte},
      {"int8", at::kChar},
      {"int16", at::kShort},
      {"int32", at::kInt},
      {"int64", at::kLong},
      {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16},
      {"float32", at::kFloat},
      {"float64", at::kDouble},
      {"complex64", at::kComplexFloat},
      {"complex128", at::kComplexDouble}};
  for (const auto& [name, type] : types) {
    out.emplace_back("dtype/" + name, base({4, 3}).to(type));
    out.emplace_back("zero-element/" + name, at::empty({4, 0, 2}, type));
  }
  out.emplace_back("non contiguous.t", base({4, 6}).to(at::kFloat).t().contiguous().t());
  out.emplace_back("strided", base({4, 8}).to(at::kInt).slice(1, 0, 8, 3));
  out.emplace_back("unicode/ключ/鍵 🙂", base({4}).to(at::kFloat));
  out.emplace_back("deep/a/b/c/d", base({4, 1, 1, 1}).to(at::kLong));
  return out;
}

void expect_same(const at::Tensor& a, const at::Tensor& b, const std::string& key) {
  ASSERT_EQ(a.scalar_type(), b.scalar_type()) << key;
  ASSERT_EQ(a.sizes(), b.sizes()) << key;
  EXPECT_TRUE(at::equal(a, b)) << key;
}

void fill(TensorDict& td) {
  for (const auto& [k, t] : sample_tensors()) td.set(k, t);
}

void check(const TensorDict& td) {
  auto samples = sample_tensors();
  std::vector<std::string> expect_keys;
  for (const auto& [k, t] : samples) {
    expect_keys.push_back(k);
    expect_same(td.get(k), t, k);
  }
  std::sort(expect_keys.begin(), expect_keys.end());
  EXPECT_EQ(td.keys(), expect_keys);
  EXPECT_EQ(td.size(), static_cast<int64_t>(samples.size()));
}

TEST(RoundTrip, InMemory) {
  TensorDict td({4});
  fill(td);
  check(td);
}

TEST(RoundTrip, SameProcessAndReopen) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "s", {4});
    fill(td);
    check(td);  // staged
    td.commit();
    check(td);
  }
  auto td = TensorDict::open(t / "s");
  EXPECT_EQ(td.batch_size(), std::vector<int64_t>{4});
  check(td);
  EXPECT_TRUE(td.verify().empty());
}

// The first command a newcomer types: a bare relative name (its parent path is empty), a
// nested one, and one through "..", from a scratch working directory.
TEST(RoundTrip, RelativeNamesFromAScratchWorkingDirectory) {
  TempDir t;
  std::filesystem::create_directories(t / "work");
  const auto saved = std::filesystem::current_path();
  std::filesystem::current_path(t / "work");
  for (const char* name : {"mystore", "a/b/mystore", "../up"}) {
    {
      auto td = TensorDict::create(name, {4});
      fill(td);
      td.commit();
    }
    auto td = TensorDict::open(name);
    check(td);
    EXPECT_TRUE(td.verify().empty()) << name;
  }
  std::filesystem::current_path(saved);
  EXPECT_TRUE(std::filesystem::exists(t / "up" / "keys.tdd"));
}

TEST(RoundTrip, ZeroDimStore) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {});
  td.set("scalar", at::scalar_tensor(3.5, at::kDouble));
  td.set("int scalar", at::scalar_tensor(-7, at::kLong));
  td.set("empty", at::empty({8, 0}));
  td.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.get("scalar").dim(), 0);
  EXPECT_EQ(r.get("scalar").item<double>(), 3.5);
  EXPECT_EQ(r.get("int scalar").item<int64_t>(), -7);
  EXPECT_EQ(r.get("empty").sizes(), (std::vector<int64_t>{8, 0}));
}

// A new process opens the store written by the parent and checks every key.
TEST(RoundTripChild, Check) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  check(TensorDict::open(testing::child_arg()));
}

TEST(RoundTrip, NewProcess) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {4});
  fill(td);
  td.commit();
  EXPECT_EQ(testing::run_child("RoundTripChild.Check", (t / "s").string()), 0);
}

TEST(Persistent, ReadOnlyViewsAreCopyOnWrite) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "s", {3});
    td.set("x", at::zeros({3, 2}));
    td.commit();
  }
  {
    auto r = TensorDict::open(t / "s");
    at::Tensor x = r.get("x");
    x.add_(5);  // private to this process
    EXPECT_EQ(x.sum().item<float>(), 30);
    EXPECT_TRUE(r.verify().empty()) << "verify checks the stored bytes, not this process's copy";
  }
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.get("x").sum().item<float>(), 0);
  EXPECT_TRUE(r.verify().empty());
}

TEST(Persistent, ViewsOutliveTheDict) {
  TempDir t;
  at::Tensor x;
  {
    auto td = TensorDict::create(t / "s", {});
    td.set("x", at::arange(10, at::kFloat));
    td.commit();
    x = TensorDict::open(t / "s").get("x");
  }
  EXPECT_EQ(x.sum().item<float>(), 45);
}

TEST(Persistent, WriterInPlaceEditNeverLeaksIntoLaterKeys) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {});
  td.set("a", at::zeros({3}));
  td.get("a").add_(1);  // copy-on-write of a's page in this process
  td.set("b", at::full_like(at::zeros({3}), 7));
  EXPECT_EQ(td.get("b").sum().item<float>(), 21);
  td.commit();
  EXPECT_EQ(TensorDict::open(t / "s").get("a").sum().item<float>(), 0);
}

// The loop a training job runs (set its state, read it back, commit) reuses the arena: the file
// stays a few states large, while a tensor kept from an early state keeps its values.
TEST(Persistent, AnOverwriteLoopReusesSpaceAndKeptViewsKeepTheirValues) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {});
  at::Tensor kept;
  for (int i = 0; i < 200; ++i) {
    td.set("state", at::full({256, 1024}, static_cast<float>(i)));  // 1 MiB
    at::Tensor back = td.get("state");
    ASSERT_EQ(back[255][1023].item<float>(), static_cast<float>(i));
    if (i == 3) kept = back;
    td.commit();
  }
  EXPECT_EQ(kept.min().item<float>(), 3);
  EXPECT_EQ(kept.max().item<float>(), 3);
  EXPECT_LE(std::filesystem::file_size(t / "s" / "arena.tda"), uint64_t{6} << 20);
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.get("state").min().item<float>(), 199);
  EXPECT_TRUE(r.verify().empty());
}

TEST(Persistent, SetCopiesAndGetSeesLatest) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {2});
  at::Tensor v = at::ones({2});
  td.set("v", v);
  v.add_(1);  // the store holds the bytes at set() time
  EXPECT_EQ(td.get("v").sum().item<float>(), 2);
  td.set("v", v);
  EXPECT_EQ(td.get("v").sum().item<float>(), 4);
  td.erase("v");
  EXPECT_FALSE(td.contains("v"));
  EXPECT_THROW(td.get("v"), KeyError);
  td.rollback();
  EXPECT_FALSE(td.contains("v"));
}

TEST(Persistent, ReaderRefresh) {
  TempDir t;
  auto w = TensorDict::create(t / "s", {});
  w.set("a", at::tensor(1));
  w.commit();
  auto r = TensorDict::open(t / "s");
  w.set("a", at::tensor(2));
  w.set("b", at::tensor(3));
  w.commit();
  EXPECT_EQ(r.get("a").item<int64_t>(), 1);
  EXPECT_FALSE(r.contains("b"));
  EXPECT_TRUE(r.refresh());
  EXPECT_EQ(r.get("a").item<int64_t>(), 2);
  EXPECT_EQ(r.get("b").item<int64_t>(), 3);
}

TEST(Persistent, Attributes) {
  TempDir t;
  auto w = TensorDict::create(t / "s", {});
  w.set_attr("source", "test");
  w.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.attr("source"), "test");
  EXPECT_EQ(r.attr_names(), std::vector<std::string>{"source"});
  EXPECT_FALSE(r.attr("missing"));
}

TEST(LockChild, TryWrite) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  try {
    TensorDict::open(testing::child_arg(), OpenMode::ReadWrite);
  } catch (const LockError& e) {
    std::string m = e.what();
    _exit(m.find("pid ") != std::string::npos ? 42 : 43);
  }
  _exit(0);
}

TEST(Persistent, SecondWriterProcessGetsLockError) {
  TempDir t;
  auto w = TensorDict::create(t / "s", {});
  EXPECT_EQ(testing::run_child("LockChild.TryWrite", (t / "s").string()), 42);
  EXPECT_THROW(TensorDict::open(t / "s", OpenMode::ReadWrite), LockError) << "same process too";
}

// A child whose test does not exist (renamed, filtered out) cannot pass for one that passed.
TEST(ChildProcess, AChildThatRanNoTestIsNotASuccess) {
  EXPECT_EQ(testing::run_child("NoSuchChild.Renamed", "x"), testing::kChildRanNothing);
  EXPECT_NE(testing::run_child("NoSuchChild.Renamed", "x"), 0);
}

// ---- errors name the store, the key and what was expected

using testing::message_of;

TEST(Errors, BadInputIsRejectedAndCommittedStateKept) {
  TempDir t;
  StoreOptions o;
  o.key_capacity = 3;
  auto td = TensorDict::create(t / "s", {4}, o);
  td.set("kept", at::ones({4}));
  td.commit();
  std::string m = message_of([&] { td.set("obs", at::ones({5, 2})); });
  EXPECT_NE(m.find("'obs'"), std::string::npos) << m;
  EXPECT_NE(m.find("[5, 2]"), std::string::npos) << m;
  EXPECT_NE(m.find("[4]"), std::string::npos) << m;
  EXPECT_NE(m.find((t / "s").string()), std::string::npos) << m;
  EXPECT_THROW(td.set("obs", at::ones({5, 2})), ShapeError);
  EXPECT_THROW(td.set("q", at::empty({4}, at::kComplexHalf)), DTypeError);
  EXPECT_THROW(td.set("meta", at::empty({4}, at::TensorOptions().device(at::kMeta))), DTypeError);
  EXPECT_THROW(td.set("sparse", at::ones({4, 2}).to_sparse()), DTypeError);
  TensorDict mem({4});
  EXPECT_THROW(mem.set("meta", at::empty({4}, at::TensorOptions().device(at::kMeta))), DTypeError);
  EXPECT_THROW(td.set("", at::ones({4})), KeyError);
  EXPECT_THROW(td.set(std::string("a\0b", 3), at::ones({4})), KeyError);
  EXPECT_THROW(td.set(std::string(400, 'k'), at::ones({4})), KeyError);
  EXPECT_THROW(td.set("a//b", at::ones({4})), KeyError);
  EXPECT_THROW(td.set("kept/child", at::ones({4})), KeyError);
  EXPECT_THROW(td.get("absent"), KeyError);
  EXPECT_THROW(td.erase("absent"), KeyError);
  td.set("k2", at::ones({4}));
  td.set("k3", at::ones({4}));
  EXPECT_THROW(td.set("k4", at::ones({4})), CapacityError);
  td.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"k2", "k3", "kept"}));
  EXPECT_TRUE(r.verify().empty());
  EXPECT_THROW(r.set("x", at::ones({4})), ReadOnlyError);
}

TEST(Errors, EraseAppliesTheKeyRulesOfSet) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {3});
  td.set_ragged("tok", std::vector<at::Tensor>{at::ones({1}), at::ones({2}), at::ones({3})});
  td.commit();
  EXPECT_THROW(td.erase(std::string("tok\0offsets", 11)), KeyError);  // the offsets' name
  EXPECT_THROW(td.erase(""), KeyError);
  EXPECT_THROW(td.erase("a//b"), KeyError);
  td.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_TRUE(r.is_ragged("tok"));
  EXPECT_EQ(r.get_ragged("tok").offsets.numel(), 4);
  EXPECT_TRUE(r.verify().empty());
}

// A zero-element shape whose byte count overflows on the way ([3, 2^62, 0] of float32) is
// refused, not committed and then unreadable for the whole store.
TEST(Errors, ShapesWhoseByteCountOverflowsAreRefused) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {3});
  td.set("kept", at::ones({3}));
  td.commit();
  const int64_t huge = int64_t{1} << 62;
  EXPECT_THROW(td.set("empty_but_huge", at::empty({3, huge, 0})), ShapeError);
  td.set("empty", at::empty({3, 1000, 0}));  // the same without the overflow is stored
  td.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"empty", "kept"}));
  EXPECT_EQ(r.get("empty").sizes(), (std::vector<int64_t>{3, 1000, 0}));
  EXPECT_TRUE(r.verify().empty());
}

TEST(Errors, OpeningNonStores) {
  TempDir t;
  EXPECT_THROW(TensorDict::open(t / "missing"), IOError);
  std::filesystem::create_directories(t / "plain");
  std::ofstream(t / "plain" / "keys.tdd") << "not a store";
  EXPECT_THROW(TensorDict::open(t / "plain"), CorruptionError);  // shorter than a header
  EXPECT_THROW(TensorDict::create(t / "plain", {}), Error);      // not empty: refused
}

TEST(Errors, FlippedDataByteFoundByVerify) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "s", {});
    td.set("a", at::ones({1000}));
    td.set("b", at::ones({1000}) * 2);
    td.commit();
  }
  EXPECT_TRUE(TensorDict::open(t / "s").verify().empty());
  // b's bytes are the only run of 2.0f in the arena: flip one byte in the middle of it.
  std::ifstream in(t / "s" / "arena.tda", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  float two = 2.0f;
  size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&two), 4), 4096);
  ASSERT_NE(at, std::string::npos);
  {
    std::fstream f(t / "s" / "arena.tda", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at + 2001));
    f.put('\x7f');
  }
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.verify(), std::vector<std::string>{"b"});
  EXPECT_EQ(r.get("a").sum().item<float>(), 1000) << "the intact key still reads";
}

// ---- tensordict operations

TensorDict sample_dict() {
  TensorDict td({4, 2});
  td.set("obs", at::arange(24, at::kFloat).reshape({4, 2, 3}));
  td.set("next/obs", at::arange(24, at::kFloat).reshape({4, 2, 3}) + 100);
  td.set("next/reward", at::arange(8, at::kFloat).reshape({4, 2}));
  td.set("done", at::zeros({4, 2}, at::kBool));
  return td;
}

TEST(Ops, IndexSliceMaskAndTensor) {
  auto td = sample_dict();
  auto row = td.index(1);
  EXPECT_EQ(row.batch_size(), std::vector<int64_t>{2});
  EXPECT_TRUE(at::equal(row.get("obs"), td.get("obs")[1]));
  EXPECT_TRUE(at::equal(td.index(-1).get("next/reward"), td.get("next/reward")[3]));
  EXPECT_THROW(td.index(4), ShapeError);

  auto sl = td.slice(1, 4, 2);
  EXPECT_EQ(sl.batch_size(), (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(at::equal(sl.get("obs"), td.get("obs").slice(0, 1, 4, 2)));
  EXPECT_EQ(td.slice(-2, 100).batch_size()[0], 2);

  auto picked = td.index(at::tensor({3, 0, 3}));
  EXPECT_EQ(picked.batch_size(), (std::vector<int64_t>{3, 2}));
  EXPECT_TRUE(at::equal(picked.get("next/obs")[0], td.get("next/obs")[3]));
  EXPECT_THROW(td.index(at::tensor({4})), ShapeError);

  auto mask = at::tensor({1, 0, 1, 0}).to(at::kBool);
  auto masked = td.index(mask);
  EXPECT_EQ(masked.batch_size(), (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(at::equal(masked.get("obs")[1], td.get("obs")[2]));
  auto mask2 = at::zeros({4, 2}, at::kBool);
  mask2[1][1] = true;
  EXPECT_EQ(td.index(mask2).batch_size(), std::vector<int64_t>{1});
  EXPECT_THROW(td.index(at::ones({3}, at::kBool)), ShapeError);
}

TEST(Ops, PersistentIndexIsZeroCopy) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {4});
  td.set("x", at::arange(8, at::kFloat).reshape({4, 2}));
  td.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.index(2).get("x").data_ptr(), r.get("x")[2].data_ptr());
  EXPECT_EQ(r.slice(1, 3).get("x").data_ptr(), r.get("x")[1].data_ptr());
}

TEST(Ops, SelectExcludeSubApplyClone) {
  auto td = sample_dict();
  EXPECT_EQ(td.select({"next"}).keys(), (std::vector<std::string>{"next/obs", "next/reward"}));
  EXPECT_EQ(td.exclude({"next", "done"}).keys(), std::vector<std::string>{"obs"});
  EXPECT_THROW(td.select({"nope"}), KeyError);

  auto next = td.sub("next");
  EXPECT_EQ(next.keys(), (std::vector<std::string>{"obs", "reward"}));
  EXPECT_EQ(next.size(), 2);
  next.set("extra", at::ones({4, 2}));  // writes go through to the parent
  EXPECT_TRUE(td.contains("next/extra"));
  EXPECT_TRUE(td.has_prefix("next"));
  EXPECT_FALSE(td.has_prefix("obs"));

  auto doubled = td.apply([](const at::Tensor& t) { return t.to(at::kDouble) * 2; });
  EXPECT_EQ(doubled.get("obs").scalar_type(), at::kDouble);
  EXPECT_EQ(doubled.get("obs")[1][1][2].item<double>(), 2 * 11);
  EXPECT_THROW(td.apply([](const at::Tensor& t) { return t.flatten(); }), ShapeError);
  auto flat =
      td.apply([](const at::Tensor& t) { return t.flatten(0, 1); }, std::vector<int64_t>{8});
  EXPECT_EQ(flat.batch_size(), std::vector<int64_t>{8});

  auto c = td.clone();
  c.get("obs").add_(1);
  EXPECT_FALSE(at::equal(c.get("obs"), td.get("obs")));
}

TEST(Ops, StackAndCat) {
  auto a = sample_dict(), b = sample_dict();
  auto s = TensorDict::stack({a, b});
  EXPECT_EQ(s.batch_size(), (std::vector<int64_t>{2, 4, 2}));
  EXPECT_TRUE(at::equal(s.get("next/obs")[1], b.get("next/obs")));
  auto c = TensorDict::cat({a, b}, 1);
  EXPECT_EQ(c.batch_size(), (std::vector<int64_t>{4, 4}));
  b.erase("done");
  EXPECT_THROW(TensorDict::stack({a, b}), KeyError);
}

// The error `fn` throws as type E, or "" when it throws nothing.
template <class E, class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

TEST(Ops, StackAndCatCheckKeysAndSizesWhateverTheOrder) {
  auto a = sample_dict(), b = sample_dict();
  b.erase("done");
  TensorDict empty({4, 2});
  for (const auto& pair :
       std::vector<std::vector<TensorDict>>{{a, b}, {b, a}, {empty, a}, {a, empty}}) {
    EXPECT_NE(error_of<KeyError>([&] { TensorDict::stack(pair); }), "");
    EXPECT_NE(error_of<KeyError>([&] { TensorDict::cat(pair); }), "");
  }
  EXPECT_NE(error_of<KeyError>([&] {
              TensorDict::stack({a, b});
            }).find("'done'"),
            std::string::npos);
  // Batch sizes are checked even with no keys.
  std::string why = error_of<ShapeError>([] {
    TensorDict::stack({TensorDict({2}), TensorDict({3})});
  });
  EXPECT_NE(why.find("[3]"), std::string::npos) << why;
  EXPECT_NE(why.find("[2]"), std::string::npos) << why;
  EXPECT_EQ(TensorDict::cat({TensorDict({2}), TensorDict({3})}).batch_size(),
            std::vector<int64_t>{5});
  EXPECT_NE(error_of<ShapeError>([] {
              TensorDict::cat({TensorDict({2, 1}), TensorDict({3, 2})});
            }),
            "");
  // A key whose trailing dims differ: a tdstore ShapeError naming it, never a libtorch error.
  TensorDict x({2}), y({2});
  x.set("img", at::zeros({2, 3}));
  y.set("img", at::zeros({2, 4}));
  why = error_of<ShapeError>([&] { TensorDict::stack({x, y}); });
  EXPECT_NE(why.find("'img'"), std::string::npos) << why;
  EXPECT_NE(why.find("[2, 4]"), std::string::npos) << why;
  EXPECT_NE(error_of<ShapeError>([&] {
              TensorDict::cat({x, y});
            }).find("'img'"),
            std::string::npos);
}

TEST(Ops, RaggedKeysStayRagged) {
  TempDir t;
  auto store = TensorDict::create(t / "s", {3});
  store.set_ragged("tok", std::vector<at::Tensor>{at::arange(2), at::arange(3), at::arange(1)});
  store.set("n/x", at::ones({3}));
  store.commit();
  for (const TensorDict& copy : {store.clone(), store.select({"tok"}), store.exclude({"n"})}) {
    ASSERT_TRUE(copy.is_ragged("tok"));
    EXPECT_TRUE(at::equal(copy.get_ragged("tok").offsets, store.get_ragged("tok").offsets));
    EXPECT_TRUE(at::equal(copy.get_ragged("tok").values, store.get_ragged("tok").values));
  }
  TensorDict updated({3});
  updated.update(store);
  EXPECT_TRUE(updated.is_ragged("tok"));
  auto joined = TensorDict::cat({store.clone(), store.clone()});
  ASSERT_TRUE(joined.is_ragged("tok"));
  EXPECT_TRUE(at::equal(joined.get_ragged("tok").offsets,
                        at::tensor(std::vector<int64_t>{0, 2, 5, 6, 8, 11, 12})));
  EXPECT_NE(error_of<ShapeError>([&] { TensorDict::stack({store.clone(), store.clone()}); }), "");
}

TEST(Ops, SelectOfAPrefixWithTrailingSlash) {
  auto td = sample_dict();
  EXPECT_EQ(td.select({"next/"}).keys(), (std::vector<std::string>{"next/obs", "next/reward"}));
  EXPECT_EQ(td.exclude({"next/"}).keys(), (std::vector<std::string>{"done", "obs"}));
  EXPECT_THROW(td.select({"nope/"}), KeyError);
  EXPECT_THROW(td.select({"/"}), KeyError);
}

TEST(Ops, ALeafAndAPrefixNeverShareAName) {
  TempDir t;
  auto store = TensorDict::create(t / "s", {2});
  store.set("a/b", at::ones({2}));
  std::string why = error_of<KeyError>([&] { store.set("a", at::ones({2})); });
  EXPECT_NE(why.find("'a'"), std::string::npos) << why;
  store.set("c", at::ones({2}));
  EXPECT_THROW(store.set("c/d", at::ones({2})), KeyError);
  TensorDict mem({2});
  mem.set("a/b", at::ones({2}));
  EXPECT_THROW(mem.set("a", at::ones({2})), KeyError);
  EXPECT_THROW(mem.set_ragged("a", std::vector<at::Tensor>{at::ones({1}), at::ones({2})}),
               KeyError);
  store.commit();
  EXPECT_EQ(TensorDict::open(t / "s").keys(), (std::vector<std::string>{"a/b", "c"}));
}

TEST(Ops, PrintoutListsKeysWithShapeAndDtype) {
  auto s = sample_dict().to_string();
  EXPECT_NE(s.find("TensorDict(batch_size=[4, 2], keys=4)"), std::string::npos) << s;
  EXPECT_NE(s.find("\n  next/\n    obs: float32 [4, 2, 3]"), std::string::npos) << s;
  EXPECT_NE(s.find("\n  done: bool [4, 2]"), std::string::npos) << s;
}

// A missing key's KeyError names what is there: the closest keys by spelling (a few edits
// apart, or the same last component under another prefix), and every key of a small dict.
TEST(Ops, AMissingKeyNamesTheClosestKeysAndWhatIsThere) {
  TempDir t;
  auto store = TensorDict::create(t / "s", {2});
  for (const char* k : {"images", "labels", "obs/x", "feature"}) store.set(k, at::ones({2}));
  store.commit();
  TensorDict mem({2});
  mem.set("images", at::ones({2}));
  for (const TensorDict* td : {&store, &mem}) {
    try {
      td->get("imgaes");
      ADD_FAILURE() << "no KeyError";
    } catch (const KeyError& e) {
      EXPECT_NE(std::string(e.what()).find("key 'imgaes' not found; did you mean 'images'?"),
                std::string::npos)
          << e.what();
    }
  }
  auto message = [&](const char* key) {
    try {
      store.get(key);
    } catch (const KeyError& e) {
      return std::string(e.what());
    }
    return std::string("no KeyError");
  };
  EXPECT_NE(message("x").find("did you mean 'obs/x'?"), std::string::npos) << message("x");
  EXPECT_NE(message("zzzzzzzz").find("not found (keys: 'feature', 'images', 'labels', 'obs/x')"),
            std::string::npos)
      << message("zzzzzzzz");
  auto big = TensorDict::create(t / "big", {1});
  for (int k = 0; k < 20; ++k) big.set("key" + std::to_string(k), at::ones({1}));
  try {
    big.get("kye7");
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'key7'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(20 keys)"), std::string::npos) << e.what();
  }
  TensorDict empty({1});
  EXPECT_THROW(
      try { empty.get("a"); } catch (const KeyError& e) {
        EXPECT_NE(std::string(e.what()).find("(the dict holds no keys)"), std::string::npos);
        throw;
      },
      KeyError);
}

// The contract in tensordict.h: const member functions may be called concurrently, on a
// writer that no thread modifies and on a reader.
TEST(Persistent, ConstCallsFromFourThreads) {
  TempDir t;
  auto w = TensorDict::create(t / "s", {4});
  for (int k = 0; k < 20; ++k)
    w.set("k" + std::to_string(k), at::full({4, 8}, static_cast<float>(k)));
  w.set_attr("source", "test");
  w.get_or_compute(
      "twice", {"k1"}, [](const TensorDict& d) { return d.get("k1") * 2; }, "v1");
  w.commit();
  auto r = TensorDict::open(t / "s");
  for (TensorDict* td : {&w, &r}) {
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i)
      threads.emplace_back([&, i] {
        for (int n = 0; n < 10000; ++n) {
          const int k = (n + i) % 20;
          if (td->get("k" + std::to_string(k))[0][0].item<float>() != static_cast<float>(k))
            ++wrong;
          if (td->attr("source") != "test") ++wrong;
          if (!td->contains("twice") || td->contains("absent")) ++wrong;
          if (n % 8 == 0 && !td->lazy_info("twice")) ++wrong;
          if (n % 8 == 0 && td->keys().size() != 21) ++wrong;
        }
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0) << (td == &w ? "writer" : "reader");
  }
}

}  // namespace
}  // namespace tdstore
