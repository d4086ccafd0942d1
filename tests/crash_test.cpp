// Crash injection through the TensorDict API: a writer process (a fresh exec of this binary)
// sets and commits in a loop and is SIGKILLed at random moments; after every kill the store
// must open and hold exactly the last committed state, by content.
#include <ATen/core/Tensor.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/scalar_tensor.h>
#include <gtest/gtest.h>

#include <random>

#include "tdstore/tdstore.h"
#include "tests/child_process.h"
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
  if (n % 2) td.set("odd/flag", at::full({kRows}, 1, at::kBool));
  else if (td.contains("odd/flag")) td.erase("odd/flag");
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
  std::string s(arg);
  auto colon = s.rfind(':');
  int fd = std::stoi(s.substr(colon + 1));
  auto td = TensorDict::open(s.substr(0, colon), OpenMode::ReadWrite);
  uint32_t ready = UINT32_MAX;
  if (write(fd, &ready, 4) != 4) _exit(2);
  for (int64_t n = read_step(td) + 1;; ++n) {
    write_state(td, n);
    td.commit();
    auto v = static_cast<uint32_t>(n);
    if (write(fd, &v, 4) != 4) _exit(2);
    write_state(td, n + 1000000);  // staged only: a kill may land in here
    td.rollback();
  }
}

TEST(Crash, KilledTensorDictWriterLeavesLastCommittedState) {
  testing::TempDir t;
  auto dir = t / "s";
  TensorDict::create(dir, {kRows});
  std::mt19937 rng(2024);
  int64_t acked = 0;
  const int kills = 25;
  for (int k = 0; k < kills; ++k) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = testing::spawn_child("CrashChild.Writer", dir.string() + ":" + std::to_string(fds[1]));
    close(fds[1]);
    uint32_t v;
    ASSERT_EQ(read(fds[0], &v, 4), 4) << "writer did not start";
    ASSERT_EQ(v, UINT32_MAX);
    usleep(std::uniform_int_distribution<useconds_t>(0, 30000)(rng));
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    while (read(fds[0], &v, 4) == 4) acked = v;
    close(fds[0]);
    auto td = TensorDict::open(dir);
    int64_t n = read_step(td);
    ASSERT_TRUE(n == acked || n == acked + 1) << "store at " << n << ", last ack " << acked;
    if (n > 0) check_state(td, n);
    acked = n;
    if (HasFailure()) return;
  }
  EXPECT_GT(acked, 5) << "the writer barely committed: the kills tested little";
}

}  // namespace
}  // namespace tdstore
