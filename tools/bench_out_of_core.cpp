// bench_out_of_core: shuffled epochs over a store larger than the reader's memory, one line per
// case beside `dd` of the same arena, measured in the same run. Each reader runs in a memory
// cgroup (v1, /sys/fs/cgroup/memory: the page cache is charged to it, as on a machine with less
// RAM than data) after the page cache is dropped. Needs root.
//
//   bench_out_of_core [--dir=/var/tmp/tdstore_ooc] [--rows=1500000] [--limit-mib=1024]
//                     [--budget-mib=LIMIT*3/4] [--block-mib=8] [--random-batches=100]
//                     [--quasi-batches=N] [--only-quasi-random]
//
// The quasi-random loader's memory_budget is set below the limit (the reader's own memory and
// the next window read ahead need room); the loader cases read at most the given batches
// (the quasi-random case: a whole epoch unless told). Each case prints its peak resident set;
// `dd` runs before and after the loader cases, and ratios are to the mean of the two.
// --only-quasi-random runs that case alone (for a profiler) and prints its rate with no ratio.
//
// The store holds `rows` rows of 784 float32 ("x") and a class label ("label", 20 classes in
// runs of equal size, as a dataset cached class by class is); every loader case also prints
// the mean number of distinct classes per batch of 256.
#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tdstore/tdstore.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int64_t kCols = 784, kClasses = 20, kBatch = 256;
const fs::path kCgroup = "/sys/fs/cgroup/memory/tdstore_bench_ooc";

struct Result {
  double seconds = 0;
  int64_t rows = 0;
  double classes = 0;        // mean distinct classes per full batch; 0 when not a loader case
  int64_t peak_rss_mib = 0;  // the reader's peak resident set (VmHWM: heap and mapped pages)
};

int64_t peak_rss_mib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) >> 10;  // kB
  return 0;
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
  if (!f.flush()) throw std::runtime_error("cannot write " + p.string());
}

void drop_page_cache() {
  ::sync();
  write_file("/proc/sys/vm/drop_caches", "3");
}

void make_store(const fs::path& path, int64_t rows) {
  if (fs::exists(path)) {
    auto td = tdstore::TensorDict::open(path);
    if (td.batch_size()[0] == rows) return;
  }
  fs::remove_all(path);
  auto td = tdstore::TensorDict::create(path, {0});
  const int64_t chunk = 20'000;
  td.reserve(rows);
  for (int64_t at = 0; at < rows; at += chunk) {
    const int64_t n = std::min(chunk, rows - at);
    tdstore::TensorDict part({n});
    at::Tensor x = at::zeros({n, kCols});
    at::Tensor label = at::zeros({n}, at::kLong);
    float* xp = x.data_ptr<float>();
    for (int64_t i = 0; i < n * kCols; ++i) xp[i] = static_cast<float>((at * kCols + i) % 251);
    for (int64_t i = 0; i < n; ++i) label.data_ptr<int64_t>()[i] = (at + i) * kClasses / rows;
    part.set("x", x);
    part.set("label", label);
    td.append(part);
    td.commit();
  }
}

// Runs fn in a child process inside the memory cgroup (page cache dropped first); the child
// reports its Result on a pipe.
Result in_cgroup(const std::function<Result()>& fn) {
  drop_page_cache();
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe");
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    Result r;
    try {
      write_file(kCgroup / "cgroup.procs", std::to_string(::getpid()));
      r = fn();
      r.peak_rss_mib = peak_rss_mib();
    } catch (const std::exception& e) {
      fmt::print(stderr, "case failed: {}\n", e.what());
      r.rows = -1;
    }
    if (::write(fds[1], &r, sizeof r) != sizeof r) ::_exit(2);
    ::_exit(0);
  }
  ::close(fds[1]);
  Result r;
  const bool got = ::read(fds[0], &r, sizeof r) == sizeof r;
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!got || r.rows < 0) throw std::runtime_error("a reader failed");
  return r;
}

