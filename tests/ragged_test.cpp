// Ragged keys: values plus offsets, padded in batches, appended, persisted.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include "storage/store.h"
#include "tdstore/tdstore.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

using testing::TempDir;

// Row i: i + 1 tokens, each [2] = {i, position}.
std::vector<at::Tensor> token_rows(int64_t start, int64_t n) {
  std::vector<at::Tensor> rows;
  for (int64_t i = start; i < start + n; ++i) {
    at::Tensor r = at::zeros({i % 4 + 1, 2}, at::kLong);
    r.select(1, 0).fill_(i);
    r.select(1, 1).copy_(at::arange(i % 4 + 1, at::kLong));
    rows.push_back(r);
  }
  return rows;
}

TEST(Ragged, StoredAsValuesAndOffsetsAndPaddedOnGet) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "s", {5});
    td.set("label", at::arange(5, at::kLong));
    td.set_ragged("tokens", token_rows(0, 5));
    td.commit();
  }
  auto td = TensorDict::open(t / "s");
  EXPECT_EQ(td.keys(), (std::vector<std::string>{"label", "tokens"}));
  EXPECT_EQ(td.size(), 2);
  EXPECT_TRUE(td.is_ragged("tokens"));
  EXPECT_FALSE(td.is_ragged("label"));
  auto r = td.get_ragged("tokens");
  EXPECT_TRUE(at::equal(r.offsets, at::tensor({0, 1, 3, 6, 10, 11}, at::kLong)));
  EXPECT_EQ(r.values.sizes(), (std::vector<int64_t>{11, 2}));
  at::Tensor padded = td.get("tokens");
  EXPECT_EQ(padded.sizes(), (std::vector<int64_t>{5, 4, 2}));
  EXPECT_TRUE(at::equal(padded[2].slice(0, 0, 3), token_rows(2, 1)[0]));
  EXPECT_EQ(padded[0][1].abs().sum().item<int64_t>(), 0) << "zero padding";
  EXPECT_TRUE(td.verify().empty());
  EXPECT_THROW(td.get_ragged("label"), KeyError);
}

TEST(Ragged, BadOffsetsAreRejected) {
  TensorDict td({3});
  at::Tensor v = at::zeros({4});
  EXPECT_THROW(td.set_ragged("x", v, at::tensor({0, 1, 4}, at::kLong)), ShapeError);  // rows + 1
  EXPECT_THROW(td.set_ragged("x", v, at::tensor({0, 3, 1, 4}, at::kLong)),
               ShapeError);  // decreasing
  EXPECT_THROW(td.set_ragged("x", v, at::tensor({0, 1, 2, 3}, at::kLong)),
               ShapeError);  // != values rows
  EXPECT_THROW(TensorDict({2, 2}).set_ragged("x", v, at::tensor({0, 4, 4}, at::kLong)), ShapeError);
  td.set_ragged("x", v, at::tensor({0, 1, 1, 4}, at::kLong));
  td.set("x", at::ones({3}));  // a dense value replaces it
  EXPECT_FALSE(td.is_ragged("x"));
}

TEST(Ragged, ADenseValueReplacesAStoredRaggedKeyAndItsOffsets) {
  TempDir t;
  for (bool same_commit : {false, true}) {
    std::filesystem::path dir = t / (same_commit ? "same" : "later");
    {
      auto td = TensorDict::create(dir, {3});
      td.set_ragged("x", at::zeros({4}), at::tensor({0, 1, 1, 4}, at::kLong));
      if (!same_commit) td.commit();
      td.set("x", at::ones({3}));
      EXPECT_FALSE(td.is_ragged("x"));
      td.commit();
    }
    auto td = TensorDict::open(dir, OpenMode::ReadOnly);
    EXPECT_FALSE(td.is_ragged("x")) << (same_commit ? "same commit" : "later commit");
    EXPECT_TRUE(at::equal(td.get("x"), at::ones({3})));
    EXPECT_FALSE(
        storage::Store::open(dir, OpenMode::ReadOnly, {})->find(storage::ragged_offsets_key("x")))
        << "the offsets key is erased";
    EXPECT_TRUE(td.verify().empty());
  }
}

