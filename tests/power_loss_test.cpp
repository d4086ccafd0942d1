// Durability through power loss, proven by exploring crash states: each workload runs in a
// child process whose file-system calls are recorded (tests/crash/syscall_log.c, LD_PRELOAD);
// the states a power loss could leave after each of its calls (unsynced writes lost, kept or
// torn at 512 B and 4 KiB, unsynced directory entries kept or not; tests/crash_states.h) are
// built, and every distinct one must open, hold exactly the last acknowledged state or the one
// in flight, verify clean, and take a new commit.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "storage/checksum.h"
#include "storage/dataset_manifest.h"
#include "tdstore/tdstore.h"
#include "tests/crash_states.h"
#include "tests/fault_env.h"
#include "tests/kill_harness.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

namespace fs = std::filesystem;
using testing::CrashStates;

StoreOptions small() {
  StoreOptions o;
  o.key_capacity = 64;
  o.arena_reserve = int64_t{1} << 30;
  return o;
}

// "" when the condition holds, else what differs.
#define EXPECT_OR_SAY(cond, what) \
  if (!(cond)) return std::string(what)

// ---- workloads: each acknowledges states 0, 1, 2, ... and says what state n holds.

struct Workload {
  const char* name;
  void (*run)(const fs::path& dir, const std::function<void(int64_t)>& ack);
  // "" when what `dir` holds (opened read-only) is state n, else what differs. Throws when it
  // cannot be opened.
  std::string (*holds)(const fs::path& dir, int64_t n);
  // A new commit after the crash, then holds(dir, n) again; "" when both worked.
  std::string (*writes)(const fs::path& dir, int64_t n);
  const char* marker;        // the file that exists once the workload created anything durable
  int variants_divisor = 1;  // checks that open many stores explore fewer random states per call
};

// Commits of set, overwrite and erase with attributes; space freed by one commit is reused by
// the next ones.
at::Tensor block(int64_t n, int64_t j) {
  return at::full({64 * (1 + j)}, static_cast<double>(n * 1000 + j), at::kFloat);
}

void write_state(TensorDict& td, int64_t n) {
  for (int64_t j = 0; j < 5; ++j) {
    const std::string key = "k" + std::to_string(j);
    if (j <= n % 5)
      td.set(key, block(n, j));
    else if (td.contains(key))
      td.erase(key);
  }
  if (n % 2)
    td.set("odd", at::full({3}, static_cast<double>(n), at::kFloat));
  else if (td.contains("odd"))
    td.erase("odd");
  td.set_attr("n", std::to_string(n));
  if (n % 3 == 0)
    td.set_attr("third", std::to_string(n));
  else if (td.attr("third"))
    td.erase_attr("third");
}

std::string holds_state(const TensorDict& td, int64_t n) {
  if (n == 0) {
    EXPECT_OR_SAY(td.keys().empty(), "state 0 has keys");
    return "";
  }
  for (int64_t j = 0; j < 5; ++j) {
    const std::string key = "k" + std::to_string(j);
    EXPECT_OR_SAY(td.contains(key) == (j <= n % 5),
                  key + " presence at state " + std::to_string(n));
    if (j <= n % 5)
      EXPECT_OR_SAY(at::equal(td.get(key), block(n, j)),
                    key + " content at state " + std::to_string(n));
  }
  EXPECT_OR_SAY(td.contains("odd") == (n % 2 == 1), "odd presence at state " + std::to_string(n));
  EXPECT_OR_SAY(
      td.attr("n") == std::to_string(n),
      "attribute n is " + td.attr("n").value_or("absent") + ", state " + std::to_string(n));
  EXPECT_OR_SAY(
      (td.attr("third") == (n % 3 == 0 ? std::optional(std::to_string(n)) : std::nullopt)),
      "attribute third at state " + std::to_string(n));
  return "";
}

void run_commits(const fs::path& dir, const std::function<void(int64_t)>& ack) {
  auto td = TensorDict::create(dir, {}, small());
  ack(0);
  for (int64_t n = 1; n <= 8; ++n) {
    write_state(td, n);
    td.commit();
    ack(n);
  }
}

// Rows appended in committed chunks: state n holds rows [0, rows_at(n)).
int64_t rows_at(int64_t n) { return n * (n + 1) / 2 * 7; }
at::Tensor rows_of(int64_t from, int64_t to) {
  return at::arange(from, to, at::kLong).unsqueeze(1) * at::arange(1, 4, at::kLong);
}

void run_append(const fs::path& dir, const std::function<void(int64_t)>& ack) {
  auto td = TensorDict::create(dir, {0}, small());
  ack(0);
  for (int64_t n = 1; n <= 6; ++n) {
    TensorDict chunk({rows_at(n) - rows_at(n - 1)});
    chunk.set("x", rows_of(rows_at(n - 1), rows_at(n)));
    td.append(chunk);
    td.commit();
    ack(n);
  }
}

