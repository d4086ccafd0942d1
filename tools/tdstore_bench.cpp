// tdstore_bench: one line per case, each beside its limit or a peer measured in the same run,
// with the ratio. Machines are shared and noisy: read the ratios, not the absolute times.
//
//   tdstore_bench [--cases=open,get,write,read,compile] [--dir=PATH] [--mib=1024]
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
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

#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/graph_fuser.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>

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
void line(const std::string& name, const std::string& ours, const std::string& ref,
          double ratio, double target, bool higher_is_better = true) {
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
    for (int i = 0; i < n; ++i) td.set("group" + std::to_string(i % 100) + "/key" + std::to_string(i), small);
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
    for (int i = 0; i < n; ++i) keys.push_back("group" + std::to_string(i % 100) + "/key" + std::to_string(i));
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
  auto body = [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const at::Tensor& d) {
    return ((a + b) * c - d).relu();
  };
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
    return median_time(5, [&] {
      for (int i = 0; i < reps; ++i) fn();
    }) / reps;
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
    auto f = tdstore::compile("bench", [&](tdstore::TensorDict& d) {
      return body(d.get("k0"), d.get("k1"), d.get("k2"), d.get("k3"));
    }, o);
    double t = time_per_call([&] { f(td); });
    if (n == 4) first = t;
    double over = (t - graph) * 1e6;
    fmt::print("{:<28} : {:>16} ; {:<34} ; over  {:+6.2f} us (target <= 2.00) {}\n",
               fmt::format("compiled_call_{}_keys", n), fmt::format("{:.2f} us", t * 1e6),
               fmt::format("graph alone {:.2f} us", graph * 1e6), over, over <= 2.0 ? "ok" : "MISS");
  }
  fmt::print("{:<28} : {:>16} ; {:<34} ; ratio {:6.2f} (informative)\n", "eager_call_4_ops",
             fmt::format("{:.2f} us", eager * 1e6), fmt::format("compiled {:.2f} us", first * 1e6),
             first / eager);
}

// A small MLP training step (forward and loss compiled, backward outside) against eager.
void bench_mlp_step() {
  std::vector<at::Tensor> w = {(at::randn({784, 128}) * 0.05).requires_grad_(true),
                               (at::randn({128, 10}) * 0.05).requires_grad_(true)};
  auto loss_of = [&](const at::Tensor& x, const at::Tensor& y) {
    at::Tensor logits = x.matmul(w[0]).relu().matmul(w[1]);
    return (logits - y).pow(2).mean();
  };
  tdstore::CompileOptions o;
  o.persist = false;
  o.inputs = w;
  auto step = tdstore::compile("mlp", [&](tdstore::TensorDict& b) { return loss_of(b.get("x"), b.get("y")); }, o);
  tdstore::TensorDict batch({256});
  batch.set("x", at::randn({256, 784}));
  batch.set("y", at::randn({256, 10}));
  auto run = [&](bool compiled) {
    at::Tensor loss = compiled ? step(batch) : loss_of(batch.get("x"), batch.get("y"));
    loss.backward();
    at::NoGradGuard ng;
    for (auto& p : w) {
      p.sub_(p.grad() * 0.01);
      p.grad().zero_();
    }
  };
  for (int i = 0; i < 5; ++i) run(true), run(false);
  double c = median_time(31, [&] { run(true); });
  double e = median_time(31, [&] { run(false); });
  fmt::print("{:<28} : {:>16} ; {:<34} ; ratio {:6.2f} (informative)\n", "mlp_train_step_256",
             fmt::format("{:.0f} us", c * 1e6), fmt::format("eager {:.0f} us", e * 1e6), c / e);
}

}  // namespace

int main(int argc, char** argv) {
  std::set<std::string> cases = {"open", "get", "write", "read", "compile"};
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
    } else if (a.rfind("--mib=", 0) == 0) {
      mib = std::stoul(a.substr(6));
    } else {
      fmt::print(stderr, "usage: tdstore_bench [--cases=open,get,write,read,compile] [--dir=PATH] [--mib=N]\n");
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
  fmt::print("tdstore_bench: {} CPUs ({}), dir {}\n", sysconf(_SC_NPROCESSORS_ONLN), model, root.string());
#ifndef NDEBUG
  fmt::print("WARNING: assertions enabled; figures are not representative\n");
#endif
  if (cases.count("open") || cases.count("get")) bench_open_and_get(root, cases.count("open"), cases.count("get"));
  if (cases.count("write")) bench_write(root, mib);
  if (cases.count("read")) bench_read(root, mib);
  if (cases.count("compile")) bench_compile(), bench_mlp_step();
  fs::remove_all(root);
  return 0;
}