TEST(Ragged, AppendAndLoaderBatches) {
  TempDir t;
  auto td = TensorDict::create(t / "s", {0});
  for (int64_t start = 0; start < 40; start += 10) {
    TensorDict rows({10});
    rows.set("id", at::arange(start, start + 10, at::kLong));
    rows.set_ragged("tokens", token_rows(start, 10));
    td.append(rows);
    td.commit();
  }
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.batch_size(), std::vector<int64_t>{40});
  EXPECT_EQ(r.get_ragged("tokens").offsets.size(0), 41);
  LoaderOptions o;
  o.batch_size = 8;
  o.seed = 3;
  Loader loader(r, o);
  int64_t rows = 0;
  for (TensorDict batch : loader) {
    at::Tensor ids = batch.get("id"), tok = batch.get("tokens"), len = batch.get("tokens.lengths");
    for (int64_t i = 0; i < ids.size(0); ++i) {
      int64_t id = ids[i].item<int64_t>();
      ASSERT_EQ(len[i].item<int64_t>(), id % 4 + 1);
      EXPECT_TRUE(at::equal(tok[i].slice(0, 0, id % 4 + 1), token_rows(id, 1)[0])) << id;
    }
    rows += ids.size(0);
  }
  EXPECT_EQ(rows, 40);
  TensorDict mem({0});
  TensorDict part({3});
  part.set_ragged("tokens", token_rows(0, 3));
  mem.append(part);
  mem.append(part);
  EXPECT_TRUE(
      at::equal(mem.get_ragged("tokens").offsets, at::tensor({0, 1, 3, 6, 7, 9, 12}, at::kLong)));
}

// Ragged rows whose values have another row shape, or another dtype, are refused by name in
// memory and in a store alike, and the dict keeps every row it had.
TEST(Ragged, AppendedValuesMustExtendTheValuesShapeAndDtype) {
  TempDir t;
  TensorDict part({3});
  part.set_ragged("tokens", token_rows(0, 3));
  TensorDict wide({1});
  wide.set_ragged("tokens", std::vector<at::Tensor>{at::zeros({2, 3}, at::kLong)});
  TensorDict floats({1});
  floats.set_ragged("tokens", std::vector<at::Tensor>{at::zeros({2, 2})});
  TensorDict mem({0});
  auto stored = TensorDict::create(t / "s", {0});
  for (TensorDict* td : {&mem, &stored}) {
    td->append(part);
    try {
      td->append(wide);
      ADD_FAILURE() << "appended values of row shape [3] to [2]";
    } catch (const ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("key 'tokens': ragged values of shape [2, 3] do not "
                                           "extend shape [6, 2]"),
                std::string::npos)
          << e.what();
    }
    try {
      td->append(floats);
      ADD_FAILURE() << "appended float32 values to int64 ones";
    } catch (const DTypeError& e) {
      EXPECT_NE(std::string(e.what()).find("key 'tokens': appending ragged float32 rows to int64"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(td->batch_size(), std::vector<int64_t>{3});
    EXPECT_TRUE(at::equal(td->get_ragged("tokens").offsets, at::tensor({0, 1, 3, 6}, at::kLong)));
  }
}

// A ragged key's offsets live under "<key>\0offsets", 8 bytes longer: the key rule is checked
// for both, so a key of 297..304 bytes is refused whole instead of stored unreadable.
TEST(Ragged, KeysTooLongForTheirOffsetsAreRefusedAndLoseNothing) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "s", {5});
    td.set("label", at::arange(5, at::kLong));
    td.commit();
    const std::string fits(296, 'a'), too_long(297, 'b');
    td.set_ragged(fits, token_rows(0, 5));
    try {
      td.set_ragged(too_long, token_rows(0, 5));
      ADD_FAILURE() << "a 297-byte ragged key was accepted";
    } catch (const KeyError& e) {
      EXPECT_NE(std::string(e.what()).find("at most 296"), std::string::npos) << e.what();
    }
    td.set(too_long, at::zeros({5}));  // as a dense key it fits
    td.commit();
  }
  auto td = TensorDict::open(t / "s");
  EXPECT_TRUE(td.is_ragged(std::string(296, 'a')));
  EXPECT_TRUE(at::equal(td.get_ragged(std::string(296, 'a')).offsets,
                        at::tensor({0, 1, 3, 6, 10, 11}, at::kLong)));
  EXPECT_FALSE(td.is_ragged(std::string(297, 'b')));
  EXPECT_EQ(td.size(), 3);
  EXPECT_TRUE(td.verify().empty());
}