std::string holds_rows(const TensorDict& td, int64_t n) {
  EXPECT_OR_SAY(
      td.batch_size() == std::vector<int64_t>{rows_at(n)},
      "batch size " + std::to_string(td.batch_size()[0]) + " at state " + std::to_string(n));
  if (n > 0) {
    EXPECT_OR_SAY(td.contains("x") && at::equal(td.get("x"), rows_of(0, rows_at(n))),
                  "rows at state " + std::to_string(n));
  }
  return "";
}

// Commits, compaction, more commits and a second compaction. States 4 and 7 are compactions:
// the content of states 3 and 6.
int64_t content_of(int64_t n) { return n == 4 ? 3 : n == 7 ? 6 : n > 4 ? n - 1 : n; }

void run_compact(const fs::path& dir, const std::function<void(int64_t)>& ack) {
  { TensorDict::create(dir, {}, small()); }
  ack(0);
  for (int64_t n = 1; n <= 7; ++n) {
    if (n == 4 || n == 7) {
      compact(dir);
    } else {
      auto td = TensorDict::open(dir, OpenMode::ReadWrite, small());
      write_state(td, content_of(n));
      td.commit();
    }
    ack(n);
  }
}

std::string holds_compacted(const TensorDict& td, int64_t n) {
  return holds_state(td, content_of(n));
}

// A value and a lazy property of it: odd states set x, even ones compute the property.
at::Tensor x_of(int64_t m) { return at::full({4, 3}, static_cast<double>(m), at::kDouble); }

void run_lazy(const fs::path& dir, const std::function<void(int64_t)>& ack) {
  auto td = TensorDict::create(dir, {4}, small());
  ack(0);
  for (int64_t n = 1; n <= 8; ++n) {
    if (n % 2) {
      td.set("x", x_of((n + 1) / 2));
      td.commit();
    } else {
      td.get_or_compute("double", {"x"}, [](const TensorDict& d) { return d.get("x") * 2; });
    }
    ack(n);
  }
}

std::string holds_lazy(const TensorDict& td, int64_t n) {
  if (n == 0) return td.keys().empty() ? "" : "state 0 has keys";
  EXPECT_OR_SAY(td.contains("x") && at::equal(td.get("x"), x_of((n + 1) / 2)),
                "x at state " + std::to_string(n));
  auto info = td.lazy_info("double");
  EXPECT_OR_SAY(info.has_value() == (n >= 2), "provenance presence at state " + std::to_string(n));
  if (!info) return "";
  EXPECT_OR_SAY(td.contains("double"),
                "provenance without its property at state " + std::to_string(n));
  EXPECT_OR_SAY(info->valid == (n % 2 == 0), "validity at state " + std::to_string(n));
  // The property pairs with the provenance it was computed with.
  at::Tensor source = (td.get("double") / 2).contiguous();
  EXPECT_OR_SAY(info->dep_checksums.size() == 1 &&
                    storage::xxh3(source.data_ptr(), source.numel() * 8) == info->dep_checksums[0],
                "property paired with foreign provenance at state " + std::to_string(n));
  return "";
}

// Commits, then a writer whose commit fails at its second sync (the slot versions written, the
// header not): the handle is dropped as a crash would; the next writer recovers and commits.
void run_recovery(const fs::path& dir, const std::function<void(int64_t)>& ack) {
  {
    auto td = TensorDict::create(dir, {}, small());
    ack(0);
    for (int64_t n = 1; n <= 3; ++n) {
      write_state(td, n);
      td.commit();
      ack(n);
    }
  }
  for (int64_t n = 4; n <= 6; n += 2) {
    {
      auto env = std::make_shared<testing::FaultEnv>();
      StoreOptions o = small();
      o.env = env;
      auto td = TensorDict::open(dir, OpenMode::ReadWrite, o);
      write_state(td, n);
      env->fail_sync_at = 2;
      try {
        td.commit();
      } catch (const IOError&) {
      }
    }
    auto td = TensorDict::open(dir, OpenMode::ReadWrite, small());  // recovery
    write_state(td, n);
    td.commit();
    ack(n);
    write_state(td, n + 1);
    td.commit();
    ack(n + 1);
  }
}