double since(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

// Reads the file front to back in 8 MiB blocks, as dd does; `direct`: past the page cache
// (O_DIRECT), which takes the kernel's readahead out of the rate.
Result dd(const fs::path& arena, bool direct) {
  const int fd = ::open(arena.c_str(), O_RDONLY | (direct ? O_DIRECT : 0));
  if (fd < 0) throw std::runtime_error("open " + arena.string());
  void* buf = std::aligned_alloc(4096, 8 << 20);
  auto a = Clock::now();
  int64_t bytes = 0;
  for (ssize_t r; (r = ::read(fd, buf, 8 << 20)) > 0;) bytes += r;
  ::close(fd);
  std::free(buf);
  return {since(a), bytes / (kCols * 4 + 8), 0};
}

Result random_preads(const fs::path& arena, int64_t rows, int64_t count) {
  const int fd = ::open(arena.c_str(), O_RDONLY);
  std::vector<char> buf(kCols * 4);
  std::mt19937_64 gen(1);
  const auto size = static_cast<int64_t>(fs::file_size(arena));
  auto a = Clock::now();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t at = static_cast<int64_t>(gen() % static_cast<uint64_t>(rows)) * kCols * 4;
    if (::pread(fd, buf.data(), buf.size(), std::min(at, size - kCols * 4)) < 0)
      throw std::runtime_error("pread");
  }
  ::close(fd);
  return {since(a), count, 0};
}

int64_t budget_mib = 768, block_mib = 8;

Result loader(const fs::path& store, tdstore::LoaderOrder order, bool shuffle,
              int64_t max_batches) {
  auto td = tdstore::TensorDict::open(store);
  tdstore::LoaderOptions o;
  o.memory_budget = budget_mib << 20;
  o.block_bytes = block_mib << 20;
  o.batch_size = kBatch;
  o.order = order;
  o.shuffle = shuffle;
  o.num_workers = 2;
  tdstore::Loader l(td, o);
  Result r;
  double classes = 0;
  int64_t full = 0, batches = 0;
  auto a = Clock::now();
  for (tdstore::TensorDict b : l) {
    at::Tensor label = b.get("label");
    r.rows += label.numel();
    if (label.numel() == kBatch) {
      const int64_t* p = label.data_ptr<int64_t>();
      classes += static_cast<double>(std::set<int64_t>(p, p + kBatch).size());
      ++full;
    }
    if (++batches == max_batches) break;
  }
  r.seconds = since(a);
  r.classes = full ? classes / static_cast<double>(full) : 0;
  return r;
}

