// tdstore_bench: one line per case, each beside its limit or a peer measured in the same run,
// with the ratio. Machines are shared and noisy: read the ratios, not the absolute times.
//
//   tdstore_bench
//   [--cases=open,get,write,read,compile,loader,append,coldopen,overwrite,smallkeys,cli,dataset]
//   [--dir=PATH] [--mib=1024]

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "bench/bench.h"

using namespace tdstore::bench;

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
  if (cases.count("compile")) bench_compile(), bench_mlp_step(), bench_graph_trust(root);
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
