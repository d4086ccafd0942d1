// tdstore_bench: one line per case, each beside its limit or a peer measured in the same run,
// with the ratio. Machines are shared and noisy: read the ratios, not the absolute times.
//
//   tdstore_bench
//   [--cases=open,get,write,read,compile,loader,append,coldopen,overwrite,smallkeys,cli,dataset]
//   [--dir=PATH] [--mib=1024]
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
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/graph_fuser.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
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

#include "tdstore/tdstore.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Median of `reps` timings of fn, in seconds.
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

// One result line: what, our figure, the reference (limit or peer), and the ratio.
void line(const std::string& name, const std::string& ours, const std::string& ref, double ratio,
          double target, bool higher_is_better = true) {
  bool ok = higher_is_better ? ratio >= target : ratio <= target;
  fmt::print("{:<28} : {:>16} ; {:<34} ; ratio {:6.2f} (target {} {:.2f}) {}\n", name, ours, ref,
             ratio, higher_is_better ? ">=" : "<=", target, ok ? "ok" : "MISS");
}

void fill_pattern(void* p, size_t n) {
  auto* b = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < n / 8; ++i) b[i] = i * 0x9E3779B97F4A7C15ull;
}

void bench_open_and_get(const fs::path& root, bool do_open, bool do_get) {
  fs::path dir = root / "keys10k";
  fs::remove_all(dir);
  const int n = 10000;
  {
    tdstore::StoreOptions o;
    o.key_capacity = 16384;
    auto td = tdstore::TensorDict::create(dir, {}, o);
    at::Tensor small = at::zeros({4});
    for (int i = 0; i < n; ++i)
      td.set("group" + std::to_string(i % 100) + "/key" + std::to_string(i), small);
    td.commit();
  }
  if (do_open) {
    double t = median_time(101, [&] { auto td = tdstore::TensorDict::open(dir); });
    line("open_10k_keys", fmt::format("{:.1f} us", t * 1e6), "limit 1000 us", t * 1e6 / 1000, 1.0,
         false);
  }
  if (do_get) {
    auto td = tdstore::TensorDict::open(dir);
    std::vector<std::string> keys;
    for (int i = 0; i < n; ++i)
      keys.push_back("group" + std::to_string(i % 100) + "/key" + std::to_string(i));
    auto a = Clock::now();
    int64_t sink = 0;
    for (const auto& k : keys) sink += td.get(k).numel();  // first access: directory lookup
    double cold = seconds(a, Clock::now()) / n;
    const int reps = 2000000;
    a = Clock::now();
    for (int i = 0; i < reps; ++i) sink += td.get(keys[i % 64]).numel();
    double warm = seconds(a, Clock::now()) / reps;
    if (sink == 42) fmt::print(" ");
    line("get_present_key", fmt::format("{:.0f} ns", warm * 1e9), "limit 200 ns", warm * 1e9 / 200,
         1.0, false);
    fmt::print("{:<28} : {:>16} ; {:<34} ; ratio {:6.2f} (informative)\n", "get_first_access",
               fmt::format("{:.0f} ns", cold * 1e9), fmt::format("warm get {:.0f} ns", warm * 1e9),
               cold / warm);
  }
}

void bench_write(const fs::path& root, size_t mib) {
  const size_t chunk = size_t{1} << 20;
  std::vector<char> buf(chunk);
  fill_pattern(buf.data(), chunk);
  // Peer: write() + fsync() of the same bytes into a plain file.
  auto peer = [&] {
    fs::path f = root / "plain.bin";
    fs::remove(f);
    int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    auto a = Clock::now();
    for (size_t i = 0; i < mib; ++i)
      if (::write(fd, buf.data(), chunk) != static_cast<ssize_t>(chunk)) std::abort();
    ::fsync(fd);
    double t = seconds(a, Clock::now());
    ::close(fd);
    fs::remove(f);
    return t;
  };
  auto ours = [&] {
    fs::path dir = root / "write";
    fs::remove_all(dir);
    auto td = tdstore::TensorDict::create(dir, {});
    at::Tensor t = at::from_blob(buf.data(), {static_cast<int64_t>(chunk)}, at::kByte);
    auto a = Clock::now();
    for (size_t i = 0; i < mib; ++i) td.set("chunk/" + std::to_string(i), t);
    td.commit();
    double s = seconds(a, Clock::now());
    fs::remove_all(dir);
    return s;
  };
  double p = 1e9, o = 1e9;
  for (int r = 0; r < 2; ++r) {  // best of two, interleaved
    p = std::min(p, peer());
    o = std::min(o, ours());
  }
  double gib = static_cast<double>(mib) / 1024;
  line(fmt::format("set_commit_{}MiB_1MiB", mib), fmt::format("{:.2f} GiB/s", gib / o),
       fmt::format("write+fsync {:.2f} GiB/s", gib / p), p / o, 0.70);
}

