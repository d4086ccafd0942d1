// Two processes read one store through rank-sharded Loaders, coordinated by torch.distributed's
// c10d (Gloo over loopback): an all-reduce of per-row visit counts proves that every row is
// seen exactly once per epoch across ranks.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "tdstore/tdstore.h"
#include "tests/child_process.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

constexpr int64_t kRows = 10007;
constexpr int kEpochs = 3;

TEST(DistributedChild, Rank) {
  const char* arg = testing::child_arg();
  if (!arg) GTEST_SKIP() << "runs as a child";
  std::string s(arg);  // "<store>|<rendezvous file>|<rank>"
  auto a = s.find('|'), b = s.rfind('|');
  std::string dir = s.substr(0, a), rendezvous = s.substr(a + 1, b - a - 1);
  int rank = std::stoi(s.substr(b + 1));
  auto store = c10::make_intrusive<c10d::FileStore>(rendezvous, 2);
  auto opts = c10d::ProcessGroupGloo::Options::create();
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, 2, opts);

  StoreOptions so;
  so.shared_readonly = true;  // as on a shared file system: no LMDB lock file
  auto td = TensorDict::open(dir, OpenMode::ReadOnly, so);
  LoaderOptions lo;
  lo.batch_size = 128;
  lo.seed = 42;
  lo.rank = rank;
  lo.world_size = 2;
  Loader loader(td, lo);
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    loader.set_epoch(epoch);
    std::vector<at::Tensor> counts{at::zeros({kRows}, at::kFloat)};
    for (TensorDict batch : loader)
      counts[0].index_add_(0, batch.get("id"), at::ones({batch.batch_size()[0]}));
    pg->allreduce(counts)->wait();
    if (!at::equal(counts[0], at::ones({kRows}))) _exit(10 + epoch);
  }
  _exit(testing::kChildPassed);
}

TEST(Distributed, TwoRanksSeeEveryRowOncePerEpoch) {
  testing::TempDir t;
  {
    auto td = TensorDict::create(t / "s", {kRows});
    td.set("id", at::arange(kRows, at::kLong));
    td.set("x", at::ones({kRows, 8}));
    td.commit();
  }
  std::string base = (t / "s").string() + "|" + (t / "rendezvous").string() + "|";
  pid_t r0 = testing::spawn_child("DistributedChild.Rank", base + "0");
  pid_t r1 = testing::spawn_child("DistributedChild.Rank", base + "1");
  int s0 = testing::wait_child(r0), s1 = testing::wait_child(r1);
  EXPECT_EQ(s0, 0)
      << "rank 0 saw rows missing or repeated (10 + epoch), crashed (128 + signal) or never ran";
  EXPECT_EQ(s1, 0);
}

}  // namespace
}  // namespace tdstore
