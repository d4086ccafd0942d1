// tensordict's API in C++: set_rows, split/chunk/unbind, set_batch_size, flatten_keys,
// rename_key, to/device, eq/ne/all/any; in memory and on stores.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include "tdstore/tdstore.h"
#include "tests/compile_options.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace tensordict_api_test {

// `call` throws `type` whose message holds `needle`.
#define EXPECT_ERROR_NAMING(call, type, needle)                                     \
  do {                                                                              \
    try {                                                                           \
      call;                                                                         \
      ADD_FAILURE() << #call " threw nothing";                                      \
    } catch (const type& e) {                                                       \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what(); \
    }                                                                               \
  } while (0)

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
}

TensorDict one_key(const std::string& key, const at::Tensor& value) {
  TensorDict rows;  // no batch dims: the rows broadcast against what the index selects
  rows.set(key, value);
  return rows;
}

}  // namespace tensordict_api_test

using tensordict_api_test::one_key;
using tensordict_api_test::same;

TEST(SetRows, InMemoryWritesTheLeafInPlaceAndCopiesMemoryItDoesNotOwn) {
  at::Tensor own = at::zeros({4, 2});
  std::vector<float> foreign(8, 0.0F);
  TensorDict td({4});
  td.set("own", own);
  td.set("foreign", at::from_blob(foreign.data(), {4, 2}));
  td.set("expanded", at::zeros({1, 2}).expand({4, 2}));
  TensorDict rows;
  rows.set("own", at::scalar_tensor(1.0));
  rows.set("foreign", at::scalar_tensor(2.0));
  rows.set("expanded", at::scalar_tensor(3.0));
  td.set_rows(1, 3, 1, rows);
  EXPECT_EQ(own.sum().item<float>(), 4.0F);  // the leaf itself, rows 1 and 2
  EXPECT_EQ(foreign[2], 0.0F);               // from_blob: never written
  EXPECT_EQ(td.get("foreign").sum().item<float>(), 8.0F);
  EXPECT_EQ(td.get("expanded").sum().item<float>(), 12.0F);
}

TEST(SetRows, OnAStoreEachKeyIsRewrittenStagedAndKeepsItsCompression) {
  testing::TempDir t;
  auto td = TensorDict::create(t / "s", {6});
  td.set("raw", at::arange(6, at::kLong));
  td.set("z", at::arange(12, at::kFloat).reshape({6, 2}), Compression::zstd(2));
  td.commit();
  const at::Tensor before = td.get("raw");
  td.set_rows(at::tensor({0, 5}, at::kLong), one_key("raw", at::tensor({-1, -2}, at::kLong)));
  td.set_rows(at::tensor({1, 0, 1, 0, 0, 0}, at::kLong).to(at::kBool), one_key("z", at::ones({2})));
  EXPECT_TRUE(same(before, at::arange(6, at::kLong)));  // read before: unchanged
  td.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_TRUE(same(r.get("raw"), at::tensor({-1, 1, 2, 3, 4, -2}, at::kLong)));
  EXPECT_EQ(r.get("z").sum().item<float>(), at::arange(12).sum().item<float>() - 0 - 1 - 4 - 5 + 4);
  EXPECT_EQ(r.compression_of("z"), Compression::zstd(2));
  EXPECT_TRUE(r.verify().empty());
  EXPECT_THROW(r.set_rows(0, one_key("raw", at::scalar_tensor(0))), ReadOnlyError);
}

TEST(SetRows, RefusalsNameTheKeyAndWriteNothing) {
  testing::TempDir t;
  auto td = TensorDict::create(t / "s", {3});
  td.set("a", at::zeros({3, 2}));
  td.set_ragged("r", std::vector<at::Tensor>{at::ones({1}), at::ones({2}), at::ones({3})});
  td.commit();
  TensorDict two;
  two.set("a", at::ones({2}));
  two.set("b", at::ones({2}));
  EXPECT_ERROR_NAMING(td.set_rows(0, two), KeyError, "'b'");
  EXPECT_ERROR_NAMING(td.set_rows(0, one_key("a", at::ones({3}))), ShapeError, "'a'");
  EXPECT_ERROR_NAMING(td.set_rows(0, one_key("r", at::ones({1}))), ShapeError, "ragged");
  EXPECT_ERROR_NAMING(td.set_rows(3, one_key("a", at::ones({2}))), IndexError, "3");
  EXPECT_ERROR_NAMING(td.set_rows(at::tensor({0, 7}, at::kLong), one_key("a", at::ones({2}))),
                      IndexError, "7");
  EXPECT_EQ(td.get("a").abs().sum().item<float>(), 0.0F);
}

TEST(SetRows, ACompiledFunctionWritingRowsRunsEagerly) {
  auto fn = [](TensorDict& td) {
    td.set_rows(0, one_key("x", td.get("x").sum()));
    return td.get("x") * 2;
  };
  auto compiled = compile("writes_rows", fn, testing::no_persist());
  TensorDict a({3}), b({3});
  a.set("x", at::arange(3, at::kFloat));
  b.set("x", at::arange(3, at::kFloat));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(same(compiled(a), fn(b))) << "call " << i;
  EXPECT_TRUE(same(a.get("x"), b.get("x")));
}

