// Runs one test of the current test binary in a fresh process (fork + exec of
// /proc/self/exe), so children start clean: no inherited threads, LMDB environments or locks.
//
// A child reports success with a distinct exit code (kChildPassed), not 0: a child whose
// filter matches no test (renamed, filtered out) exits 0 from gtest, which wait_child() turns
// into kChildRanNothing, so a parent expecting success fails.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace tdstore::testing {

inline constexpr int kChildPassed = 86;       // the child's test ran and passed
inline constexpr int kChildRanNothing = 199;  // the child exited 0 without passing a test

// Environment variable through which a child test learns its argument.
inline const char* child_arg() { return std::getenv("TDSTORE_CHILD_ARG"); }

// In a child: after its test passed, exits with kChildPassed. Global environments are set up
// and torn down only when some test runs, so a filter matching nothing never gets here.
class ChildReporter : public ::testing::Environment {
 public:
  void TearDown() override {
    const auto* u = ::testing::UnitTest::GetInstance();
    if (child_arg() && u->failed_test_count() == 0 && u->successful_test_count() > 0) {
      std::fflush(nullptr);
      _exit(kChildPassed);
    }
  }
};
inline ::testing::Environment* const kChildReporter =
    ::testing::AddGlobalTestEnvironment(new ChildReporter);

// Starts `test` (a full gtest name) with TDSTORE_CHILD_ARG=arg; returns its pid.
inline pid_t spawn_child(const std::string& test, const std::string& arg) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("TDSTORE_CHILD_ARG", arg.c_str(), 1);
    unsetenv("GTEST_OUTPUT");  // the parent's report must not be overwritten
    // Nor its shard: the child's one test would not be in it (scripts/test.sh shards).
    unsetenv("GTEST_TOTAL_SHARDS");
    unsetenv("GTEST_SHARD_INDEX");
    unsetenv("GTEST_SHARD_STATUS_FILE");
    std::string filter = "--gtest_filter=" + test;
    execl("/proc/self/exe", "child", filter.c_str(), "--gtest_brief=1", (char*)nullptr);
    _exit(127);
  }
  return pid;
}

// Waits for a child: 0 when its test passed, kChildRanNothing when it exited 0 without
// passing one, its own exit code otherwise (a test may exit with a code of its own), or
// 128 + signal.
inline int child_code(int status) {
  if (!WIFEXITED(status)) return 128 + WTERMSIG(status);
  const int code = WEXITSTATUS(status);
  return code == kChildPassed ? 0 : code == 0 ? kChildRanNothing : code;
}
inline int wait_child(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return child_code(status);
}

// Runs the child to completion; wait_child's result.
inline int run_child(const std::string& test, const std::string& arg) {
  return wait_child(spawn_child(test, arg));
}

}  // namespace tdstore::testing