void bench_read(const fs::path& root, size_t mib) {
  const size_t n = mib << 20;
  fs::path dir = root / "read";
  fs::remove_all(dir);
  {
    auto td = tdstore::TensorDict::create(dir, {});
    at::Tensor t = at::empty({static_cast<int64_t>(n)}, at::kByte);
    fill_pattern(t.data_ptr(), n);
    td.set("big", t);
    td.commit();
  }
  std::vector<char> src(n), dst(n);
  fill_pattern(src.data(), n);
  std::memset(dst.data(), 1, n);
  double peer = 1e9, ours = 1e9;
  for (int r = 0; r < 3; ++r) {
    auto a = Clock::now();
    std::memcpy(dst.data(), src.data(), n);
    peer = std::min(peer, seconds(a, Clock::now()));
    auto td = tdstore::TensorDict::open(dir);  // fresh mapping each time; page cache warm
    a = Clock::now();
    at::Tensor big = td.get("big");
    std::memcpy(dst.data(), big.data_ptr(), n);
    ours = std::min(ours, seconds(a, Clock::now()));
  }
  double gib = static_cast<double>(mib) / 1024;
  line(fmt::format("read_pass_{}MiB", mib), fmt::format("{:.2f} GiB/s", gib / ours),
       fmt::format("memcpy {:.2f} GiB/s", gib / peer), peer / ours, 0.80);
  fs::remove_all(dir);
}