// Store workloads: the dict opened read-only holds state n and verifies clean; a writer can
// commit over it, and the state is still n.
template <std::string (*Holds)(const TensorDict&, int64_t)>
std::string store_holds(const fs::path& dir, int64_t n) {
  auto td = TensorDict::open(dir, OpenMode::ReadOnly, small());
  if (auto s = Holds(td, n); !s.empty()) return s;
  auto bad = td.verify();
  return bad.empty() ? "" : "verify: " + bad.front();
}
template <std::string (*Holds)(const TensorDict&, int64_t)>
std::string store_writes(const fs::path& dir, int64_t n) {
  {
    auto td = TensorDict::open(dir, OpenMode::ReadWrite, small());
    td.set_attr("after_power_loss", "1");
    td.commit();
  }
  auto td = TensorDict::open(dir, OpenMode::ReadOnly, small());
  if (td.attr("after_power_loss") != "1") return "the commit after recovery was lost";
  return store_holds<Holds>(dir, n);
}
#define STORE_WORKLOAD(name, run, holds) \
  { name, run, store_holds<holds>, store_writes<holds>, "keys.tdd" }

// A dataset: shards written and published one after the other; state n has published shards
// 0..n-1 of 10 + 3 * shard rows each.
int64_t shard_rows(int64_t s) { return 10 + 3 * s; }
int64_t dataset_rows(int64_t n) {
  int64_t r = 0;
  for (int64_t s = 0; s < n; ++s) r += shard_rows(s);
  return r;
}

void run_dataset(const fs::path& dir, const std::function<void(int64_t)>& ack) {
  Dataset ds = Dataset::create(dir);
  ack(0);
  for (int64_t n = 1; n <= 3; ++n) {
    {
      TensorDict shard = ds.shard(n - 1);
      TensorDict rows({shard_rows(n - 1)});
      rows.set("id", at::arange(dataset_rows(n - 1), dataset_rows(n), at::kLong));
      shard.append(rows);
      shard.commit();
    }
    ds.publish();
    ack(n);
  }
}

std::string dataset_holds(const fs::path& dir, int64_t n) {
  Dataset ds = Dataset::open(dir);
  EXPECT_OR_SAY(ds.rows() == dataset_rows(n),
                std::to_string(ds.rows()) + " rows published at state " + std::to_string(n));
  if (n > 0) {
    EXPECT_OR_SAY(at::equal(ds.index(at::arange(ds.rows(), at::kLong)).get("id"),
                            at::arange(dataset_rows(n), at::kLong)),
                  "rows at state " + std::to_string(n));
  }
  for (int64_t s = 0; s < n; ++s) {
    auto bad = TensorDict::open(dir / "shards" / storage::shard_dir_name(s)).verify();
    EXPECT_OR_SAY(bad.empty(),
                  "shard " + std::to_string(s) + ": " + (bad.empty() ? "" : bad.front()));
  }
  return "";
}

// A shard writer commits after the crash, then a publish: it publishes state n plus whatever
// the next shard had committed (all of its rows or none), never a row out of place.
std::string dataset_writes(const fs::path& dir, int64_t n) {
  Dataset ds = Dataset::open(dir);
  {
    TensorDict shard = ds.shard(n + 1);  // a shard past the ones in flight
    shard.set_attr("after_power_loss", "1");
    shard.commit();
  }
  if (auto s = dataset_holds(dir, n); !s.empty()) return s;
  ds.publish();
  Dataset after = Dataset::open(dir);
  const int64_t rows = after.rows();
  EXPECT_OR_SAY(rows == dataset_rows(n) || rows == dataset_rows(n + 1),
                std::to_string(rows) + " rows published after state " + std::to_string(n));
  EXPECT_OR_SAY(rows == 0 || at::equal(after.index(at::arange(rows, at::kLong)).get("id"),
                                       at::arange(rows, at::kLong)),
                "rows out of place after state " + std::to_string(n));
  return "";
}

const Workload kWorkloads[] = {
    STORE_WORKLOAD("commits", run_commits, holds_state),
    STORE_WORKLOAD("append", run_append, holds_rows),
    STORE_WORKLOAD("compact", run_compact, holds_compacted),
    STORE_WORKLOAD("lazy", run_lazy, holds_lazy),
    STORE_WORKLOAD("recovery", run_recovery, holds_state),
    {"dataset", run_dataset, dataset_holds, dataset_writes, "manifest/keys.tdd", 4},
};

const Workload& workload(const std::string& name) {
  for (const auto& w : kWorkloads)
    if (name == w.name) return w;
  throw std::runtime_error("no workload " + name);
}

