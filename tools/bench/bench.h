// The pieces every tdstore_bench case shares: timing, the one-line report, and running
// programs as fresh processes. Each case prints one line per figure (tools/tdstore_bench.cpp).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace tdstore::bench {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b);
// Median of `reps` timings of fn, in seconds.
double median_time(int reps, const std::function<void()>& fn);
// One result line: what, our figure, the reference (limit or peer), and the ratio.
void line(const std::string& name, const std::string& ours, const std::string& ref, double ratio,
          double target, bool higher_is_better = true);
void fill_pattern(void* p, size_t n);
// Runs argv once as a fresh process (stdout and stderr to /dev/null); returns its CPU time
// (user + system, from wait4). Throws when it cannot start or fails.
double run_once(const std::vector<std::string>& argv);
// Wall time of one run of argv, median of `reps`.
double run_time(const std::vector<std::string>& argv, int reps);
// CPU time of one run of argv, median of `reps`.
double run_cpu(const std::vector<std::string>& argv, int reps);

// The cases (tools/bench/*_cases.cpp).
void bench_open_and_get(const fs::path& root, bool do_open, bool do_get);
void bench_write(const fs::path& root, size_t mib);
void bench_read(const fs::path& root, size_t mib);
void bench_append(const fs::path& root, size_t mib);
void bench_cold_open(const fs::path& root);
void bench_overwrite(const fs::path& root);
void bench_small_keys(const fs::path& root);
void bench_compile();
void bench_mlp_step();
void bench_graph_trust(const fs::path& root);
void bench_loader(const fs::path& root, int64_t rows);
void bench_cli(const fs::path& root);
void bench_dataset(const fs::path& root, int64_t rows);
// One writer process of bench_dataset (tdstore_bench --cache-worker=...).
void cache_worker(const fs::path& dir, int64_t shard, int64_t begin, int64_t end);

}  // namespace tdstore::bench
