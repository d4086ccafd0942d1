// The append rules every appender follows (storage/append_plan.h), without a store.
#include "storage/append_plan.h"

#include <gtest/gtest.h>

#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

using Specs = std::map<std::string, ColumnSpec>;

const Specs kHeld = {{"x", {DType::Float32, {10, 3}, false}},
                     {"tokens", {DType::Int64, {25, 2}, true}},
                     {"norm", {DType::Float32, {10}, false}}};

Specs rows_of(int64_t n) {
  return {{"x", {DType::Float32, {n, 3}, false}}, {"tokens", {DType::Int64, {7, 2}, true}}};
}

// The message of the error plan_append throws for `rows`, or "" when it plans.
template <class E>
std::string refusal(const Specs& rows, std::vector<int64_t> rows_batch = {4}) {
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
  Specs with_norm = rows_of(4);
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
  Specs missing = rows_of(4);
  missing.erase("x");
  EXPECT_EQ(refusal<KeyError>(missing), "/s: appended rows must hold the same keys: missing 'x'");
  Specs extra = rows_of(4);
  extra["y"] = {DType::Float32, {4}, false};
  EXPECT_EQ(refusal<KeyError>(extra), "/s: appended rows must hold the same keys: unexpected 'y'");
  Specs dense_tokens = rows_of(4);
  dense_tokens["tokens"].ragged = false;
  EXPECT_EQ(refusal<ShapeError>(dense_tokens), "/s: key 'tokens' is ragged on one side only");
  Specs ints = rows_of(4);
  ints["x"].dtype = DType::Int32;
  EXPECT_EQ(refusal<DTypeError>(ints), "/s: key 'x': appending int32 rows to float32");
  Specs wide = rows_of(4);
  wide["x"].shape = {4, 4};
  EXPECT_EQ(refusal<ShapeError>(wide),
            "/s: key 'x': rows of shape [4, 4] do not extend shape [10, 3]");
  Specs flat = rows_of(4);
  flat["tokens"].shape = {7};
  EXPECT_EQ(refusal<ShapeError>(flat),
            "/s: key 'tokens': ragged values of shape [7] do not extend shape [25, 2]");
  EXPECT_EQ(refusal<Error>(rows_of(4)), "");
}

}  // namespace
}  // namespace tdstore::storage
