// Crash injection through the TensorDict API: a writer process (a fresh exec of this binary)
// sets and commits in a loop and is SIGKILLed at random moments; after every kill the store
// must open and hold exactly the last committed state, by content.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/scalar_tensor.h>
#include <gtest/gtest.h>

#include <random>

#include "tdstore/tdstore.h"
#include "tests/kill_harness.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

constexpr int64_t kRows = 16;

// State n: "step" = n; "obs" [16, 1 + n % 5, 8] of value n; "next/reward" [16] = n + row;
// "odd/flag" only in odd states; attribute "step" = n.
void write_state(TensorDict& td, int64_t n) {
  td.set("step", at::full({kRows}, n, at::kLong));
  td.set("obs", at::full({kRows, 1 + n % 5, 8}, static_cast<double>(n), at::kFloat));
  td.set("next/reward", at::arange(kRows, at::kDouble) + static_cast<double>(n));
  if (n % 2)
    td.set("odd/flag", at::full({kRows}, 1, at::kBool));
  else if (td.contains("odd/flag"))
    td.erase("odd/flag");
  td.set_attr("step", std::to_string(n));
}

int64_t read_step(const TensorDict& td) {
  return td.contains("step") ? td.get("step")[0].item<int64_t>() : 0;
}

void check_state(const TensorDict& td, int64_t n) {
  TensorDict expect({kRows});
  write_state(expect, n);
  ASSERT_EQ(td.keys(), expect.keys()) << "state " << n;
  for (const auto& k : expect.keys()) EXPECT_TRUE(at::equal(td.get(k), expect.get(k))) << k;
  EXPECT_EQ(td.attr("step"), std::to_string(n));
  EXPECT_TRUE(td.verify().empty());
}

TEST(CrashChild, Writer) {
  const char* arg = testing::child_arg();
  if (!arg) GTEST_SKIP() << "runs as a child";
  auto td = TensorDict::open(arg, OpenMode::ReadWrite);
  int64_t n = read_step(td);
  testing::report("ready", n);
  for (++n;; ++n) {
    testing::report("begin", n);
    write_state(td, n);
    td.commit();
    testing::report("done", n);
    write_state(td, n + 1000000);  // staged only: a kill may land in here
    td.rollback();
  }
}

// Kills land after the writer's k-th begun (mostly inside it) or finished commit, measured in
// its reports; rounds go on until 15 kills landed mid-commit.
TEST(Crash, KilledTensorDictWriterLeavesLastCommittedState) {
  testing::TempDir t;
  auto dir = t / "s";
  TensorDict::create(dir, {kRows});
  std::mt19937 rng(2024);
  int64_t acked = 0;
  testing::KillRounds rounds(15, 150);
  while (rounds.more()) {
    testing::Child writer = testing::Child::test("CrashChild.Writer", dir.string());
    auto ready = writer.wait_for("ready");
    ASSERT_TRUE(ready) << "writer did not start";
    ASSERT_EQ(ready->value, acked);
    ASSERT_TRUE(writer.wait_for(rng() % 4 ? "begin" : "done", 1 + static_cast<int>(rng() % 3)));
    const testing::Killed k = writer.kill();
    ASSERT_TRUE(k.signaled) << "the writer exited with " << k.code;
    rounds.count(k);
    acked = k.last_done.value_or(acked);
    auto td = TensorDict::open(dir);
    int64_t n = read_step(td);
    ASSERT_TRUE(n == acked || (k.mid_operation && n == acked + 1))
        << "store at " << n << ", last done " << acked;
    if (n > 0) check_state(td, n);
    acked = n;
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace tdstore
