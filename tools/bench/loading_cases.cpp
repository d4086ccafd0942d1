// tdstore_bench cases of loading: the Loader, the CLI starting, datasets and parallel caching.
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

// Shuffled batches of 256 rows of 784 float32 from a store larger than the last-level cache,
// beside memcpy of the same bytes and a numpy memmap fancy-index gather of the same rows.
void bench_loader(const fs::path& root, int64_t rows) {
  fs::path dir = root / "loader";
  fs::remove_all(dir);
  {
    auto td = tdstore::TensorDict::create(dir, {rows});
    at::Tensor x = at::empty({rows, 784}, at::kFloat);
    fill_pattern(x.data_ptr(), static_cast<size_t>(x.numel()) * 4);
    td.set("x", x);
    td.commit();
  }
  auto td = tdstore::TensorDict::open(dir);
  tdstore::LoaderOptions o;
  o.batch_size = 256;
  o.seed = 1;
  tdstore::Loader loader(td, o);
  const double bytes = static_cast<double>(rows) * 784 * 4;
  for (tdstore::TensorDict b : loader) (void)b;  // warm the page cache and the mapping
  double ours = 1e9;
  for (int r = 0; r < 3; ++r) {
    loader.set_epoch(r + 1);
    auto a = Clock::now();
    int64_t seen = 0;
    for (tdstore::TensorDict b : loader) seen += b.batch_size()[0];
    ours = std::min(ours, seconds(a, Clock::now()));
  }
  std::vector<char> src(static_cast<size_t>(bytes)), dst(static_cast<size_t>(bytes));
  fill_pattern(src.data(), src.size());
  std::memset(dst.data(), 1, dst.size());
  double peer = median_time(3, [&] { std::memcpy(dst.data(), src.data(), src.size()); });
  line("loader_shuffled_256x784", fmt::format("{:.2f} GB/s", bytes / ours / 1e9),
       fmt::format("memcpy {:.2f} GB/s", bytes / peer / 1e9), peer / ours, 0.70);
  fmt::print("{:<28} : {:>16} ; {:<34} ; (informative)\n", "loader_rows_per_s",
             fmt::format("{:.2f} M rows/s", static_cast<double>(rows) / ours / 1e6), "");
  // numpy: memmap the same bytes inside the arena file, gather the same batches.
  fs::path script = root / "gather.py";
  fs::path idx_file = root / "order.bin";
  {  // the loader's epoch-1 permutation, as the row order to gather
    std::vector<int64_t> order;
    tdstore::TensorDict ids({rows});
    ids.set("id", at::arange(rows, at::kLong));
    tdstore::Loader id_loader(ids, o);
    id_loader.set_epoch(1);
    for (tdstore::TensorDict b : id_loader) {
      at::Tensor t = b.get("id");
      order.insert(order.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
    }
    std::ofstream(idx_file, std::ios::binary)
        .write(reinterpret_cast<const char*>(order.data()),
               static_cast<std::streamsize>(order.size() * 8));
  }
  uint64_t arena_offset = tdstore::StoreReader::open(dir).find("x")->offset;
  std::ofstream(script) << "import numpy, time, sys\n"
                        << "rows = " << rows << "\n"
                        << "a = numpy.memmap('" << (dir / "arena.tda").string()
                        << "', dtype='<f4', mode='r', offset=" << arena_offset
                        << ", shape=(rows, 784))\n"
                        << "order = numpy.fromfile('" << idx_file.string() << "', dtype='<i8')\n"
                        << "best = 1e9\n"
                        << "for r in range(3):\n"
                        << "    t = time.perf_counter()\n"
                        << "    for i in range(0, rows, 256):\n"
                        << "        b = a[order[i:i + 256]]\n"
                        << "    best = min(best, time.perf_counter() - t)\n"
                        << "print(best)\n";
  std::string cmd = "/usr/bin/python3 " + script.string() + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  double np_time = 0;
  if (p && std::fscanf(p, "%lf", &np_time) == 1 && np_time > 0) {
    line("loader_vs_numpy_memmap", fmt::format("{:.2f} GB/s", bytes / ours / 1e9),
         fmt::format("numpy memmap gather {:.2f} GB/s", bytes / np_time / 1e9), np_time / ours,
         1.0);
  } else {
    fmt::print("{:<28} : skipped (no /usr/bin/python3 with numpy)\n", "loader_vs_numpy_memmap");
  }
  if (p) ::pclose(p);
  fs::remove_all(dir);
}

// The tdstore CLI (beside this program) starting on stores: `info` on Fashion-MNIST's training
// set and `ls` of 10,000 keys, against /bin/true started the same way.
void bench_cli(const fs::path& root) {
  const std::string cli = (fs::read_symlink("/proc/self/exe").parent_path() / "tdstore").string();
  fs::path images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  const double base = run_time({"/bin/true"}, 30);
  if (!fs::exists(cli) || !fs::exists(images)) {
    fmt::print("{:<28} : skipped (no {} or no dataset-fashion-mnist)\n", "cli_info_fmnist", cli);
    return;
  }
  fs::path dir = root / "cli-fmnist";
  fs::remove_all(dir);
  run_time({cli, "import", dir.string(), "images=" + images.string(),
            "labels=/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"},
           1);
  double info = run_time({cli, "info", dir.string()}, 30);
  line("cli_info_fmnist", fmt::format("{:.2f} ms", info * 1e3),
       fmt::format("limit 20 ms; /bin/true {:.2f} ms ({:.1f}x)", base * 1e3, info / base),
       info / 0.020, 1.0, false);
  // A fresh process from its start to its first read (open the store, get one key), in CPU
  // time: what every DataLoader worker, CLI call or job start pays.
  const double true_cpu = run_cpu({"/bin/true"}, 31);
  const double show_cpu = run_cpu({cli, "show", dir.string(), "labels"}, 31);
  line("fresh_process_open_get", fmt::format("{:.2f} ms CPU", show_cpu * 1e3),
       fmt::format("limit 5 ms; /bin/true {:.2f} ms CPU", true_cpu * 1e3), show_cpu / 0.005, 1.0,
       false);
  fs::path many = root / "cli-10k";
  fs::remove_all(many);
  {
    tdstore::StoreOptions o;
    o.key_capacity = 16384;
    auto td = tdstore::TensorDict::create(many, {}, o);
    at::Tensor v = at::zeros({100});
    for (int k = 0; k < 10000; ++k) td.set("k/" + std::to_string(k), v);
    td.commit();
  }
  double ls = run_time({cli, "ls", many.string()}, 10);
  line("cli_ls_10000_keys", fmt::format("{:.2f} ms", ls * 1e3),
       fmt::format("limit 50 ms; /bin/true {:.2f} ms", base * 1e3), ls / 0.050, 1.0, false);
  fs::remove_all(dir);
  fs::remove_all(many);
}

// Best-of-3 epoch time of a shuffled Loader (batches of 256) over `make()`.
template <class Source>
double loader_epoch(const Source& source) {
  tdstore::LoaderOptions o;
  o.batch_size = 256;
  o.seed = 1;
  tdstore::Loader loader(source, o);
  for (tdstore::TensorDict b : loader) (void)b;  // warm the page cache and the mapping
  double best = 1e9;
  for (int r = 0; r < 3; ++r) {
    loader.set_epoch(r + 1);
    auto a = Clock::now();
    for (tdstore::TensorDict b : loader) (void)b;
    best = std::min(best, seconds(a, Clock::now()));
  }
  return best;
}

// A CPU-bound caching transform of Fashion-MNIST rows [begin, end), on one core: uint8 ->
// normalized float32, a 3x3 convolution to 8 channels, ReLU, and one back to 1, appended to shard
// `shard` of the dataset at dir in chunks of 1000.
void cache_worker(const fs::path& dir, int64_t shard, int64_t begin, int64_t end) {
  at::set_num_threads(1);  // one core per writer: the scaling measured is the processes'
  at::Tensor images =
      tdstore::read_idx("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
  at::Tensor kernel = at::ones({8, 1, 3, 3}, at::kFloat) / 9,
             back = at::ones({1, 8, 3, 3}, at::kFloat) / 72;
  tdstore::TensorDict td = tdstore::Dataset::open(dir).shard(shard);
  for (int64_t at = begin; at < end; at += 1000) {
    at::Tensor x = images.slice(0, at, std::min(at + 1000, end))
                       .to(at::kFloat)
                       .div_(255)
                       .sub_(0.286)
                       .div_(0.353);
    tdstore::TensorDict chunk({x.size(0)});
    at::Tensor hidden = at::conv2d(x.unsqueeze(1), kernel, {}, 1, 1).clamp_min_(0);
    chunk.set("features", at::conv2d(hidden, back, {}, 1, 1).squeeze(1).contiguous());
    td.append(chunk);
    td.commit();
  }
}

// Datasets: the Loader over 4 shards against the same rows in one store, and parallel caching
// with 1 and 2 writer processes (this program re-run as workers).
void bench_dataset(const fs::path& root, int64_t rows) {
  fs::path one = root / "ds-one", four = root / "ds-four";
  fs::remove_all(one), fs::remove_all(four);
  at::Tensor x = at::empty({rows, 784}, at::kFloat);
  fill_pattern(x.data_ptr(), static_cast<size_t>(x.numel()) * 4);
  {
    auto td = tdstore::TensorDict::create(one, {rows});
    td.set("x", x);
    td.commit();
    auto ds = tdstore::Dataset::create(four);
    for (int64_t s = 0; s < 4; ++s) {
      tdstore::TensorDict part({rows / 4});
      part.set("x", x.slice(0, s * rows / 4, (s + 1) * rows / 4));
      auto shard = ds.shard(s);
      shard.append(part);
      shard.commit();
    }
    ds.publish();
  }
  // Interleaved, best of several: the two differ by a few percent, less than this machine's
  // drift between two back-to-back measurements.
  double single = 1e9, sharded = 1e9;
  for (int r = 0; r < 3; ++r) {
    single = std::min(single, loader_epoch(tdstore::TensorDict::open(one)));
    sharded = std::min(sharded, loader_epoch(tdstore::Dataset::open(four)));
  }
  line("loader_dataset_4_shards", fmt::format("{:.2f} M rows/s", rows / sharded / 1e6),
       fmt::format("one store {:.2f} M rows/s", rows / single / 1e6), single / sharded, 0.95);
  fs::remove_all(one), fs::remove_all(four);

  const std::string self = fs::read_symlink("/proc/self/exe").string();
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    fmt::print("{:<28} : skipped (dataset-fashion-mnist not installed)\n", "parallel_caching");
    return;
  }
  auto cache = [&](int writers) {
    fs::path dir = root / "ds-cache";
    fs::remove_all(dir);
    tdstore::Dataset::create(dir);
    auto a = Clock::now();
    std::vector<pid_t> pids;
    for (int w = 0; w < writers; ++w) {
      std::vector<std::string> argv = {self, "--cache-worker=" + dir.string() + "|" +
                                                 std::to_string(w) + "|" +
                                                 std::to_string(w * 60000 / writers) + "|" +
                                                 std::to_string((w + 1) * 60000 / writers)};
      std::vector<char*> args;
      for (auto& x : argv) args.push_back(x.data());
      args.push_back(nullptr);
      pid_t pid;
      if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, args.data(), environ) != 0)
        throw std::runtime_error("spawn worker");
      pids.push_back(pid);
    }
    for (pid_t p : pids) {
      int status = 0;
      waitpid(p, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        throw std::runtime_error("a caching worker failed");
    }
    auto ds = tdstore::Dataset::open(dir);
    ds.publish();
    double s = seconds(a, Clock::now());
    if (ds.rows() != 60000) throw std::runtime_error("parallel caching lost rows");
    fs::remove_all(dir);
    return s;
  };
  const int cores = static_cast<int>(std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN)));
  double t1 = std::min(cache(1), cache(1));
  fmt::print("{:<28} : {:>16} ; {:<34} ; (informative)\n", "parallel_caching_1_writer",
             fmt::format("{:.0f} rows/s", 60000 / t1), "uint8 -> float32, conv 1-8-1 channels");
  for (int w = 2; w <= cores; w *= 2) {
    double tw = std::min(cache(w), cache(w));
    line(fmt::format("parallel_caching_{}_writers", w), fmt::format("{:.0f} rows/s", 60000 / tw),
         fmt::format("1 writer {:.0f} rows/s, target {:.1f}x", 60000 / t1, 0.8 * w), t1 / tw / w,
         0.8);
  }
}

}  // namespace tdstore::bench