// Per-call cost of a compiled function reading 4 keys, for dicts of 4, 100 and 10,000 keys,
// beside the same graph run directly through the JIT (its own run time).
void bench_compile() {
  at::NoGradGuard no_grad;
  auto body = [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                 const at::Tensor& d) { return ((a + b) * c - d).relu(); };
  std::vector<at::Tensor> xs;
  for (int i = 0; i < 4; ++i) xs.push_back(at::randn({8}));
  // The graph alone.
  torch::jit::overrideCanFuseOnCPULegacy(false);
  torch::jit::setTensorExprFuserEnabled(false);
  auto [state, outs] = torch::jit::tracer::trace(
      {xs[0], xs[1], xs[2], xs[3]},
      [&](torch::jit::Stack in) -> torch::jit::Stack {
        return {c10::ivalue::Tuple::create(
            {body(in[0].toTensor(), in[1].toTensor(), in[2].toTensor(), in[3].toTensor())})};
      },
      [](const torch::autograd::Variable&) { return std::string(); }, true, false);
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  auto* graph_fn = cu->create_function("g", state->graph);
  torch::jit::getExecutorMode() = false;  // the executor tdstore uses for its graphs
  torch::jit::toGraphFunction(*graph_fn).get_executor();
  torch::jit::getExecutorMode() = true;
  const int reps = 50000;
  auto time_per_call = [&](const std::function<void()>& fn) {
    for (int i = 0; i < 200; ++i) fn();
    return median_time(5,
                       [&] {
                         for (int i = 0; i < reps; ++i) fn();
                       }) /
           reps;
  };
  double graph = time_per_call([&] {
    torch::jit::Stack st{xs[0], xs[1], xs[2], xs[3]};
    graph_fn->run(st);
  });
  double eager = time_per_call([&] { body(xs[0], xs[1], xs[2], xs[3]); });
  tdstore::CompileOptions o;
  o.persist = false;
  double first = 0;
  for (int n : {4, 100, 10000}) {
    tdstore::TensorDict td({8});
    for (int i = 0; i < 4; ++i) td.set("k" + std::to_string(i), xs[i]);
    for (int i = 4; i < n; ++i) td.set("other" + std::to_string(i), xs[0]);
    auto f = tdstore::compile(
        "bench",
        [&](tdstore::TensorDict& d) {
          return body(d.get("k0"), d.get("k1"), d.get("k2"), d.get("k3"));
        },
        o);
    double t = time_per_call([&] { f(td); });
    if (n == 4) first = t;
    double over = (t - graph) * 1e6;
    fmt::print("{:<28} : {:>16} ; {:<34} ; over  {:+6.2f} us (target <= 2.00) {}\n",
               fmt::format("compiled_call_{}_keys", n), fmt::format("{:.2f} us", t * 1e6),
               fmt::format("graph alone {:.2f} us", graph * 1e6), over,
               over <= 2.0 ? "ok" : "MISS");
  }
  // The seed scenario: each call on a fresh dict of n keys (the first call any dict sees),
  // compiled against the same function eager on other fresh dicts of the same shape.
  for (int n : {10, 1000, 10000}) {
    const int m = n >= 10000 ? 60 : 300;
    auto fresh = [&] {
      std::vector<tdstore::TensorDict> dicts;
      for (int j = 0; j < m; ++j) {
        tdstore::TensorDict td({8});
        for (int i = 0; i < 4; ++i) td.set("k" + std::to_string(i), xs[i]);
        for (int i = 4; i < n; ++i) td.set("other" + std::to_string(i), xs[0]);
        dicts.push_back(std::move(td));
      }
      return dicts;
    };
    auto fn = [&](tdstore::TensorDict& d) {
      return body(d.get("k0"), d.get("k1"), d.get("k2"), d.get("k3"));
    };
    auto f = tdstore::compile("bench_fresh", fn, o);
    for (auto& d : fresh()) f(d);  // compiled; the dicts' memory is reused below
    auto per_call = [&](bool compiled) {
      std::vector<double> runs;
      for (int r = 0; r < 3; ++r) {
        auto dicts = fresh();
        auto t0 = std::chrono::steady_clock::now();
        for (auto& d : dicts) compiled ? f(d) : fn(d);
        runs.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / m);
      }
      std::sort(runs.begin(), runs.end());
      return runs[1];
    };
    double c = per_call(true), e = per_call(false);
    double over = (c - e) * 1e6;
    fmt::print("{:<28} : {:>16} ; {:<34} ; over  {:+6.2f} us (target <= 2.00) {}\n",
               fmt::format("fresh_dict_{}_keys", n), fmt::format("{:.2f} us", c * 1e6),
               fmt::format("eager {:.2f} us", e * 1e6), over, over <= 2.0 ? "ok" : "MISS");
  }
  fmt::print("{:<28} : {:>16} ; {:<34} ; ratio {:6.2f} (informative)\n", "eager_call_4_ops",
             fmt::format("{:.2f} us", eager * 1e6), fmt::format("compiled {:.2f} us", first * 1e6),
             first / eager);
}

