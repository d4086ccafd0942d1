// The append rules every appender follows (storage/append_plan.h), without a store; then
// apply_append on a store, planned as import_rows plans it (from the store's own state).
#include "storage/append_plan.h"

#include <gtest/gtest.h>

#include "storage/store.h"
#include "tdstore/errors.h"
#include "tests/temp_dir.h"

namespace tdstore::storage {
namespace {

using ColumnSpecs = std::map<std::string, ColumnSpec>;

const ColumnSpecs kHeld = {{"x", {DType::Float32, {10, 3}, false}},
                           {"tokens", {DType::Int64, {25, 2}, true}},
                           {"norm", {DType::Float32, {10}, false}}};

ColumnSpecs rows_of(int64_t n) {
  return {{"x", {DType::Float32, {n, 3}, false}}, {"tokens", {DType::Int64, {7, 2}, true}}};
}

// The message of the error plan_append throws for `rows`, or "" when it plans.
template <class E>
std::string refusal(const ColumnSpecs& rows, std::vector<int64_t> rows_batch = {4}) {
  try {
    plan_append("/s", {10}, kHeld, {"norm"}, rows_batch, rows);
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

TEST(AppendPlan, GrowsDimZeroAndDropsTheDerivedKeysTheRowsDoNotBring) {
  auto plan = plan_append("/s", {10}, kHeld, {"norm"}, {4}, rows_of(4));
  EXPECT_FALSE(plan.creating);
  EXPECT_EQ(plan.grown, std::vector<int64_t>{14});
  EXPECT_EQ(plan.stale, std::vector<std::string>{"norm"});
  // Rows that bring the derived key extend it like any other.
  ColumnSpecs with_norm = rows_of(4);
  with_norm["norm"] = {DType::Float32, {4}, false};
  EXPECT_TRUE(plan_append("/s", {10}, kHeld, {"norm"}, {4}, with_norm).stale.empty());
}

TEST(AppendPlan, AnEmptyDictBecomesTheRows) {
  auto plan = plan_append("/s", {0, 5}, {}, {}, {4, 5}, rows_of(4));
  EXPECT_TRUE(plan.creating);
  EXPECT_EQ(plan.grown, (std::vector<int64_t>{4, 5}));
  // Keys with no rows are not an empty dict: their keys must come again.
  EXPECT_THROW(plan_append("/s", {0}, {{"x", {DType::Float32, {0, 3}, false}}}, {}, {4}, {}),
               KeyError);
}

TEST(AppendPlan, EachRuleRefusesByName) {
  EXPECT_NE(refusal<ShapeError>(rows_of(4), {4, 1})
                .find("/s: cannot append rows of batch size "
                      "[4, 1] to batch size [10]"),
            std::string::npos);
  ColumnSpecs missing = rows_of(4);
  missing.erase("x");
  EXPECT_EQ(refusal<KeyError>(missing), "/s: appended rows must hold the same keys: missing 'x'");
  ColumnSpecs extra = rows_of(4);
  extra["y"] = {DType::Float32, {4}, false};
  EXPECT_EQ(refusal<KeyError>(extra), "/s: appended rows must hold the same keys: unexpected 'y'");
  ColumnSpecs dense_tokens = rows_of(4);
  dense_tokens["tokens"].ragged = false;
  EXPECT_EQ(refusal<ShapeError>(dense_tokens), "/s: key 'tokens' is ragged on one side only");
  ColumnSpecs ints = rows_of(4);
  ints["x"].dtype = DType::Int32;
  EXPECT_EQ(refusal<DTypeError>(ints), "/s: key 'x': appending int32 rows to float32");
  ColumnSpecs wide = rows_of(4);
  wide["x"].shape = {4, 4};
  EXPECT_EQ(refusal<ShapeError>(wide),
            "/s: key 'x': rows of shape [4, 4] do not extend shape [10, 3]");
  ColumnSpecs flat = rows_of(4);
  flat["tokens"].shape = {7};
  EXPECT_EQ(refusal<ShapeError>(flat),
            "/s: key 'tokens': ragged values of shape [7] do not extend shape [25, 2]");
  EXPECT_EQ(refusal<Error>(rows_of(4)), "");
}

}  // namespace

namespace append_plan_test {

// Plans `n` rows of float key "x" from what the store reads (its batch size, its keys), as
// storage::import_rows does, and applies them with room for 64 rows.
void append_planned_from_store(Store& s, const float* rows, int64_t n) {
  std::map<std::string, ColumnSpec> current;
  if (auto e = s.find("x")) current["x"] = {e->dtype, e->shape, false};
  const auto plan =
      plan_append("/s", s.batch_size(), current, {}, {n}, {{"x", {DType::Float32, {n}, false}}});
  apply_append(s, plan,
               {{"x", DType::Float32, {n}, rows, static_cast<uint64_t>(n) * 4, 64 * 4, 0}});
}

// Several appends in one transaction, each planned from the store: the writer reads its staged
// batch size (as it reads its staged keys), so the commit keeps keys and batch size in step.
// The committed one was read before: the second plan grew [0] to [2] again while "x" had 4 rows.
TEST(ApplyAppend, AppendsStagedTogetherEachSeeTheBatchSizeTheOthersStaged) {
  testing::TempDir t;
  const std::vector<float> v = {0, 1, 2, 3, 4, 5};
  {
    auto s = Store::create(t / "s", {0}, {});
    append_planned_from_store(*s, v.data(), 2);  // creates "x", room for 64 rows
    EXPECT_EQ(s->batch_size(), std::vector<int64_t>{2});
    append_planned_from_store(*s, v.data() + 2, 2);
    append_planned_from_store(*s, v.data() + 4, 2);
    EXPECT_EQ(s->batch_size(), std::vector<int64_t>{6});
    s->commit();
    append_planned_from_store(*s, v.data(), 1);
    s->rollback();
    EXPECT_EQ(s->batch_size(), std::vector<int64_t>{6});  // the staged one is gone
  }
  auto r = Store::open(t / "s", OpenMode::ReadOnly, {});
  EXPECT_EQ(r->batch_size(), std::vector<int64_t>{6});
  const auto e = r->find("x");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->shape, std::vector<int64_t>{6});
  const auto* p = static_cast<const float*>(r->view(*e).data);
  EXPECT_EQ(std::vector<float>(p, p + 6), v);
}

// A plan made from another batch size than the store's would commit keys whose dim 0 is not the
// batch size: refused by name before anything is staged.
TEST(ApplyAppend, APlanFromAnotherBatchSizeIsRefusedAndStagesNothing) {
  testing::TempDir t;
  const std::vector<float> v = {0, 1, 2, 3};
  auto s = Store::create(t / "s", {0}, {});
  append_planned_from_store(*s, v.data(), 2);
  s->commit();
  std::map<std::string, ColumnSpec> current = {{"x", {DType::Float32, {2}, false}}};
  const auto stale =
      plan_append("/s", {0}, current, {}, {2}, {{"x", {DType::Float32, {2}, false}}});
  try {
    apply_append(*s, stale, {{"x", DType::Float32, {2}, v.data() + 2, 8, 0, 0}});
    FAIL() << "applied";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(s->has_staged_changes());
  EXPECT_EQ(s->find("x")->shape, std::vector<int64_t>{2});
}

}  // namespace append_plan_test
}  // namespace tdstore::storage