void print(const std::string& name, const Result& r, double dd_rate) {
  const double rate = static_cast<double>(r.rows) / r.seconds;
  fmt::print("{:<52} : {:>12.0f} rows/s {:>8.1f} MB/s ; vs dd {:6.3f} ; peak RSS {:>4} MiB{}\n",
             name, rate, rate * (kCols * 4 + 8) / 1e6, rate / dd_rate, r.peak_rss_mib,
             r.classes > 0 ? fmt::format(" ; {:.1f} of {} classes per batch", r.classes, kClasses)
                           : std::string());
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = "/var/tmp/tdstore_ooc";
  int64_t rows = 1'500'000, limit_mib = 1024, random_batches = 100, quasi_batches = -1;
  budget_mib = -1;
  bool only_quasi = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) { return a.substr(std::strlen(flag)); };
    if (a.rfind("--dir=", 0) == 0)
      dir = value("--dir=");
    else if (a.rfind("--rows=", 0) == 0)
      rows = std::stoll(value("--rows="));
    else if (a.rfind("--limit-mib=", 0) == 0)
      limit_mib = std::stoll(value("--limit-mib="));
    else if (a.rfind("--random-batches=", 0) == 0)
      random_batches = std::stoll(value("--random-batches="));
    else if (a.rfind("--quasi-batches=", 0) == 0)
      quasi_batches = std::stoll(value("--quasi-batches="));
    else if (a.rfind("--budget-mib=", 0) == 0)
      budget_mib = std::stoll(value("--budget-mib="));
    else if (a == "--only-quasi-random")
      only_quasi = true;
    else if (a.rfind("--block-mib=", 0) == 0)
      block_mib = std::stoll(value("--block-mib="));
    else {
      fmt::print(stderr,
                 "usage: bench_out_of_core [--dir=PATH] [--rows=N] [--limit-mib=N] "
                 "[--budget-mib=N] [--block-mib=N] [--random-batches=N] [--quasi-batches=N]\n");
      return 2;
    }
  }
  if (::geteuid() != 0 || !fs::exists(kCgroup.parent_path())) {
    fmt::print("bench_out_of_core: needs root and a v1 memory cgroup hierarchy; skipped\n");
    return 0;
  }
  if (budget_mib < 0) budget_mib = limit_mib * 3 / 4;
  fs::create_directories(dir);
  const fs::path store = dir / "store";
  make_store(store, rows);
  fs::create_directories(kCgroup);
  write_file(kCgroup / "memory.limit_in_bytes", std::to_string(limit_mib << 20));
  const auto bytes = static_cast<double>(fs::file_size(store / "arena.tda"));
  fmt::print(
      "store: {} rows of {} float32 + label, {:.2f} GB; reader memory limit {} MiB, "
      "memory_budget {} MiB, block_bytes {} MiB\n",
      rows, kCols, bytes / 1e9, limit_mib, budget_mib, block_mib);
  if (only_quasi) {  // one case alone, for a profiler
    const Result q = in_cgroup(
        [&] { return loader(store, tdstore::LoaderOrder::QuasiRandom, true, quasi_batches); });
    print("Loader, quasi_random, 2 workers", q, 0);
    return 0;
  }
  // dd before and after the loader cases, compared with their mean: this VM's disk rate
  // drifts within a run.
  const Result d0 = in_cgroup([&] { return dd(store / "arena.tda", false); });
  const Result direct = in_cgroup([&] { return dd(store / "arena.tda", true); });
  const Result seq =
      in_cgroup([&] { return loader(store, tdstore::LoaderOrder::Sequential, false, -1); });
  const Result quasi = in_cgroup(
      [&] { return loader(store, tdstore::LoaderOrder::QuasiRandom, true, quasi_batches); });
  const Result random =
      in_cgroup([&] { return loader(store, tdstore::LoaderOrder::Random, true, random_batches); });
  const Result floor =
      in_cgroup([&] { return random_preads(store / "arena.tda", rows, random_batches * kBatch); });
  const Result d1 = in_cgroup([&] { return dd(store / "arena.tda", false); });
  auto rate = [](const Result& r) { return static_cast<double>(r.rows) / r.seconds; };
  const double dd_rate = (rate(d0) + rate(d1)) / 2;
  print("read of arena.tda, 8 MiB blocks (dd), before", d0, dd_rate);
  print("same, after the loader cases", d1, dd_rate);
  print("same, O_DIRECT (no readahead, no page cache)", direct, dd_rate);
  print("Loader, sequential, 2 workers", seq, dd_rate);
  print(quasi_batches < 0
            ? std::string("Loader, quasi_random, 2 workers (an epoch)")
            : fmt::format("Loader, quasi_random, 2 workers (first {} batches)", quasi_batches),
        quasi, dd_rate);
  print(fmt::format("Loader, random, 2 workers (first {} batches)", random_batches), random,
        dd_rate);
  print(fmt::format("random {}-byte preads, one thread ({} rows)", kCols * 4,
                    random_batches * kBatch),
        floor, dd_rate);
  fmt::print(
      "quasi_random vs dd (mean of both): {:.2f} (target >= 0.7), vs dd O_DIRECT: {:.2f}; "
      "random vs the pread floor: {:.2f} (target >= 1)\n",
      rate(quasi) / dd_rate, rate(quasi) / rate(direct), rate(random) / rate(floor));
  fs::remove(kCgroup);
  return 0;
}
