// Compressed keys through TensorDict (tdstore/tensordict.h: set with a Compression, the handle's
// default recorded in the store, get, append, ragged values, the Loader) and the CLI's
// import/compact --compress.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include "storage/compressed.h"
#include "storage/store.h"
#include "tdstore/tdstore.h"
#include "tests/compile_options.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace compressed_dict_test {

using testing::TempDir;

// Every stored dtype, as a tensor of `rows` rows that compresses somewhat.
std::vector<std::pair<std::string, at::Tensor>> every_dtype(int64_t rows) {
  at::Tensor base = at::arange(rows * 6).reshape({rows, 6}).remainder(7);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto t : {at::kBool, at::kByte, at::kChar, at::kShort, at::kInt, at::kLong, at::kHalf,
                 at::kBFloat16, at::kFloat, at::kDouble, at::kComplexFloat, at::kComplexDouble})
    out.emplace_back(std::string("k_") + c10::toString(t), base.to(t));
  return out;
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && at::equal(a, b);
}

bool compressed(const TensorDict& td, const std::string& key) {
  auto store = storage::Store::open(td.path(), OpenMode::ReadOnly, {});
  auto e = store->find(key);
  return e && e->compressed();
}

TEST(CompressedDict, EveryDtypeRoundTripsAndGetReturnsANewTensor) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {500});
  const auto c = Compression::zstd(3, 4096);
  for (const auto& [k, v] : every_dtype(500)) td.set(k, v, c);
  td.set("scalar_free", at::zeros({500, 0}), c);  // rows without bytes
  td.commit();
  auto r = TensorDict::open(t / "s");
  for (const auto& [k, v] : every_dtype(500)) {
    SCOPED_TRACE(k);
    EXPECT_TRUE(compressed(r, k));
    EXPECT_TRUE(same(r.get(k), v));
  }
  EXPECT_TRUE(same(r.get("scalar_free"), at::zeros({500, 0})));
  // Not a view: writing into what get() returned changes neither the store nor the next get().
  at::Tensor a = r.get("k_Float");
  a.fill_(42);
  EXPECT_TRUE(same(r.get("k_Float"), every_dtype(500)[8].second));
  EXPECT_TRUE(r.verify().empty());
}

TEST(CompressedDict, TheDefaultIsRecordedAndAppliesToSetAppendAndRaggedValues) {
  TempDir t;
  StoreOptions o;
  o.compression = Compression::zstd(5, 8192);
  {
    auto td = TensorDict::create(t / "s", {0}, o);
    TensorDict rows({300});
    rows.set("x", at::randn({300, 4}));
    td.append(rows);  // the first append creates the keys, under the default
    td.commit();
  }
  auto td = TensorDict::open(t / "s", OpenMode::ReadWrite);
  EXPECT_EQ(td.compression(), Compression::zstd(5, 8192));
  EXPECT_TRUE(compressed(td, "x"));
  at::Tensor before = td.get("x");
  TensorDict more({200});
  more.set("x", at::randn({200, 4}));
  td.append(more);
  td.set("y", at::randint(0, 5, {500}));
  std::vector<at::Tensor> ragged;
  for (int64_t i = 0; i < 500; ++i) ragged.push_back(at::arange(i % 4));
  td.set_ragged("r", ragged);
  td.set("raw", at::arange(500), Compression::none());  // a key's own beats the default
  td.commit();
  EXPECT_TRUE(same(td.get("x"), at::cat({before, more.get("x")})));
  EXPECT_TRUE(compressed(td, "x") && compressed(td, "y") && compressed(td, "r"));
  EXPECT_FALSE(compressed(td, "raw"));
  EXPECT_EQ(td.compression_of("x"), Compression::zstd(5, 8192));
  EXPECT_EQ(td.compression_of("r"), Compression::zstd(5, 8192));
  EXPECT_EQ(td.compression_of("raw"), Compression::none());
  EXPECT_THROW(td.compression_of("nope"), KeyError);
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.get("r").sizes(), (std::vector<int64_t>{500, 3}));  // padded to the longest row
  EXPECT_TRUE(same(r.index(7).get("r"), at::arange(3)));
  // Another option on open wins over the recorded one, for this handle only.
  StoreOptions none;
  none.compression = Compression::none();
  EXPECT_EQ(TensorDict::open(t / "s", OpenMode::ReadOnly, none).compression(), Compression::none());
}

