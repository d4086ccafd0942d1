// Runs one test of the current test binary in a fresh process (fork + exec of
// /proc/self/exe), so children start clean: no inherited threads, LMDB environments or locks.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace tdstore::testing {

// Environment variable through which a child test learns its argument.
inline const char* child_arg() { return std::getenv("TDSTORE_CHILD_ARG"); }

// Starts `test` (a full gtest name) with TDSTORE_CHILD_ARG=arg; returns its pid.
inline pid_t spawn_child(const std::string& test, const std::string& arg) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("TDSTORE_CHILD_ARG", arg.c_str(), 1);
    unsetenv("GTEST_OUTPUT");  // the parent's report must not be overwritten
    std::string filter = "--gtest_filter=" + test;
    execl("/proc/self/exe", "child", filter.c_str(), "--gtest_brief=1", (char*)nullptr);
    _exit(127);
  }
  return pid;
}

// Runs the child to completion; returns its exit code, or 128 + signal.
inline int run_child(const std::string& test, const std::string& arg) {
  pid_t pid = spawn_child(test, arg);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace tdstore::testing