// The main job's training step (784-256-10 MLP, log-softmax + NLL, batch 128; forward and
// loss compiled, backward and SGD outside) against a plain eager loop of the same model over
// the same in-memory tensors, in rows/s. Threads as the main job sets them: one intra-op.
void bench_mlp_step() {
  const int saved_threads = at::get_num_threads();
  at::set_num_threads(1);
  std::vector<at::Tensor> w = {
      (at::randn({784, 256}) * 0.05).requires_grad_(true), at::zeros({256}).requires_grad_(true),
      (at::randn({256, 10}) * 0.05).requires_grad_(true), at::zeros({10}).requires_grad_(true)};
  auto loss_of = [&](const at::Tensor& x, const at::Tensor& y) {
    at::Tensor logits = (x.matmul(w[0]) + w[1]).relu().matmul(w[2]) + w[3];
    return at::nll_loss(at::log_softmax(logits, 1), y);
  };
  tdstore::CompileOptions o;
  o.persist = false;
  o.inputs = w;
  auto step = tdstore::compile(
      "mlp", [&](tdstore::TensorDict& b) { return loss_of(b.get("x"), b.get("y")); }, o);
  const int64_t rows = 128;
  tdstore::TensorDict batch({rows});
  batch.set("x", at::randn({rows, 784}));
  batch.set("y", at::randint(10, {rows}, at::kLong));
  auto run = [&](bool compiled) {
    at::Tensor loss = compiled ? step(batch) : loss_of(batch.get("x"), batch.get("y"));
    loss.backward();
    at::NoGradGuard ng;
    for (auto& p : w) {
      p.sub_(p.grad() * 0.01);
      p.grad().zero_();
    }
  };
  for (int i = 0; i < 10; ++i) run(true), run(false);
  // Interleaved rounds, best of each: the machine's noise hits both alike.
  double c = 1e9, e = 1e9;
  for (int r = 0; r < 5; ++r) {
    c = std::min(c, median_time(41, [&] { run(true); }));
    e = std::min(e, median_time(41, [&] { run(false); }));
  }
  at::set_num_threads(saved_threads);
  line("train_step_rows_per_s", fmt::format("{:.0f} rows/s", rows / c),
       fmt::format("eager {:.0f} rows/s", rows / e), e / c, 1.0);
}

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

// Appending rows in 4 MiB batches, then one commit, beside write() + fsync() of the same bytes.
void bench_append(const fs::path& root, size_t mib) {
  const int64_t row = 4096, rows_per_chunk = 1024;  // 4 MiB chunks of 4 KiB rows
  const size_t chunks = mib / 4;
  at::Tensor chunk = at::empty({rows_per_chunk, row}, at::kByte);
  fill_pattern(chunk.data_ptr(), static_cast<size_t>(chunk.numel()));
  auto peer = [&] {
    fs::path f = root / "plain.bin";
    int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    auto a = Clock::now();
    for (size_t i = 0; i < chunks; ++i)
      if (::write(fd, chunk.data_ptr(), static_cast<size_t>(chunk.numel())) != chunk.numel())
        std::abort();
    ::fsync(fd);
    double t = seconds(a, Clock::now());
    ::close(fd);
    fs::remove(f);
    return t;
  };
  auto ours = [&](bool reserve) {
    fs::path dir = root / "append";
    fs::remove_all(dir);
    auto td = tdstore::TensorDict::create(dir, {0});
    if (reserve) td.reserve(static_cast<int64_t>(chunks) * rows_per_chunk);
    tdstore::TensorDict rows({rows_per_chunk});
    rows.set("x", chunk);
    auto a = Clock::now();
    for (size_t i = 0; i < chunks; ++i) td.append(rows);
    td.commit();
    double t = seconds(a, Clock::now());
    fs::remove_all(dir);
    return t;
  };
  double p = 1e9, reserved = 1e9, grown = 1e9;
  for (int r = 0; r < 2; ++r)
    p = std::min(p, peer()), reserved = std::min(reserved, ours(true)),
    grown = std::min(grown, ours(false));
  double gib = static_cast<double>(chunks * 4) / 1024;
  line(fmt::format("append_{}MiB_reserved", chunks * 4),
       fmt::format("{:.2f} GiB/s", gib / reserved),
       fmt::format("write+fsync {:.2f} GiB/s", gib / p), p / reserved, 0.70);
  fmt::print("{:<28} : {:>16} ; {:<34} ; ratio {:6.2f} (informative: growth moves copy bytes)\n",
             fmt::format("append_{}MiB_no_reserve", chunks * 4),
             fmt::format("{:.2f} GiB/s", gib / grown),
             fmt::format("write+fsync {:.2f} GiB/s", gib / p), p / grown);
}