TEST(CompressedDict, TheLoaderAndRowReadsGiveWhatARawStoreGives) {
  TempDir t;
  at::Tensor x = at::randn({1000, 3}), y = at::arange(1000);
  for (bool zstd : {false, true}) {
    auto td = TensorDict::create(t / (zstd ? "z" : "r"), {1000});
    const auto c = zstd ? Compression::zstd(3, 4096) : Compression::none();
    td.set("x", x, c);
    td.set("y", y, c);
    td.commit();
  }
  auto raw = TensorDict::open(t / "r"), z = TensorDict::open(t / "z");
  for (auto order : {LoaderOrder::Random, LoaderOrder::Sequential, LoaderOrder::QuasiRandom}) {
    LoaderOptions lo;
    lo.batch_size = 64;
    lo.seed = 3;
    lo.order = order;
    auto batches = [&](const TensorDict& td) {
      Loader l(td, lo);
      l.set_epoch(1);
      std::vector<TensorDict> out;
      for (TensorDict b : l) out.push_back(b);
      return out;
    };
    auto a = batches(raw), b = batches(z);
    ASSERT_EQ(a.size(), 16u);
    ASSERT_EQ(b.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(same(a[i].get("x"), b[i].get("x")));
      EXPECT_TRUE(same(a[i].get("y"), b[i].get("y")));
    }
  }
  at::Tensor idx = at::tensor({5, 999, 0, 500}, at::kLong);
  EXPECT_TRUE(same(z.index(idx).get("x"), raw.index(idx).get("x")));
  EXPECT_TRUE(same(z.index(7).get("y"), raw.index(7).get("y")));
}

// compression_of() is not a read the compile cache models: a compiled function that branches on
// it runs eagerly, and gives what eager code gives for raw and compressed keys alike.
TEST(CompressedDict, ACompiledFunctionReadingCompressionOfRunsEagerly) {
  TempDir t;
  for (bool zstd : {false, true}) {
    auto td = TensorDict::create(t / (zstd ? "z" : "r"), {4});
    td.set("x", at::arange(4, at::kFloat), zstd ? Compression::zstd(1) : Compression::none());
    td.commit();
  }
  auto fn = [](TensorDict& td) {
    return td.compression_of("x").enabled() ? td.get("x") * 2 : td.get("x");
  };
  auto compiled = compile("branch_on_compression", fn, testing::no_persist());
  for (int i = 0; i < 3; ++i)
    for (const char* name : {"r", "z", "r"}) {
      auto td = TensorDict::open(t / name, OpenMode::ReadWrite);
      EXPECT_TRUE(same(compiled(td), fn(td))) << name << " call " << i;
    }
}

TEST(CompressedDict, ABadLevelIsAnArgumentErrorNamingTheStore) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {4});
  try {
    td.set("x", at::zeros({4}), Compression::zstd(0));
    FAIL() << "level 0 was accepted";
  } catch (const ArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("zstd level 0 is not in [1, 19]"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(td.contains("x"));
  StoreOptions o;
  o.compression = Compression::zstd(3, 100);
  EXPECT_THROW(TensorDict::create(t / "bad", {4}, o), ArgumentError);
  o.compression = Compression::zstd();
  o.format_version = 3;  // no compressed keys there: refused at once, not at every set()
  EXPECT_THROW(TensorDict::create(t / "v3", {4}, o), ArgumentError);
}

TEST(CompressedDict, CompactionConvertsBothWaysAndKeepsEveryValue) {
  TempDir t;
  at::Tensor x = at::randint(0, 3, {4000, 8}).to(at::kFloat);
  {
    auto td = TensorDict::create(t / "s", {4000});
    td.set("x", x);
    td.commit();
  }
  const uint64_t raw_bytes = StoreReader::open(t / "s").summary().tensor_bytes;
  CompactOptions to_zstd;
  to_zstd.compression = Compression::zstd();
  compact(t / "s", to_zstd);
  {
    auto r = TensorDict::open(t / "s");
    EXPECT_TRUE(compressed(r, "x"));
    EXPECT_TRUE(same(r.get("x"), x));
    EXPECT_EQ(r.compression(), Compression::zstd());  // recorded as the store's default
    EXPECT_LT(StoreReader::open(t / "s").summary().tensor_bytes * 4, raw_bytes);
  }
  CompactOptions to_raw;
  to_raw.compression = Compression::none();
  compact(t / "s", to_raw);
  auto r = TensorDict::open(t / "s");
  EXPECT_FALSE(compressed(r, "x"));
  EXPECT_TRUE(same(r.get("x"), x));
  EXPECT_EQ(StoreReader::open(t / "s").summary().tensor_bytes, raw_bytes);
}

}  // namespace compressed_dict_test
}  // namespace tdstore
