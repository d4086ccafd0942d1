// Timing, reporting and process helpers of tdstore_bench (tools/bench/bench.h).
#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/conv2d.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/nll_loss.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "bench.h"
#include "tdstore/tdstore.h"

namespace tdstore::bench {

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double median_time(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = Clock::now();
    fn();
    t.push_back(seconds(a, Clock::now()));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void line(const std::string& name, const std::string& ours, const std::string& ref, double ratio,
          double target, bool higher_is_better) {
  bool ok = higher_is_better ? ratio >= target : ratio <= target;
  fmt::print("{:<28} : {:>16} ; {:<34} ; ratio {:6.2f} (target {} {:.2f}) {}\n", name, ours, ref,
             ratio, higher_is_better ? ">=" : "<=", target, ok ? "ok" : "MISS");
}

void fill_pattern(void* p, size_t n) {
  auto* b = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < n / 8; ++i) b[i] = i * 0x9E3779B97F4A7C15ull;
}

double run_once(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t io;
  posix_spawn_file_actions_init(&io);
  posix_spawn_file_actions_addopen(&io, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&io, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  const int rc = posix_spawn(&pid, args[0], &io, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&io);
  if (rc != 0) throw std::runtime_error("spawn " + argv[0]);
  int status = 0;
  struct rusage ru {};
  wait4(pid, &status, 0, &ru);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error(fmt::format("{} failed", fmt::join(argv, " ")));
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

double run_time(const std::vector<std::string>& argv, int reps) {
  return median_time(reps, [&] { run_once(argv); });
}

double run_cpu(const std::vector<std::string>& argv, int reps) {
  std::vector<double> cpu;
  for (int i = 0; i < reps; ++i) cpu.push_back(run_once(argv));
  std::sort(cpu.begin(), cpu.end());
  return cpu[cpu.size() / 2];
}

}  // namespace tdstore::bench