// Fashion-MNIST: open its store with a cold page cache and take the first shuffled batch.
void bench_cold_open(const fs::path& root) {
  fs::path data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
  if (!fs::exists(data)) {
    fmt::print("{:<28} : skipped (dataset-fashion-mnist not installed)\n", "cold_open_first_batch");
    return;
  }
  fs::path dir = root / "fmnist";
  fs::remove_all(dir);
  {
    auto td = tdstore::TensorDict::create(dir, {60000});
    td.set("images", tdstore::read_idx(data));
    td.set("labels",
           tdstore::read_idx("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"));
    td.commit();
  }
  ::sync();
  bool cold = std::system("echo 1 > /proc/sys/vm/drop_caches 2>/dev/null") == 0;
  auto a = Clock::now();
  auto td = tdstore::TensorDict::open(dir);
  double open_s = seconds(a, Clock::now());
  tdstore::LoaderOptions o;
  o.batch_size = 256;
  tdstore::Loader loader(td, o);
  auto it = loader.begin();
  tdstore::TensorDict first = *it;
  double first_s = seconds(a, Clock::now());
  fmt::print("{:<28} : {:>16} ; {:<34} ; (informative, page cache {})\n", "fmnist_open",
             fmt::format("{:.0f} us", open_s * 1e6), "60,000 x 28 x 28 uint8 + labels",
             cold ? "dropped" : "warm");
  fmt::print("{:<28} : {:>16} ; {:<34} ; (informative)\n", "fmnist_first_batch",
             fmt::format("{:.2f} ms", first_s * 1e3), "open + Loader + 256 shuffled rows");
  fs::remove_all(dir);
}

// Runs argv once as a fresh process (stdout and stderr to /dev/null); returns its CPU time
// (user + system, from wait4). Throws when it cannot start or fails.
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

// Wall time of one run of argv, median of `reps`.
double run_time(const std::vector<std::string>& argv, int reps) {
  return median_time(reps, [&] { run_once(argv); });
}

// CPU time of one run of argv, median of `reps`.
double run_cpu(const std::vector<std::string>& argv, int reps) {
  std::vector<double> cpu;
  for (int i = 0; i < reps; ++i) cpu.push_back(run_once(argv));
  std::sort(cpu.begin(), cpu.end());
  return cpu[cpu.size() / 2];
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

}  // namespace

// 500 x (set one 1 MiB key + commit): the arena's allocated blocks against the live bytes,
// and the loop's speed against the same loop without space reuse (the arena only growing).
void bench_overwrite(const fs::path& root) {
  const int64_t chunk = int64_t{1} << 20;
  const int rounds = 500;
  std::vector<char> buf(chunk);
  fill_pattern(buf.data(), chunk);
  at::Tensor t = at::from_blob(buf.data(), {chunk}, at::kByte);
  auto loop = [&](bool reuse, uint64_t* allocated) {
    fs::path dir = root / "overwrite";
    fs::remove_all(dir);
    tdstore::StoreOptions o;
    o.reuse_space = reuse;
    double s;
    {
      auto td = tdstore::TensorDict::create(dir, {}, o);
      auto a = Clock::now();
      for (int i = 0; i < rounds; ++i) {
        td.set("state", t);
        td.commit();
      }
      s = seconds(a, Clock::now());
    }
    *allocated = tdstore::StoreReader::open(dir).summary().arena_bytes_allocated;
    fs::remove_all(dir);
    return s;
  };
  uint64_t with = 0, without = 0;
  double r = 1e9, g = 1e9;
  for (int rep = 0; rep < 2; ++rep) {  // best of two, interleaved
    g = std::min(g, loop(false, &without));
    r = std::min(r, loop(true, &with));
  }
  const double live = static_cast<double>(chunk);
  line("overwrite_500x1MiB_space", fmt::format("{:.1f} MiB alloc", with / live),
       fmt::format("live 1 MiB; no reuse {:.0f} MiB", without / live), with / live, 3.0, false);
  line("overwrite_500x1MiB_speed", fmt::format("{:.0f} commits/s", rounds / r),
       fmt::format("no reuse {:.0f} commits/s", rounds / g), g / r, 0.90);
}