// Rows i of a ragged key as lists of its values' first column.
std::vector<std::vector<int64_t>> ragged_rows(const TensorDict& td, const std::string& key) {
  auto r = td.get_ragged(key);
  std::vector<std::vector<int64_t>> out;
  for (int64_t i = 0; i + 1 < r.offsets.numel(); ++i) {
    at::Tensor row =
        r.values.slice(0, r.offsets[i].item<int64_t>(), r.offsets[i + 1].item<int64_t>());
    std::vector<int64_t> ids;
    for (int64_t j = 0; j < row.size(0); ++j)
      ids.push_back(row[j][1].item<int64_t>() + 10 * row[j][0].item<int64_t>());
    out.push_back(ids);
  }
  return out;
}

// td[0:3], td[index], td[mask] of a ragged key were dense, zero-padded to the longest row: the
// rows' lengths were gone (issue 45). They stay ragged; td[i] is row i itself.
TEST(Ragged, RowSelectionsKeepTheRowsTrueLengths) {
  TempDir t;
  auto stored = TensorDict::create(t / "s", {6});
  stored.set("label", at::arange(6, at::kLong));
  stored.set_ragged("tokens", token_rows(0, 6));  // lengths 1 2 3 4 1 2
  stored.commit();
  for (const TensorDict& td : {stored, stored.clone()}) {
    const auto all = ragged_rows(td, "tokens");
    auto pick = [&](std::vector<int64_t> rows) {
      std::vector<std::vector<int64_t>> out;
      for (int64_t r : rows) out.push_back(all[static_cast<size_t>(r)]);
      return out;
    };
    TensorDict s = td.slice(1, 4);
    ASSERT_TRUE(s.is_ragged("tokens"));
    EXPECT_EQ(ragged_rows(s, "tokens"), pick({1, 2, 3}));
    EXPECT_EQ(ragged_rows(td.slice(0, 6, 2), "tokens"), pick({0, 2, 4}));
    EXPECT_EQ(ragged_rows(td.index(at::tensor({5, 0, -3}, at::kLong)), "tokens"), pick({5, 0, 3}));
    EXPECT_EQ(
        ragged_rows(td.index(at::tensor({1, 0, 0, 1, 1, 0}, at::kLong).to(at::kBool)), "tokens"),
        pick({0, 3, 4}));
    EXPECT_EQ(ragged_rows(td.index(at::zeros({0}, at::kLong)), "tokens").size(), 0u);
    EXPECT_TRUE(at::equal(td.index(at::tensor({2, 1}, at::kLong)).get("label"),
                          at::tensor({2, 1}, at::kLong)));
    for (int64_t i = 0; i < 6; ++i) {
      TensorDict row = td.index(i);
      EXPECT_TRUE(at::equal(row.get("tokens"), token_rows(i, 1)[0])) << "row " << i;
      EXPECT_FALSE(row.is_ragged("tokens"));
    }
    EXPECT_THROW(td.index(at::tensor({0, 1}, at::kLong).reshape({1, 2})), ShapeError);
  }
}