// "<workload>|<root>": runs the workload on <root>/s under the syscall recorder.
TEST(PowerLossChild, Run) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  const std::string arg = testing::child_arg();
  const auto bar = arg.find('|');
  const fs::path root = arg.substr(bar + 1);
  const int ack_fd =
      ::open((root / "ACK").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  ASSERT_GE(ack_fd, 0);
  workload(arg.substr(0, bar)).run(root / "s", [&](int64_t n) {
    const std::string line = std::to_string(n) + "\n";
    ASSERT_EQ(::write(ack_fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  });
}

// ---- the exploration

// Every check a crash state must pass; "" when it does.
std::string check_state(const Workload& w, const fs::path& dir, int64_t acked, bool in_flight) {
  if (!fs::exists(dir / w.marker))
    return acked < 0 ? "" : "the store of acknowledged state " + std::to_string(acked) + " is gone";
  try {
    const std::string last = acked >= 0 ? w.holds(dir, acked) : "nothing acknowledged";
    const std::string next = in_flight ? w.holds(dir, acked + 1) : "no commit in flight";
    if (!last.empty() && !next.empty())
      return "holds neither the last acknowledged state (" + last + ") nor the next (" + next + ")";
    if (auto s = w.writes(dir, last.empty() ? acked : acked + 1); !s.empty())
      return "after a new commit: " + s;
    return "";
  } catch (const std::exception& e) {
    return std::string("refused: ") + e.what();
  }
}

fs::path scratch_root() {
  std::error_code ec;
  return fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
}

class PowerLoss : public ::testing::TestWithParam<const char*> {};

TEST_P(PowerLoss, EveryCrashStateHoldsAnAcknowledgedCommit) {
  const Workload& w = workload(GetParam());
  testing::TempDir t;
  const fs::path root = fs::canonical(t.path());
  const fs::path log = t / "syscalls.log";
  fs::create_directories(root / "run");
  {
    testing::Child child = testing::Child::test(
        "PowerLossChild.Run", std::string(w.name) + "|" + (root / "run").string(),
        {{"LD_PRELOAD", TDSTORE_SYSCALL_LOG_LIB},
         {"TDSTORE_SYSCALL_LOG", log.string()},
         {"TDSTORE_SYSCALL_ROOT", (root / "run").string()}});
    ASSERT_EQ(child.wait(), 0) << "the workload failed";
  }
  CrashStates states(log, root / "run");
  ASSERT_GT(states.acked_before(states.size()), 0) << "the workload acknowledged nothing";
  std::mt19937 rng(2026);
  std::set<uint64_t> seen;
  const fs::path scratch = scratch_root() / ("tdstore-crash-" + std::to_string(::getpid()));
  const int per_point =
      (std::getenv("TDSTORE_CRASH_VARIANTS") ? std::atoi(std::getenv("TDSTORE_CRASH_VARIANTS"))
                                             : 16) /
      w.variants_divisor;
  int checked = 0, failures = 0;
  std::vector<size_t> unsynced;
  for (size_t k = 1; k <= states.size(); ++k) {
    const auto& op = states.ops()[k - 1];
    if (op.kind == CrashStates::Op::Sync || op.kind == CrashStates::Op::Ack)
      continue;  // nothing new on disk
    unsynced.clear();
    for (size_t i = 0; i < k; ++i)
      if (!states.synced(i, k)) unsynced.push_back(i);
    const int64_t acked = states.acked_before(k);
    const bool in_flight = states.acked_before(states.size()) > acked;
    for (int v = 0; v < per_point + 2; ++v) {
      // v 0: every unsynced call lost; 1: every one kept; 2: all kept but one; then random
      // choices per sector (512 B, or 4 KiB pages) and per directory entry.
      CrashStates::Choice choice;
      choice.kind = v == 0   ? CrashStates::Choice::Lost
                    : v == 1 ? CrashStates::Choice::Kept
                    : v == 2 ? CrashStates::Choice::DropOne
                             : CrashStates::Choice::Random;
      if (v == 2 && unsynced.empty()) continue;
      if (v == 2) choice.dropped = unsynced[rng() % unsynced.size()];
      choice.sector = v % 2 ? 4096 : 512;
      fs::remove_all(scratch);
      const uint64_t digest = states.materialize(k, choice, rng, scratch);
      if (!seen.insert(digest).second) continue;
      ++checked;
      if (const char* keep = std::getenv("TDSTORE_CRASH_KEEP");
          keep && failures == 0)  // before the check changes it
        fs::remove_all(keep), fs::copy(scratch, keep, fs::copy_options::recursive);
      const std::string problem = check_state(w, scratch / "s", acked, in_flight);
      if (!problem.empty() && ++failures <= 5)
        ADD_FAILURE() << w.name << ": crash after call " << k << " of " << states.size()
                      << " (variant " << v << ", last acknowledged state " << acked
                      << "): " << problem;
    }
  }
  fs::remove_all(scratch);
  std::cerr << w.name << ": " << states.size() << " calls recorded, " << checked
            << " distinct crash states checked, " << failures << " wrong\n";
  EXPECT_EQ(failures, 0);
  EXPECT_GT(checked, 100)
      << "too few distinct crash states: the recording missed the workload's calls";
}

INSTANTIATE_TEST_SUITE_P(Workloads, PowerLoss,
                         ::testing::Values("commits", "append", "compact", "lazy", "recovery",
                                           "dataset"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace tdstore