// 10,000 keys of 400 bytes set and committed once: against a 50 ms limit (tensordict's
// memmap_ of 10,000 keys is reported at 7.5 s).
void bench_small_keys(const fs::path& root) {
  const int keys = 10000;
  std::vector<at::Tensor> values;
  for (int k = 0; k < keys; ++k) values.push_back(at::full({100}, static_cast<float>(k)));
  auto once = [&] {
    fs::path dir = root / "smallkeys";
    fs::remove_all(dir);
    tdstore::StoreOptions o;
    o.key_capacity = 16384;
    auto td = tdstore::TensorDict::create(dir, {}, o);
    auto a = Clock::now();
    for (int k = 0; k < keys; ++k) td.set("k/" + std::to_string(k), values[k]);
    auto b = Clock::now();
    td.commit();
    double s = seconds(a, Clock::now());
    fs::remove_all(dir);
    return std::make_pair(s, seconds(a, b));
  };
  std::pair<double, double> best{1e9, 0};
  for (int r = 0; r < (getenv("TDSTORE_BENCH_REPS") ? atoi(getenv("TDSTORE_BENCH_REPS")) : 3); ++r)
    best = std::min(best, once());
  line("set_commit_10000x400B", fmt::format("{:.1f} ms", best.first * 1e3),
       fmt::format("limit 50 ms (set {:.0f} ms, commit {:.0f})", best.second * 1e3,
                   (best.first - best.second) * 1e3),
       best.first / 0.050, 1.0, false);
}

int main(int argc, char** argv) {
  std::set<std::string> cases = {"open",      "get",       "write",  "read",
                                 "compile",   "loader",    "append", "coldopen",
                                 "overwrite", "smallkeys", "cli",    "dataset"};
  fs::path root = "/var/tmp/tdstore-bench";
  size_t mib = 1024;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--cases=", 0) == 0) {
      cases.clear();
      std::string list = a.substr(8);
      for (size_t s = 0, e; s <= list.size(); s = e + 1) {
        e = list.find(',', s);
        if (e == std::string::npos) e = list.size();
        cases.insert(list.substr(s, e - s));
      }
    } else if (a.rfind("--dir=", 0) == 0) {
      root = a.substr(6);
    } else if (a.rfind("--cache-worker=", 0) == 0) {  // internal: one writer of bench_dataset
      std::vector<std::string> f;
      std::string v = a.substr(15);
      for (size_t p = 0, e; p <= v.size(); p = e + 1)
        f.push_back(v.substr(p, (e = std::min(v.find('|', p), v.size())) - p));
      cache_worker(f.at(0), std::stoll(f.at(1)), std::stoll(f.at(2)), std::stoll(f.at(3)));
      return 0;
    } else if (a.rfind("--mib=", 0) == 0) {
      mib = std::stoul(a.substr(6));
    } else {
      fmt::print(stderr,
                 "usage: tdstore_bench "
                 "[--cases=open,get,write,read,compile,loader,append,coldopen,overwrite,smallkeys,"
                 "cli,dataset] [--dir=PATH] [--mib=N]\n");
      return 1;
    }
  }
  fs::create_directories(root);
  std::ifstream cpu("/proc/cpuinfo");
  std::string l, model = "unknown";
  while (std::getline(cpu, l))
    if (l.rfind("model name", 0) == 0) {
      model = l.substr(l.find(':') + 2);
      break;
    }
  fmt::print("tdstore_bench: {} CPUs ({}), dir {}\n", sysconf(_SC_NPROCESSORS_ONLN), model,
             root.string());
#ifndef NDEBUG
  fmt::print("WARNING: assertions enabled; figures are not representative\n");
#endif
  if (cases.count("open") || cases.count("get"))
    bench_open_and_get(root, cases.count("open"), cases.count("get"));
  if (cases.count("write")) bench_write(root, mib);
  if (cases.count("read")) bench_read(root, mib);
  if (cases.count("compile")) bench_compile(), bench_mlp_step();
  if (cases.count("loader")) bench_loader(root, 200000);
  if (cases.count("append")) bench_append(root, mib / 2);
  if (cases.count("coldopen")) bench_cold_open(root);
  if (cases.count("overwrite")) bench_overwrite(root);
  if (cases.count("smallkeys")) bench_small_keys(root);
  if (cases.count("cli")) bench_cli(root);
  if (cases.count("dataset")) bench_dataset(root, 100000);
  fs::remove_all(root);
  return 0;
}