// A set_ragged refused for the arena's reservation retired what its values took; a commit()
// with nothing else staged returned early and never released it, so a smaller retry still
// failed "arena full" (issue 45). The commit hands the space back.
TEST(Ragged, SpaceOfARefusedSetRaggedIsReleasedByTheNextCommit) {
  TempDir t;
  StoreOptions o;
  o.arena_reserve = 1 << 20;
  auto td = TensorDict::create(t / "s", {20'000}, o);
  td.set("label", at::zeros({20'000}, at::kByte));
  td.commit();
  // values that fit beside what is there, offsets (160 KB) that then do not
  at::Tensor big = at::zeros({900'000}, at::kByte);
  at::Tensor offsets = at::zeros({20'001}, at::kLong);
  offsets[20'000] = 900'000;
  EXPECT_THROW(td.set_ragged("r", big, offsets), CapacityError);
  const uint64_t generation = td.generation();
  td.commit();  // nothing staged: hands back the refused values' space
  at::Tensor smaller = at::zeros({500'000}, at::kByte);
  offsets[20'000] = 500'000;
  td.set_ragged("r", smaller, offsets);  // 500 KB + 160 KB fit once the 900 KB are back
  td.commit();
  EXPECT_GT(td.generation(), generation);
  auto r = TensorDict::open(t / "s");
  EXPECT_EQ(r.get_ragged("r").values.numel(), 500'000);
  EXPECT_TRUE(r.verify().empty());
}

// Compaction carries every record field through: ragged flags, the spare capacity of appended
// keys, lazy properties (their fingerprints cover the flags), and can grow the key directory.
TEST(Compaction, CarriesRaggedKeysCapacityAndLazyPropertiesAndGrowsTheDirectory) {
  TempDir t;
  StoreOptions o;
  o.key_capacity = 4;
  int computed = 0;
  auto norm = [&](const TensorDict& d) {
    ++computed;
    return d.get("x") * 2;
  };
  {
    auto td = TensorDict::create(t / "s", {5}, o);
    td.set("x", at::arange(5, at::kFloat));
    td.set_ragged("tokens", token_rows(0, 5));
    td.commit();
    TensorDict more({3});
    more.set("x", at::arange(3, at::kFloat));
    more.set_ragged("tokens", token_rows(5, 3));
    td.reserve(1000);
    td.append(more);
    td.get_or_compute("x2", {"x"}, norm, "v1");
    td.commit();
    EXPECT_THROW(td.set("one_too_many", at::zeros({8})), CapacityError);
  }
  ASSERT_EQ(computed, 1);
  auto before = TensorDict::open(t / "s");
  at::Tensor tokens = before.get("tokens").clone();
  CompactResult r = compact(t / "s", {.key_capacity = 64, .progress = {}, .compression = {}});
  EXPECT_EQ(r.keys, 4);  // x, x2, the values and the offsets of tokens
  auto td = TensorDict::open(t / "s", OpenMode::ReadWrite);
  EXPECT_TRUE(td.is_ragged("tokens"));
  EXPECT_TRUE(at::equal(td.get("tokens"), tokens));
  EXPECT_TRUE(td.verify().empty());
  td.get_or_compute("x2", {"x"}, norm, "v1");  // still valid: no recomputation
  EXPECT_EQ(computed, 1);
  // The spare capacity survived: appending rows moves nothing.
  auto x_before = storage::Store::open(t / "s", OpenMode::ReadOnly, {})->find("x");
  ASSERT_TRUE(x_before);
  EXPECT_GE(x_before->capacity, 1000u * 4);
  for (int k = 0; k < 20; ++k)
    td.set("k" + std::to_string(k), at::zeros({8}));  // the directory grew
  td.commit();
  EXPECT_THROW(compact(t / "s", {.key_capacity = 3, .progress = {}, .compression = {}}),
               LockError);  // td holds the writer lock
}

}  // namespace
}  // namespace tdstore
