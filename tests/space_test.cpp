// Space reuse (docs/DESIGN.md, "Space reuse"): freed extents are handed out again once no
// reader can see them, the arena stays within a constant multiple of the live bytes, and no
// reader (in this process or another, holding views or not) ever sees its bytes change.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "storage/store.h"
#include "tdstore/errors.h"
#include "tests/fault_env.h"
#include "tests/kill_harness.h"
#include "tests/temp_dir.h"

namespace tdstore::storage {
namespace space_test {

using testing::TempDir;
constexpr uint64_t kMiB = 1 << 20;

StoreOptions opts(bool reuse = true) {
  StoreOptions o;
  o.key_capacity = 256;
  o.arena_reserve = int64_t{1} << 34;
  o.reuse_space = reuse;
  return o;
}

// n bytes whose every 8-byte word encodes (seed, position): any byte from elsewhere shows.
std::vector<uint64_t> pattern(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> v(n / 8);
  for (size_t i = 0; i < v.size(); ++i) v[i] = seed * 0x9E3779B97F4A7C15ull + i;
  return v;
}

void put_pattern(Store& s, const std::string& key, uint64_t n, uint64_t seed) {
  auto v = pattern(n, seed);
  s.put(key, DType::Int64, {static_cast<int64_t>(v.size())}, v.data(), n);
}

bool holds_pattern(const void* p, uint64_t n, uint64_t seed) {
  return std::memcmp(p, pattern(n, seed).data(), n) == 0;
}

bool key_holds(Store& s, const std::string& key, uint64_t n, uint64_t seed) {
  auto e = s.find(key);
  return e && e->nbytes == n && holds_pattern(s.view(*e).data, n, seed);
}

TEST(Space, AnOverwriteLoopKeepsTheArenaWithinThreeTimesTheLiveBytes) {
  TempDir t;
  auto s = Store::create(t / "s", {}, opts());
  for (uint64_t i = 0; i < 500; ++i) {
    put_pattern(*s, "x", kMiB, i);
    s->commit();
  }
  EXPECT_TRUE(key_holds(*s, "x", kMiB, 499));
  SpaceInfo sp = s->space();
  EXPECT_LE(sp.allocated_bytes, 3 * kMiB + kMiB) << "arena_end " << sp.arena_end;
  EXPECT_LE(sp.arena_end, 3 * kMiB + kMiB);
  EXPECT_GT(sp.reusable_bytes + sp.pending_bytes, 0u);
  // The same loop without reuse grows by the data written: the measure can fail.
  auto grow = Store::create(t / "g", {}, opts(false));
  for (uint64_t i = 0; i < 20; ++i) {
    put_pattern(*grow, "x", kMiB, i);
    grow->commit();
  }
  EXPECT_GE(grow->space().arena_end, 20 * kMiB);
}

// Found by the compressed-keys differential test (tests/python/test_compressed.py): a key of no
// bytes was placed at the aligned arena tail, and when the commit's slot copies then went into
// reused space, arena_end stayed below it and every later open refused the key as corrupt.
TEST(Space, AKeyOfNoBytesStaysReadableWhateverTheCommitReuses) {
  TempDir t;
  for (uint64_t odd : {3, 61, 100, 4095}) {
    const auto dir = t / ("s" + std::to_string(odd));
    {
      auto s = Store::create(dir, {}, opts());
      for (int i = 0; i < 3; ++i) {  // freed extents and copies for the next commits to reuse
        put_pattern(*s, "x", 4096, i);
        s->commit();
      }
      // Larger than the space freed: it ends the arena, at an unaligned tail.
      std::string bytes(16384 + odd, 'b');
      s->put("odd", DType::UInt8, {static_cast<int64_t>(bytes.size())}, bytes.data(), bytes.size());
      s->put("empty", DType::Float32, {static_cast<int64_t>(odd), 0}, nullptr, 0);
      s->commit();
      EXPECT_TRUE(s->verify().empty());
    }
    auto r = Store::open(dir, OpenMode::ReadOnly, opts());
    auto e = r->find("empty");
    ASSERT_TRUE(e) << odd;
    EXPECT_EQ(e->shape, (std::vector<int64_t>{static_cast<int64_t>(odd), 0}));
    EXPECT_NE(r->view(*e).data, nullptr);
    EXPECT_TRUE(r->verify().empty()) << odd;
  }
}

// An extent of no bytes (placed at 4096) is never the extent it replaces, even when that one
// starts at 4096 too: the replaced bytes are retired.
TEST(Space, AKeyReplacedByOneOfNoBytesFreesItsExtent) {
  TempDir t;
  auto s = Store::create(t / "s", {}, opts());
  put_pattern(*s, "x", kMiB, 1);
  s->commit();
  ASSERT_EQ(s->find("x")->offset, kArenaDataOffset);
  s->put("x", DType::Int64, {0}, nullptr, 0);
  s->commit();
  EXPECT_GE(s->space().reusable_bytes, kMiB);
}

TEST(Space, EraseAndRecreateCyclesStayBounded) {
  TempDir t;
  auto s = Store::create(t / "s", {}, opts());
  const uint64_t n = 10 * 1024, keys = 100;  // ~1 MiB live
  for (uint64_t cycle = 0; cycle < 500; ++cycle) {
    for (uint64_t k = 0; k < keys; ++k)
      put_pattern(*s, "k" + std::to_string(k), n, cycle * keys + k);
    s->commit();
    if (cycle + 1 == 500) break;
    for (uint64_t k = 0; k < keys; ++k) s->erase("k" + std::to_string(k));
    s->commit();
  }
  for (uint64_t k = 0; k < keys; ++k)
    EXPECT_TRUE(key_holds(*s, "k" + std::to_string(k), n, 499 * keys + k));
  SpaceInfo sp = s->space();
  EXPECT_LE(sp.allocated_bytes, 3 * keys * n + kMiB) << "arena_end " << sp.arena_end;
  EXPECT_TRUE(s->verify().empty());
  // A new writer derives the same free space from the directory and keeps reusing it.
  s.reset();
  s = Store::open(t / "s", OpenMode::ReadWrite, opts());
  const uint64_t end = s->space().arena_end;
  for (uint64_t cycle = 0; cycle < 50; ++cycle) {
    for (uint64_t k = 0; k < keys; ++k)
      put_pattern(*s, "k" + std::to_string(k), n, 7000 + cycle * keys + k);
    s->commit();
  }
  EXPECT_LE(s->space().arena_end, end + kMiB);
  for (uint64_t k = 0; k < keys; ++k)
    EXPECT_TRUE(key_holds(*s, "k" + std::to_string(k), n, 7000 + 49 * keys + k));
}

// A reader handle that does not refresh reads exactly its generation's bytes while the writer
// overwrites and erases hundreds of times; once it moves on, the space is reused.
TEST(Space, AReaderAtAnOldGenerationKeepsItsBytes) {
  TempDir t;
  auto w = Store::create(t / "s", {}, opts());
  put_pattern(*w, "x", kMiB, 1);
  put_pattern(*w, "y", 64 * 1024, 2);
  w->commit();
  auto r = Store::open(t / "s", OpenMode::ReadOnly, opts());
  auto e = r->find("x");
  const void* held = r->view(*e).data;
  auto hold = r->view(*e).pin;
  for (uint64_t i = 0; i < 300; ++i) {
    put_pattern(*w, "x", kMiB, 100 + i);
    if (i % 3 == 0)
      w->erase("y");
    else
      put_pattern(*w, "y", 64 * 1024, 1000 + i);
    w->commit();
  }
  EXPECT_TRUE(holds_pattern(held, kMiB, 1));
  EXPECT_TRUE(key_holds(*r, "x", kMiB, 1));
  EXPECT_TRUE(key_holds(*r, "y", 64 * 1024, 2));
  EXPECT_TRUE(r->verify().empty());
  EXPECT_GE(w->space().arena_end, 300 * kMiB);  // nothing the reader sees was reused
  hold.reset();
  r.reset();
  const uint64_t end = w->space().arena_end;
  for (uint64_t i = 0; i < 100; ++i) {
    put_pattern(*w, "x", kMiB, 5000 + i);
    w->commit();
  }
  EXPECT_LE(w->space().arena_end, end + 4096);  // the reader's generation is gone: reused
  EXPECT_TRUE(key_holds(*w, "x", kMiB, 5099));
}

// A view held across refresh() keeps its bytes while the handle moves on. A reader's view pins
// its generation (as an LMDB read transaction does); a view in the writer's process pins only
// its extent.
TEST(Space, ViewsHeldAcrossRefreshAndCommitsKeepTheirBytes) {
  TempDir t;
  auto w = Store::create(t / "s", {}, opts());
  put_pattern(*w, "x", kMiB, 1);
  w->commit();
  auto r = Store::open(t / "s", OpenMode::ReadOnly, opts());
  auto re = r->find("x");
  const void* reader_view = r->view(*re).data;
  auto reader_hold = r->view(*re).pin;
  auto we = w->find("x");
  const void* writer_view = w->view(*we).data;
  auto writer_hold = w->view(*we).pin;
  for (uint64_t i = 0; i < 100; ++i) {
    put_pattern(*w, "x", kMiB, 100 + i);
    w->commit();
    ASSERT_TRUE(r->refresh());
    ASSERT_TRUE(key_holds(*r, "x", kMiB, 100 + i));
  }
  EXPECT_TRUE(holds_pattern(reader_view, kMiB, 1));
  EXPECT_TRUE(holds_pattern(writer_view, kMiB, 1));
  EXPECT_TRUE(r->verify().empty());
  reader_hold.reset();  // the reader handle stays open, at the newest generation
  const uint64_t end = w->space().arena_end;
  for (uint64_t i = 0; i < 100; ++i) {
    put_pattern(*w, "x", kMiB, 1000 + i);
    w->commit();
    ASSERT_TRUE(r->refresh());
  }
  EXPECT_LE(w->space().arena_end, end + 4096);  // reused, except the writer's held extent
  EXPECT_TRUE(holds_pattern(writer_view, kMiB, 1));
  EXPECT_TRUE(key_holds(*r, "x", kMiB, 1099));
}

// A reader's in-place write into its view is private (copy on write). When the writer later
// reuses that page, the reader sees the new bytes after refresh(), not its stale copy. The
// writer drops its own copies of a run's pages before reusing it, through its Env.
TEST(Space, ACopiedOnWritePageNeverHidesNewBytes) {
  TempDir t;
  auto env = std::make_shared<testing::FaultEnv>();
  StoreOptions o = opts();
  o.env = env;
  auto w = Store::create(t / "s", {}, o);
  put_pattern(*w, "x", 64 * 1024, 1);
  w->commit();
  auto r = Store::open(t / "s", OpenMode::ReadOnly, opts());
  {
    auto e = r->find("x");
    auto hold = r->view(*e).pin;
    std::memset(const_cast<void*>(r->view(*e).data), 0xAB, 64 * 1024);  // private to this process
    EXPECT_TRUE(r->verify().empty()) << "verify checks the file, not the private copy";
    // The writer's own in-place write to a view of its committed extent, likewise.
    auto we = w->find("x");
    auto whold = w->view(*we).pin;
    std::memset(const_cast<void*>(w->view(*we).data), 0xCD, 64 * 1024);
  }
  for (uint64_t i = 0; i < 10; ++i) {
    put_pattern(*w, "x", 64 * 1024, 10 + i);
    w->commit();
    ASSERT_TRUE(r->refresh());
    ASSERT_TRUE(key_holds(*r, "x", 64 * 1024, 10 + i)) << "round " << i;
    ASSERT_TRUE(key_holds(*w, "x", 64 * 1024, 10 + i)) << "round " << i;
  }
  EXPECT_LE(w->space().arena_end, 8 * 64 * 1024);  // the pages were reused
  EXPECT_GT(env->discards.load(), 0);
}

// Readers in other processes: one holds an old generation while the writer overwrites (its
// bytes never change); one is killed with SIGKILL (its slot is cleared, reuse resumes).
TEST(Space, ReadersInOtherProcessesAreProtectedAndDeadOnesAreCleared) {
  TempDir t;
  {
    auto w = Store::create(t / "s", {}, opts());
    put_pattern(*w, "x", kMiB, 1);
    w->commit();
  }
  int ready[2], go[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  pid_t reader = fork();
  if (reader == 0) {
    auto r = Store::open(t / "s", OpenMode::ReadOnly, opts());
    auto e = r->find("x");
    const void* p = r->view(*e).data;
    auto hold = r->view(*e).pin;
    char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(20);
    bool exact = true;
    for (;;) {  // checks its bytes until told to stop
      exact = exact && holds_pattern(p, kMiB, 1);
      struct timeval tv {
        0, 1000
      };
      fd_set fds;
      FD_ZERO(&fds);
      FD_SET(go[0], &fds);
      if (select(go[0] + 1, &fds, nullptr, nullptr, &tv) > 0) break;
    }
    _exit(exact && key_holds(*r, "x", kMiB, 1) && r->verify().empty() ? 30
                                                                      : 21);  // 30: checked, exact
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1) << "the reader never ran";
  auto w = Store::open(t / "s", OpenMode::ReadWrite, opts());
  EXPECT_EQ(w->space().readers, 1u);
  for (uint64_t i = 0; i < 200; ++i) {
    put_pattern(*w, "x", kMiB, 100 + i);
    w->commit();
  }
  ASSERT_EQ(write(go[1], "x", 1), 1);
  int status = 0;
  waitpid(reader, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 30)
      << "the reader's bytes changed under it (21), or it never checked";

  // A reader killed while registered at an old generation does not pin space forever.
  testing::Child doomed = testing::Child::fork(
      [&] {
        auto r = Store::open(t / "s", OpenMode::ReadOnly, opts());
        testing::report("ready", static_cast<int64_t>(r->generation()));
        pause();
      },
      "reader");
  ASSERT_TRUE(doomed.wait_for("ready")) << "the second reader never ran";
  EXPECT_EQ(w->space().readers, 1u);
  EXPECT_TRUE(doomed.kill().signaled);
  EXPECT_EQ(w->space().readers, 0u);
  const uint64_t end = w->space().arena_end;
  for (uint64_t i = 0; i < 100; ++i) {
    put_pattern(*w, "x", kMiB, 9000 + i);
    w->commit();
  }
  EXPECT_LE(w->space().arena_end, end + 4096);
  EXPECT_TRUE(key_holds(*w, "x", kMiB, 9099));
}

// A transaction rolled back returns what it took; staged extents replaced before commit are
// reused after it.
TEST(Space, RollbackAndReplacedStagedExtentsAreReused) {
  TempDir t;
  auto s = Store::create(t / "s", {}, opts());
  put_pattern(*s, "x", kMiB, 1);
  s->commit();
  for (uint64_t i = 0; i < 200; ++i) {
    put_pattern(*s, "x", kMiB, 10 + i);
    put_pattern(*s, "x", kMiB, 20 + i);  // replaces the staged extent at once
    if (i % 2) {
      s->rollback();
      put_pattern(*s, "x", kMiB, 30 + i);
    }
    s->commit();
  }
  EXPECT_TRUE(key_holds(*s, "x", kMiB, 30 + 199));
  EXPECT_LE(s->space().arena_end, 6 * kMiB);
  EXPECT_TRUE(s->verify().empty());
}

// const member functions on one handle from several threads (run under ASan by scripts/test.sh):
// catalog reads share one LMDB snapshot, and the key index is built on first use.
TEST(Threads, ConstCallsOnOneHandleFromFourThreads) {
  TempDir t;
  auto w = Store::create(t / "s", {}, opts());
  for (int k = 0; k < 50; ++k) put_pattern(*w, "k" + std::to_string(k), 4096, k);
  w->put_attr("source", "test");
  w->put_meta("lazy/k0", "{}");
  w->commit();
  auto r = Store::open(t / "s", OpenMode::ReadOnly, opts());
  for (Store* s : {w.get(), r.get()}) {
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i)
      threads.emplace_back([&, i] {
        for (int n = 0; n < 10000; ++n) {
          const std::string key = "k" + std::to_string((n + i) % 50);
          auto e = s->find(key);
          if (!e || e->nbytes != 4096) ++wrong;
          if (s->get_attr("source") != "test") ++wrong;
          if (n % 16 == 0 && s->get_meta("lazy/k0") != "{}") ++wrong;
          if (n % 64 == 0 && s->scan_meta("attr/").size() != 1) ++wrong;
          if (s->key_count() != 50 || !s->has_prefix("k1")) ++wrong;
        }
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0) << (s == w.get() ? "writer" : "reader");
  }
}

// Small writes wait in a buffer until a call reads the arena; const calls from several threads
// (verify) flush it once, without a race (the buffer was written by every reader at once
// before; this test runs under ASan too). data() is not const: callers serialize it, as
// TensorDict and StoreReader do with their own mutex.
TEST(Threads, ConstCallsFromFourThreadsFlushPendingSmallWritesOnce) {
  TempDir t;
  auto w = Store::create(t / "s", {}, opts());
  std::mutex data_mu;
  for (int round = 0; round < 300; ++round) {
    for (int k = 0; k < 8; ++k) put_pattern(*w, "r" + std::to_string(k), 256, round * 8 + k);
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 4; ++i)
      threads.emplace_back([&, i] {
        for (int k = i; k < 8; k += 4) {
          const std::string key = "r" + std::to_string(k);
          if (!w->verify({key}).empty()) ++wrong;  // const: flushes concurrently with the others
          std::lock_guard lock(data_mu);
          if (!key_holds(*w, key, 256, round * 8 + k)) ++wrong;
        }
      });
    for (auto& th : threads) th.join();
    ASSERT_EQ(wrong.load(), 0) << "round " << round;
    if (round % 50 == 49) w->commit();
  }
  w->commit();
  EXPECT_TRUE(w->verify().empty());
}

}  // namespace space_test
}  // namespace tdstore::storage