TEST(Reshaping, SplitChunkUnbindAlongEveryBatchDim) {
  TensorDict td({4, 3});
  td.set("a", at::arange(24, at::kFloat).reshape({4, 3, 2}));
  auto parts = td.split(std::vector<int64_t>{1, 2}, 1);
  ASSERT_EQ(parts.size(), 2U);
  EXPECT_EQ(parts[1].batch_size(), (std::vector<int64_t>{4, 2}));
  EXPECT_TRUE(same(parts[1].get("a"), td.get("a").narrow(1, 1, 2)));
  EXPECT_EQ(td.split(3).size(), 2U);
  EXPECT_EQ(td.chunk(3, -1).size(), 3U);
  EXPECT_EQ(td.chunk(8).size(), 4U);  // as torch.chunk: fewer when the dim is short
  auto rows = td.unbind(1);
  ASSERT_EQ(rows.size(), 3U);
  EXPECT_TRUE(same(rows[2].get("a"), td.get("a").select(1, 2)));
  EXPECT_ERROR_NAMING(td.split(std::vector<int64_t>{1, 1}), ShapeError, "sum");
  EXPECT_ERROR_NAMING(td.unbind(2), IndexError, "dim 2");
  TensorDict ragged({2});
  ragged.set_ragged("r", std::vector<at::Tensor>{at::ones({1}), at::ones({3})});
  EXPECT_EQ(ragged.split(1)[1].get_ragged("r").values.size(0), 3);
}

TEST(Reshaping, BatchSizeRegroupsInMemoryAndIsAStoresRows) {
  TensorDict td({4});
  td.set("a", at::zeros({4, 3, 2}));
  td.set("b/c", at::zeros({4, 3}));
  td.sub("b").set_batch_size({4, 3});  // the whole dict's, checked over every key
  EXPECT_EQ(td.batch_size(), (std::vector<int64_t>{4, 3}));
  EXPECT_ERROR_NAMING(td.set_batch_size({4, 3, 2}), ShapeError, "'b/c'");
  testing::TempDir t;
  auto s = TensorDict::create(t / "s", {4});
  EXPECT_ERROR_NAMING(s.set_batch_size({2, 2}), ArgumentError, "clone");
}

TEST(Reshaping, FlattenAndRenameKeys) {
  TensorDict td({2});
  td.set("a/b", at::zeros({2}));
  td.set("a.b", at::ones({2}));
  EXPECT_ERROR_NAMING(td.flatten_keys(), KeyError, "'a.b'");
  EXPECT_EQ(td.flatten_keys("__").keys(), (std::vector<std::string>{"a.b", "a__b"}));
  EXPECT_ERROR_NAMING(td.unflatten_keys(), KeyError, "'a/b'");
  testing::TempDir t;
  auto s = TensorDict::create(t / "s", {2});
  s.set("x", at::arange(2, at::kFloat), Compression::zstd(4));
  s.commit();
  s.rename_key("x", "y/x");
  EXPECT_ERROR_NAMING(s.rename_key("y/x", "y"), KeyError, "'y'");
  s.commit();
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"y/x"}));
  EXPECT_EQ(r.compression_of("y/x"), Compression::zstd(4));
  EXPECT_TRUE(same(r.get("y/x"), at::arange(2, at::kFloat)));
}

TEST(Comparison, LeafwiseEqualityAllAnyAndConversions) {
  testing::TempDir t;
  auto s = TensorDict::create(t / "s", {3});
  s.set("a", at::arange(3, at::kFloat));
  s.set("b", at::ones({3, 2}, at::kLong));
  s.commit();
  const TensorDict c = s.clone();
  EXPECT_TRUE(s.eq(c).all());
  EXPECT_FALSE(s.ne(c).any());
  EXPECT_FALSE(s.eq(at::scalar_tensor(1)).all());
  EXPECT_TRUE(s.eq(at::scalar_tensor(1)).get("b").all().item<bool>());
  EXPECT_ERROR_NAMING(s.eq(s.exclude({"b"})), KeyError, "'b'");
  EXPECT_ERROR_NAMING(s.eq(at::zeros({2})), ShapeError, "'a'");
  EXPECT_TRUE(TensorDict({3}).all());
  EXPECT_EQ(s.device(), at::Device(at::kCPU));
  EXPECT_EQ(TensorDict({3}).device(), std::nullopt);
  EXPECT_EQ(s.to(at::kHalf).get("b").scalar_type(), at::kHalf);
  EXPECT_TRUE(s.to(at::Device(at::kCPU)).is_persistent());  // already there: the dict itself
}

#undef EXPECT_ERROR_NAMING

}  // namespace tdstore
