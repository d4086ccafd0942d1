// The reader table (storage/reader_table.h): slots that cannot be fooled by a torn or stale
// claim, a table rebuilt once nobody has it open (after kills, after a power loss), one slot per
// process however many handles it holds, and forked children whose inherited views keep their
// bytes while the parent exits or moves on.
#include "storage/reader_table.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "storage/store.h"
#include "tdstore/errors.h"
#include "tests/kill_harness.h"
#include "tests/temp_dir.h"

namespace tdstore::storage {
namespace reader_table_test {

using testing::TempDir;
constexpr uint64_t kMiB = 1 << 20;

StoreOptions opts() {
  StoreOptions o;
  o.key_capacity = 64;
  o.arena_reserve = int64_t{1} << 32;
  return o;
}

std::vector<uint64_t> pattern(uint64_t seed) {
  std::vector<uint64_t> v(kMiB / 8);
  for (size_t i = 0; i < v.size(); ++i) v[i] = seed * 0x9E3779B97F4A7C15ull + i;
  return v;
}
void put_pattern(Store& s, uint64_t seed) {
  auto v = pattern(seed);
  s.put("x", DType::Int64, {static_cast<int64_t>(v.size())}, v.data(), kMiB);
}
bool holds(const void* p, uint64_t seed) { return std::memcmp(p, pattern(seed).data(), kMiB) == 0; }

// Writes a slot into readers.tdr directly, as a process that died mid-claim (or a page that
// reached the disk before a power loss) would leave it.
void write_slot(const std::filesystem::path& dir, uint32_t index, uint64_t owner,
                uint64_t generation) {
  const int fd = ::open((dir / kReaderTableFile).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ReaderTable::Slot s{};
  s.owner = owner;
  s.generation = generation;
  ASSERT_EQ(::pwrite(fd, &s, sizeof s, 64 + index * sizeof s), static_cast<ssize_t>(sizeof s));
  ::close(fd);
}

// A pid no process has: the highest pid the system hands out, plus one.
uint64_t dead_pid() {
  std::ifstream f("/proc/sys/kernel/pid_max");
  uint64_t max = 4194304;
  f >> max;
  return max + 1 > 0xffffffffu ? 0xfffffffeu : max + 1;
}

// 30 overwrites of a 1 MiB key: the arena grows by at most a few MiB when space is reused.
uint64_t growth_over_overwrites(Store& w) {
  const uint64_t before = w.space().arena_end;
  for (uint64_t i = 0; i < 30; ++i) {
    put_pattern(w, 100 + i);
    w.commit();
  }
  return w.space().arena_end - before;
}

// A slot left by a reader that died (here: a process that never existed, with generation 0,
// "any"), found while another process has the table open: the next scan clears it.
TEST(ReaderTable, ASlotOfADeadProcessIsClearedWhileOthersHoldTheTable) {
  TempDir t;
  auto w = Store::create(t / "s", {}, opts());
  put_pattern(*w, 1);
  w->commit();
  write_slot(t / "s", 7, dead_pid(), 0);  // the writer holds the table: no rebuild
  write_slot(t / "s", 8, dead_pid() | (uint64_t{12345} << 32), 0);
  EXPECT_EQ(w->space().readers, 0u);
  EXPECT_LE(growth_over_overwrites(*w), 3 * kMiB)
      << "a dead reader's slot pinned every freed extent";
}

// A pid that exists but with another start time than the slot's: a reused pid, not the reader.
TEST(ReaderTable, AReusedPidIsNotTakenForTheDeadReader) {
  TempDir t;
  auto w = Store::create(t / "s", {}, opts());
  put_pattern(*w, 1);
  w->commit();
  const uint64_t init = 1;  // pid 1 exists; its start time is not 0xabcdef
  write_slot(t / "s", 3, init | (uint64_t{0xabcdef} << 32), 0);
  EXPECT_LE(growth_over_overwrites(*w), 3 * kMiB);
}

// When nobody has the table open (every user killed, or a power loss), whatever slots it holds
// belong to processes that are gone: the first process to open it rebuilds it.
TEST(ReaderTable, ATableNobodyHasOpenIsRebuilt) {
  TempDir t;
  {
    auto w = Store::create(t / "s", {}, opts());
    put_pattern(*w, 1);
    w->commit();
  }
  // Slots that look alive: this very process (the test runner), generation 1.
  testing::Child reader = testing::Child::fork(
      [&] {
        auto r = Store::open(t / "s", OpenMode::ReadOnly, opts());
        testing::report("ready");
        pause();
      },
      "reader");
  ASSERT_TRUE(reader.wait_for("ready"));
  // It waits in pause() until killed: the kill lands there, with the table open.
  ASSERT_TRUE(reader.kill().signaled) << "the reader exited by itself";
  const uint64_t me = static_cast<uint64_t>(::getpid());
  write_slot(t / "s", 0, me, 1);  // a torn claim of a live pid: its start time is missing
  auto w = Store::open(t / "s", OpenMode::ReadWrite, opts());
  EXPECT_EQ(w->space().readers, 0u);
  EXPECT_LE(growth_over_overwrites(*w), 3 * kMiB) << "slots of a table nobody had open were kept";
}

// Every handle of a store in one process shares one slot: a process may hold more handles than
// the table has slots, and all their views keep their bytes while a writer overwrites.
TEST(ReaderTable, OneSlotPerProcessWhateverTheNumberOfHandles) {
  TempDir t;
  {
    auto w = Store::create(t / "s", {}, opts());
    put_pattern(*w, 1);
    w->commit();
  }
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  testing::Child holder = testing::Child::fork(
      [&] {
        ::close(go[1]);
        std::vector<std::unique_ptr<Store>> handles;
        std::vector<std::shared_ptr<const void>> views;
        std::vector<const void*> bytes;
        for (int i = 0; i < 300; ++i) {
          handles.push_back(Store::open(t / "s", OpenMode::ReadOnly, opts()));
          auto e = handles.back()->find("x");
          bytes.push_back(handles.back()->view(*e).data);
          views.push_back(handles.back()->view(*e).pin);
        }
        testing::report("ready", static_cast<int64_t>(handles.size()));
        char c;
        if (::read(go[0], &c, 1) != 1) _exit(40);
        int intact = 0;
        for (const void* p : bytes) intact += holds(p, 1);
        testing::report("intact", intact);
      },
      "holder");
  ::close(go[0]);
  auto ready = holder.wait_for("ready");
  ASSERT_TRUE(ready);
  EXPECT_EQ(ready->value, 300) << "more handles than format 3's table had slots (255)";
  auto w = Store::open(t / "s", OpenMode::ReadWrite, opts());
  EXPECT_EQ(w->space().readers, 1u) << "one registered process";
  growth_over_overwrites(*w);
  ASSERT_EQ(::write(go[1], "g", 1), 1);
  auto intact = holder.wait_for("intact");
  ASSERT_TRUE(intact);
  EXPECT_EQ(intact->value, 300);
  EXPECT_EQ(holder.wait(), 0);
  ::close(go[1]);
}

// A process holding a view forks (a DataLoader worker): the child's view keeps its bytes when
// (a) the parent exits, or (b) the parent refreshes and drops its own view, while a writer
// overwrites the key again and again.
void forked_view_survives(bool parent_exits) {
  TempDir t;
  {
    auto w = Store::create(t / "s", {}, opts());
    put_pattern(*w, 1);
    w->commit();
  }
  // Only this process writes the go pipes: a child whose test ended reads EOF and exits.
  int go_child[2], go_parent[2];
  ASSERT_EQ(pipe(go_child), 0);
  ASSERT_EQ(pipe(go_parent), 0);
  testing::Child parent = testing::Child::fork(
      [&] {
        ::close(go_child[1]), ::close(go_parent[1]);
        auto r = Store::open(t / "s", OpenMode::ReadOnly, opts());
        auto e = r->find("x");
        const void* bytes = r->view(*e).data;
        auto view = r->view(*e).pin;
        int ready[2];
        if (pipe(ready) != 0) _exit(43);
        const pid_t child = ::fork();
        if (child == 0) {  // the worker: waits, then checks its inherited view
          testing::report("child-ready");
          if (::write(ready[1], "r", 1) != 1) _exit(44);
          char c;
          if (::read(go_child[0], &c, 1) != 1) _exit(40);
          testing::report("checked", holds(bytes, 1) ? 1 : 0);
          _exit(0);
        }
        char c;
        if (::read(ready[0], &c, 1) != 1) _exit(45);
        if (parent_exits) {
          testing::report("parent-exits");
          _exit(testing::kChildPassed);
        }
        if (::read(go_parent[0], &c, 1) != 1) _exit(41);
        view.reset();  // the parent moves on: newer generation, its own view of x dropped
        r->refresh();
        testing::report("parent-moved-on", static_cast<int64_t>(r->generation()));
        if (::read(go_parent[0], &c, 1) != 1) _exit(42);
      },
      "parent");
  ::close(go_child[0]), ::close(go_parent[0]);
  ASSERT_TRUE(parent.wait_for("child-ready"));
  auto w = Store::open(t / "s", OpenMode::ReadWrite, opts());
  if (parent_exits) {
    ASSERT_TRUE(parent.wait_for("parent-exits"));
    ASSERT_EQ(parent.wait(),
              0);  // gone: only the child holds the old view (its pipe end stays open)
  } else {
    put_pattern(*w, 2);
    w->commit();
    ASSERT_EQ(::write(go_parent[1], "g", 1), 1);
    ASSERT_TRUE(parent.wait_for("parent-moved-on"));
  }
  EXPECT_EQ(w->space().readers, parent_exits ? 1u : 2u) << "the child is registered";
  for (uint64_t i = 0; i < 30; ++i) {
    put_pattern(*w, 10 + i);
    w->commit();
  }
  ASSERT_EQ(::write(go_child[1], "c", 1), 1);
  auto checked = parent.wait_for("checked");
  ASSERT_TRUE(checked);
  EXPECT_EQ(checked->value, 1) << "the forked child's view changed under it";
  if (!parent_exits) {
    ASSERT_EQ(::write(go_parent[1], "e", 1), 1);
  }
  ::close(go_child[1]), ::close(go_parent[1]);
}

TEST(ReaderTable, AForkedChildsViewSurvivesItsParentsExit) { forked_view_survives(true); }
TEST(ReaderTable, AForkedChildsViewSurvivesItsParentMovingOn) { forked_view_survives(false); }

// A forked child reads its inherited handle's attributes from a catalog environment of its own:
// the values of the handle's generation while the catalog still holds them, and an Error
// asking for refresh() once a writer replaced a value twice since (never another generation's
// value, never "absent").
int child_reads_attr(Store& r, const char* want, bool lost) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      if (lost) {
        try {
          (void)r.get_meta("attr/a");
          code = 10;  // read something: another generation's value or none
        } catch (const Error&) {
          r.refresh();
          if (r.get_meta("attr/a") != std::optional<std::string>(want)) code = 11;
        }
      } else if (r.get_meta("attr/a") != std::optional<std::string>(want)) {
        code = 12;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "forked child: %s\n", e.what());
      code = 13;
    }
    _exit(code);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(ReaderTable, AForkedChildReadsItsGenerationsAttributesOrIsToldToRefresh) {
  TempDir t;
  auto w = Store::create(t / "s", {}, opts());
  w->put_meta("attr/a", "1");
  w->put_meta("attr/b", "kept");
  w->commit();
  auto r = Store::open(t / "s", OpenMode::ReadOnly, opts());
  ASSERT_EQ(r->get_meta("attr/a"), std::optional<std::string>("1"));
  EXPECT_EQ(child_reads_attr(*r, "1", false), 0) << "nothing changed";
  w->put_meta("attr/a", "2");
  w->commit();
  EXPECT_EQ(child_reads_attr(*r, "1", false), 0) << "replaced once: the old version is kept";
  w->put_meta("attr/a", "3");
  w->commit();
  EXPECT_EQ(child_reads_attr(*r, "3", true), 0) << "replaced twice: refresh() is asked for";
  EXPECT_EQ(r->get_meta("attr/a"), std::optional<std::string>("1")) << "the parent's snapshot";
}

// A forked child that destroys its inherited handle (a worker exiting normally) must leave the
// parent's LMDB read transaction alone: aborting it in the child would free the parent's reader
// slot in lock.mdb, and the writer would then reuse the pages the parent's snapshot reads.
TEST(ReaderTable, AForkedChildDestroyingItsHandleLeavesTheParentsSnapshotAlone) {
  TempDir t;
  auto w = Store::create(t / "s", {}, opts());
  w->put_meta("attr/a", std::string(3000, '1'));  // a page of its own
  w->commit();
  std::unique_ptr<Store> r = Store::open(t / "s", OpenMode::ReadOnly, opts());
  ASSERT_EQ(r->get_meta("attr/a"), std::optional<std::string>(std::string(3000, '1')));
  const pid_t pid = ::fork();
  if (pid == 0) {
    r.reset();  // the inherited handle dies in the child
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int i = 0; i < 50; ++i) {  // LMDB reuses pages no live reader slot protects
    w->put_meta("attr/a", std::string(3000, static_cast<char>('a' + i % 26)));
    w->put_meta("attr/filler" + std::to_string(i), std::string(3000, 'f'));
    w->commit();
  }
  EXPECT_EQ(r->get_meta("attr/a"), std::optional<std::string>(std::string(3000, '1')))
      << "the parent's snapshot lost its pages";
}

}  // namespace reader_table_test
}  // namespace tdstore::storage
