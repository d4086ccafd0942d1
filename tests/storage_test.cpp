// Tests of the on-disk engine without libtorch; also built under ASan/UBSan.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>

#include "storage/compact.h"
#include "storage/directory.h"
#include "storage/graph_record.h"
#include "storage/store.h"
#include "tdstore/errors.h"
#include "tests/fault_env.h"
#include "tests/kill_harness.h"
#include "tests/temp_dir.h"

namespace tdstore::storage {
namespace {

using testing::FaultEnv;
using testing::TempDir;

std::vector<float> floats(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  return v;
}

void put_floats(Store& s, const std::string& key, const std::vector<float>& v) {
  s.put(key, DType::Float32, {static_cast<int64_t>(v.size())}, v.data(), v.size() * 4);
}

std::vector<float> read_floats(Store& s, const std::string& key) {
  auto e = s.find(key);
  EXPECT_TRUE(e) << key;
  if (!e) return {};
  const auto* p = static_cast<const float*>(s.view(*e).data);
  return std::vector<float>(p, p + e->nbytes / 4);
}

StoreOptions small(std::shared_ptr<Env> env = nullptr) {
  StoreOptions o;
  o.key_capacity = 64;
  o.arena_reserve = int64_t{1} << 30;
  o.env = std::move(env);
  return o;
}

TEST(Store, PutCommitReopen) {
  TempDir t;
  auto dir = t / "s";
  {
    auto s = Store::create(dir, {}, small());
    EXPECT_EQ(s->generation(), 0u);
    put_floats(*s, "a", floats(10, 1));
    put_floats(*s, "b/c", floats(3, 100));
    EXPECT_EQ(read_floats(*s, "a"), floats(10, 1));  // staged keys are readable
    s->commit();
    EXPECT_EQ(s->generation(), 1u);
    put_floats(*s, "uncommitted", floats(4, 0));
  }
  auto s = Store::open(dir, OpenMode::ReadOnly, small());
  EXPECT_EQ(s->generation(), 1u);
  EXPECT_EQ(read_floats(*s, "a"), floats(10, 1));
  EXPECT_EQ(read_floats(*s, "b/c"), floats(3, 100));
  EXPECT_FALSE(s->find("uncommitted"));
  EXPECT_EQ(s->info().live_keys, 2u);
  EXPECT_EQ(s->info().live_bytes, 52u);
  std::vector<std::string> keys;
  s->for_each([&](std::string_view k, const Entry&) { keys.emplace_back(k); });
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "b/c"}));
}

TEST(Store, OverwriteEraseAndRollback) {
  TempDir t;
  auto s = Store::create(t / "s", {}, small());
  put_floats(*s, "k", floats(4, 0));
  s->commit();
  uint64_t slot = s->find("k")->slot;
  put_floats(*s, "k", floats(8, 7));
  s->commit();
  EXPECT_EQ(s->find("k")->slot, slot) << "a key keeps its slot";
  EXPECT_EQ(read_floats(*s, "k"), floats(8, 7));
  EXPECT_TRUE(s->erase("k"));
  EXPECT_FALSE(s->find("k"));
  s->rollback();
  EXPECT_EQ(read_floats(*s, "k"), floats(8, 7));
  EXPECT_TRUE(s->erase("k"));
  s->commit();
  EXPECT_FALSE(s->find("k"));
  EXPECT_FALSE(s->erase("k"));
  put_floats(*s, "k", floats(2, 5));
  s->commit();
  EXPECT_EQ(s->find("k")->slot, slot) << "an erased key comes back in its slot";
  EXPECT_EQ(s->info().live_keys, 1u);
}

TEST(Store, ReaderKeepsSnapshotUntilRefresh) {
  TempDir t;
  auto w = Store::create(t / "s", {}, small());
  put_floats(*w, "x", floats(4, 1));
  w->commit();
  auto r = Store::open(t / "s", OpenMode::ReadOnly, small());
  // Three more versions of x: both inline versions are overwritten; the reader walks history.
  for (int i = 2; i <= 4; ++i) {
    put_floats(*w, "x", floats(4, static_cast<float>(i)));
    put_floats(*w, "y" + std::to_string(i), floats(1, 0));
    w->commit();
  }
  EXPECT_EQ(read_floats(*r, "x"), floats(4, 1));
  EXPECT_FALSE(r->find("y2"));
  EXPECT_TRUE(r->refresh());
  EXPECT_EQ(r->generation(), 4u);
  EXPECT_EQ(read_floats(*r, "x"), floats(4, 4));
  EXPECT_TRUE(r->find("y3"));
  EXPECT_FALSE(r->refresh());
}

TEST(Store, SecondWriterGetsLockError) {
  TempDir t;
  auto w = Store::create(t / "s", {}, small());
  try {
    Store::open(t / "s", OpenMode::ReadWrite, small());
    FAIL() << "expected LockError";
  } catch (const LockError& e) {
    EXPECT_NE(std::string(e.what()).find("another writer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find((t / "s").string()), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(Store::open(t / "s", OpenMode::ReadOnly, small()));
  w.reset();
  EXPECT_NO_THROW(Store::open(t / "s", OpenMode::ReadWrite, small()));
}

TEST(Store, ReadOnlyRefusesWrites) {
  TempDir t;
  Store::create(t / "s", {}, small());
  auto r = Store::open(t / "s", OpenMode::ReadOnly, small());
  float x = 1;
  EXPECT_THROW(r->put("a", DType::Float32, {1}, &x, 4), ReadOnlyError);
  EXPECT_THROW(r->commit(), ReadOnlyError);
}

TEST(Store, CapacityAndKeyLimits) {
  TempDir t;
  StoreOptions o = small();
  o.key_capacity = 4;
  auto s = Store::create(t / "s", {}, o);
  float x = 1;
  for (int i = 0; i < 4; ++i) s->put("k" + std::to_string(i), DType::Float32, {1}, &x, 4);
  s->commit();
  try {
    s->put("k4", DType::Float32, {1}, &x, 4);
    FAIL();
  } catch (const CapacityError& e) {
    EXPECT_NE(std::string(e.what()).find("'k4'"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(s->put("k0", DType::Float32, {1}, &x, 4)) << "replacing needs no new slot";
  s->erase("k1");
  EXPECT_NO_THROW(s->put("k4", DType::Float32, {1}, &x, 4)) << "an erased key frees capacity";
  EXPECT_THROW(s->put("", DType::Float32, {1}, &x, 4), KeyError);
  EXPECT_THROW(s->put(std::string("a\0b", 3), DType::Float32, {1}, &x, 4), KeyError);
  EXPECT_THROW(s->put(std::string(kMaxKeyBytes + 1, 'k'), DType::Float32, {1}, &x, 4), KeyError);
  EXPECT_THROW(s->put("bad", static_cast<DType>(99), {1}, &x, 4), DTypeError);
  EXPECT_THROW(s->put("bad", DType::Float32, {2}, &x, 4), ShapeError);
  s->commit();
  auto r = Store::open(t / "s", OpenMode::ReadOnly, o);
  EXPECT_TRUE(r->find("k4"));
  EXPECT_FALSE(r->find("k1"));
  EXPECT_EQ(r->info().live_keys, 4u);
}

TEST(Store, BatchSizeIsEnforced) {
  TempDir t;
  auto s = Store::create(t / "s", {2, 3}, small());
  std::vector<float> v(12);
  EXPECT_NO_THROW(s->put("ok", DType::Float32, {2, 3, 2}, v.data(), 48));
  try {
    s->put("bad", DType::Float32, {3, 2, 2}, v.data(), 48);
    FAIL();
  } catch (const ShapeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'bad'"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  }
}

TEST(Store, ArenaReserveExceeded) {
  TempDir t;
  StoreOptions o = small();
  o.arena_reserve = 1 << 20;
  auto s = Store::create(t / "s", {}, o);
  std::vector<char> big(2 << 20);
  EXPECT_THROW(
      s->put("big", DType::UInt8, {static_cast<int64_t>(big.size())}, big.data(), big.size()),
      CapacityError);
  EXPECT_NO_THROW(s->put("small", DType::UInt8, {16}, big.data(), 16));
  s->commit();
}

TEST(Store, AttributesCommitWithData) {
  TempDir t;
  auto s = Store::create(t / "s", {}, small());
  s->put_attr("source", "fashion-mnist");
  EXPECT_EQ(s->get_attr("source"), "fashion-mnist");
  auto r = Store::open(t / "s", OpenMode::ReadOnly, small());
  EXPECT_FALSE(r->get_attr("source"));
  s->commit();
  EXPECT_FALSE(r->get_attr("source")) << "reader snapshot predates the commit";
  r->refresh();
  EXPECT_EQ(r->get_attr("source"), "fashion-mnist");
  s->put_attr("source", std::nullopt);
  s->put_attr("other", "1");
  s->commit();
  EXPECT_EQ(r->get_attr("source"), "fashion-mnist");
  r->refresh();
  EXPECT_FALSE(r->get_attr("source"));
  EXPECT_EQ(r->attr_names(), std::vector<std::string>{"other"});
}

TEST(Store, ReaderHandleWorksInForkedChild) {
  TempDir t;
  auto w = Store::create(t / "s", {}, small());
  put_floats(*w, "a", floats(3, 1));
  w->put_attr("name", "v1");
  w->commit();
  auto r = Store::open(t / "s", OpenMode::ReadOnly, small());
  EXPECT_EQ(r->get_attr("name"), "v1");
  pid_t pid = fork();
  if (pid == 0) {  // the child opens its own LMDB environment instead of using the parent's
    bool ok = r->get_attr("name") == "v1" && read_floats(*r, "a") == floats(3, 1);
    auto again = Store::open(t / "s", OpenMode::ReadOnly, small());
    ok = ok && again->get_attr("name") == "v1";
    _exit(ok ? 30 : 1);  // 30: read and checked (never gtest's 0)
  }
  ASSERT_GT(pid, 0) << "fork failed";
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 30) << "status " << status;
  EXPECT_EQ(r->get_attr("name"), "v1") << "the parent's environment is untouched";
}

TEST(Store, CommitsWithoutTensorBytesReopen) {
  TempDir t;
  auto s = Store::create(t / "s", {}, small());
  put_floats(*s, "a", floats(3, 1));
  s->commit();
  s->put_attr("only", "catalog");  // a commit that writes no arena bytes
  s->commit();
  s->put("empty", DType::Float32, {0}, nullptr, 0);
  s->commit();
  auto r = Store::open(t / "s", OpenMode::ReadOnly, small());
  EXPECT_EQ(r->generation(), 3u);
  EXPECT_EQ(r->get_attr("only"), "catalog");
  EXPECT_EQ(r->find("empty")->nbytes, 0u);
  EXPECT_TRUE(r->verify().empty());
}

TEST(Store, SharedReadOnlyReadsWithoutTheLockFile) {
  TempDir t;
  {
    auto s = Store::create(t / "s", {}, small());
    put_floats(*s, "a", floats(3, 1));
    s->put_attr("name", "shared");
    s->commit();
  }
  std::filesystem::remove(t / "s" / kCatalogDir / "lock.mdb");
  StoreOptions o = small();
  o.shared_readonly = true;
  auto r = Store::open(t / "s", OpenMode::ReadOnly, o);
  EXPECT_EQ(r->get_attr("name"), "shared");
  EXPECT_EQ(read_floats(*r, "a"), floats(3, 1));
  EXPECT_FALSE(std::filesystem::exists(t / "s" / kCatalogDir / "lock.mdb"));
  EXPECT_THROW(Store::open(t / "s", OpenMode::ReadWrite, o), Error);
}

TEST(Store, VerifyFindsFlippedByte) {
  TempDir t;
  {
    auto s = Store::create(t / "s", {}, small());
    put_floats(*s, "good", floats(100, 0));
    put_floats(*s, "bad", floats(100, 1000));
    s->commit();
  }
  uint64_t off;
  {
    auto s = Store::open(t / "s", OpenMode::ReadOnly, small());
    EXPECT_TRUE(s->verify().empty());
    off = s->find("bad")->offset;
  }
  {
    std::fstream f(t / "s" / kArenaFile, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off + 17));
    char c = 0x5a;
    f.write(&c, 1);
  }
  auto s = Store::open(t / "s", OpenMode::ReadOnly, small());
  EXPECT_EQ(s->verify(), std::vector<std::string>{"bad"});
  EXPECT_EQ(s->verify({"good"}), std::vector<std::string>{});
  EXPECT_THROW(s->verify({"missing"}), KeyError);
}

void flip(const std::filesystem::path& p, uint64_t off) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(off));
  char c;
  f.read(&c, 1);
  c ^= 0x40;
  f.seekp(static_cast<std::streamoff>(off));
  f.write(&c, 1);
}

TEST(Store, TornHeaderCopyFallsBackToOther) {
  TempDir t;
  {
    auto s = Store::create(t / "s", {}, small());
    put_floats(*s, "a", floats(2, 1));
    s->commit();  // generation 1 -> copy 1
    put_floats(*s, "a", floats(2, 2));
    s->commit();  // generation 2 -> copy 0
  }
  flip(t / "s" / kDirectoryFile, kHeaderCopyOffset[0] + 20);  // corrupt generation 2's copy
  auto s = Store::open(t / "s", OpenMode::ReadOnly, small());
  EXPECT_EQ(s->generation(), 1u);
  EXPECT_EQ(read_floats(*s, "a"), floats(2, 1));
  flip(t / "s" / kDirectoryFile, kHeaderCopyOffset[1] + 20);
  EXPECT_THROW(Store::open(t / "s", OpenMode::ReadOnly, small()), CorruptionError);
}

TEST(Store, BadFilesGiveClearErrors) {
  TempDir t;
  EXPECT_THROW(Store::open(t / "missing", OpenMode::ReadOnly, small()), IOError);
  std::filesystem::create_directories(t / "empty");
  EXPECT_THROW(Store::open(t / "empty", OpenMode::ReadOnly, small()), FormatError);
  Store::create(t / "s", {}, small());
  auto keys = t / "s" / kDirectoryFile;
  {  // newer format version, with a valid checksum
    std::fstream f(keys, std::ios::in | std::ios::out | std::ios::binary);
    DirHeader h;
    f.read(reinterpret_cast<char*>(&h), sizeof h);
    h.format_version = kFormatVersion + 1;
    seal(h);
    f.seekp(0);
    f.write(reinterpret_cast<const char*>(&h), sizeof h);
  }
  try {
    Store::open(t / "s", OpenMode::ReadOnly, small());
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("newer"), std::string::npos) << e.what();
  }
  {  // garbage
    std::ofstream f(keys, std::ios::trunc | std::ios::binary);
    std::string junk(9000, 'x');
    f << junk;
  }
  EXPECT_THROW(Store::open(t / "s", OpenMode::ReadOnly, small()), FormatError);
  std::filesystem::resize_file(keys, 100);  // truncated
  EXPECT_THROW(Store::open(t / "s", OpenMode::ReadOnly, small()), CorruptionError);
}

TEST(Store, TruncatedArenaIsCorruption) {
  TempDir t;
  {
    auto s = Store::create(t / "s", {}, small());
    put_floats(*s, "a", floats(5000, 1));
    s->commit();
  }
  std::filesystem::resize_file(t / "s" / kArenaFile, 8192);
  EXPECT_THROW(Store::open(t / "s", OpenMode::ReadOnly, small()), CorruptionError);
}

TEST(Store, FailedSyncBreaksHandleAndKeepsCommittedState) {
  TempDir t;
  auto env = std::make_shared<FaultEnv>();
  const StoreOptions o = small(env);
  for (int nth = 1; nth <= 3; ++nth) {  // arena sync, slot sync, header sync
    auto dir = t / ("s" + std::to_string(nth));
    {
      auto s = Store::create(dir, {}, o);
      put_floats(*s, "a", floats(3, 1));
      s->commit();
      put_floats(*s, "a", floats(3, 9));
      put_floats(*s, "b", floats(3, 9));
      env->syncs = 0;
      env->fail_sync_at = nth;
      EXPECT_THROW(s->commit(), IOError);
      env->fail_sync_at = 0;
      EXPECT_THROW(put_floats(*s, "c", floats(1, 0)), IOError) << "broken handle refuses writes";
    }
    auto s = Store::open(dir, OpenMode::ReadWrite, o);
    if (nth < 3) {  // failed before the commit point
      EXPECT_EQ(s->generation(), 1u);
      EXPECT_EQ(read_floats(*s, "a"), floats(3, 1));
      EXPECT_FALSE(s->find("b"));
    } else {  // the header write happened; only its sync "failed"
      EXPECT_EQ(s->generation(), 2u);
      EXPECT_EQ(read_floats(*s, "a"), floats(3, 9));
    }
    put_floats(*s, "c", floats(1, 0));
    s->commit();
    EXPECT_TRUE(s->verify().empty());
  }
}

// Reads, mappings, the rename that publishes a new store, compaction's exchange and the wait
// for the writer lock go through the Env: each failure is an IOError naming the file, and
// nothing committed is lost.
TEST(Store, FailedReadsAndMappingsOnOpenAreIOErrorsAndLoseNothing) {
  TempDir t;
  auto env = std::make_shared<FaultEnv>();
  const StoreOptions o = small(env);
  {
    auto s = Store::create(t / "s", {}, o);
    put_floats(*s, "a", floats(3000, 1));
    s->commit();
  }
  for (int nth = 1;; ++nth) {  // each mapping an open makes: the key directory, the arena
    env->maps = 0;
    env->fail_map_at = nth;
    try {
      auto s = Store::open(t / "s", OpenMode::ReadOnly, o);
      EXPECT_EQ(read_floats(*s, "a"), floats(3000, 1));
      EXPECT_GE(nth, 3) << "an open maps the key directory and the arena";
      break;  // the nth mapping was not made by open
    } catch (const IOError& e) {
      EXPECT_NE(std::string(e.what()).find("mmap failed"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(nth == 1 ? kDirectoryFile : kArenaFile),
                std::string::npos)
          << e.what();
    }
    ASSERT_LT(nth, 10);
  }
  env->fail_map_at = 0;
  env->reads = 0;
  env->fail_read_at = 1;  // the arena header
  try {
    Store::open(t / "s", OpenMode::ReadOnly, o);
    ADD_FAILURE() << "a failed read opened the store";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find(kArenaFile), std::string::npos) << e.what();
  }
  env->fail_read_at = 0;
  auto s = Store::open(t / "s", OpenMode::ReadWrite, o);
  env->maps = 0;
  env->fail_map_at = 1;  // verify's shared view of the arena
  EXPECT_THROW(s->verify(), IOError);
  env->fail_map_at = 0;
  EXPECT_TRUE(s->verify().empty());
  EXPECT_EQ(read_floats(*s, "a"), floats(3000, 1));
}

TEST(Store, FailedRenameOnCreateLeavesNoStoreAndFailedExchangeKeepsTheOld) {
  TempDir t;
  auto env = std::make_shared<FaultEnv>();
  const StoreOptions o = small(env);
  env->fail_rename = true;
  EXPECT_THROW(Store::create(t / "s", {}, o), IOError);
  env->fail_rename = false;
  EXPECT_FALSE(std::filesystem::exists(t / "s"));
  for (const auto& e : std::filesystem::directory_iterator(t.path()))
    ADD_FAILURE() << "left behind: " << e.path();
  {
    auto s = Store::create(t / "s", {}, o);
    put_floats(*s, "a", floats(10, 4));
    s->commit();
  }
  env->fail_exchange = true;
  EXPECT_THROW(compact(t / "s", o), IOError);
  env->fail_exchange = false;
  for (const auto& e : std::filesystem::directory_iterator(t.path()))
    EXPECT_EQ(e.path().filename(), "s") << "the compacted copy is removed";
  auto s = Store::open(t / "s", OpenMode::ReadWrite, o);
  EXPECT_EQ(read_floats(*s, "a"), floats(10, 4));
  EXPECT_TRUE(s->verify().empty());
}

TEST(Store, AWriterWaitsForTheLockThroughTheEnv) {
  TempDir t;
  auto env = std::make_shared<FaultEnv>();
  const StoreOptions o = small(env);
  auto holder = Store::create(t / "s", {}, o);
  StoreOptions waiting = o;
  waiting.lock_timeout_ms = 100;
  EXPECT_THROW(Store::open(t / "s", OpenMode::ReadWrite, waiting), LockError);
  EXPECT_EQ(env->lock_waits, 20) << "one wait of 5 ms per retry, up to lock_timeout_ms";
}

TEST(Store, FailedWriteLosesNothing) {
  TempDir t;
  auto env = std::make_shared<FaultEnv>();
  const StoreOptions o = small(env);
  auto s = Store::create(t / "s", {}, o);
  put_floats(*s, "a", floats(3, 1));
  s->commit();
  env->writes = 0;
  env->fail_write_at = 1;
  EXPECT_THROW(put_floats(*s, "b", floats(2000, 1)),
               IOError);  // past kCombineMaxBytes: written at once
  env->fail_write_at = 0;
  put_floats(*s, "c", floats(2, 2));  // the handle stays usable after a failed put
  s->commit();
  auto r = Store::open(t / "s", OpenMode::ReadOnly, small());
  EXPECT_EQ(read_floats(*r, "a"), floats(3, 1));
  EXPECT_FALSE(r->find("b"));
  EXPECT_EQ(read_floats(*r, "c"), floats(2, 2));
}

// Small tensors are written together, at the latest by commit: a failed write of them breaks
// the handle (their records would point at bytes that never landed) and loses nothing committed.
TEST(Store, FailedWriteOfCombinedSmallTensorsBreaksTheHandle) {
  TempDir t;
  auto env = std::make_shared<FaultEnv>();
  const StoreOptions o = small(env);
  {
    auto s = Store::create(t / "s", {}, o);
    put_floats(*s, "a", floats(3, 1));
    s->commit();
    env->writes = 0;
    for (int k = 0; k < 50; ++k)
      put_floats(*s, "k" + std::to_string(k), floats(100, static_cast<float>(k)));
    EXPECT_EQ(env->writes, 0) << "400-byte tensors wait for one write";
    EXPECT_EQ(read_floats(*s, "k7"), floats(100, 7)) << "a read sees staged small tensors";
    EXPECT_EQ(env->writes, 1) << "reading flushed them in one write";
    put_floats(*s, "x", floats(100, 9));
    env->writes = 0;
    env->fail_write_at = 1;
    EXPECT_THROW(s->commit(), IOError);
    env->fail_write_at = 0;
    EXPECT_THROW(put_floats(*s, "y", floats(1, 0)), IOError) << "broken";
  }
  auto r = Store::open(t / "s", OpenMode::ReadWrite, o);
  EXPECT_EQ(read_floats(*r, "a"), floats(3, 1));
  EXPECT_FALSE(r->find("k0"));
  EXPECT_TRUE(r->verify().empty());
  for (int k = 0; k < 50; ++k)
    put_floats(*r, "k" + std::to_string(k), floats(100, static_cast<float>(k)));
  r->commit();
  auto again = Store::open(t / "s", OpenMode::ReadOnly, o);
  for (int k = 0; k < 50; ++k)
    EXPECT_EQ(read_floats(*again, "k" + std::to_string(k)), floats(100, static_cast<float>(k)));
  EXPECT_TRUE(again->verify().empty());
}

TEST(Store, FileSizeLimitIsAnIOErrorAndLosesNothing) {
  TempDir t;
  {
    auto s = Store::create(t / "s", {}, small());
    put_floats(*s, "a", floats(16, 1));
    s->commit();
  }
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &lim);
    int code = 3;
    try {
      auto s = Store::open(t / "s", OpenMode::ReadWrite, small());
      std::vector<char> big(4 << 20);
      s->put("big", DType::UInt8, {static_cast<int64_t>(big.size())}, big.data(), big.size());
      code = 1;
    } catch (const IOError& e) {
      code = std::string(e.what()).find("arena.tda") != std::string::npos ? 0 : 2;
    } catch (...) {
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto s = Store::open(t / "s", OpenMode::ReadWrite, small());
  EXPECT_EQ(read_floats(*s, "a"), floats(16, 1));
  EXPECT_FALSE(s->find("big"));
  EXPECT_TRUE(s->verify().empty());
}

TEST(Store, CatalogWriteAtTheFileSizeLimitSaysSo) {
  TempDir t;
  { Store::create(t / "s", {}, small()); }
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    int code = 3;
    try {
      auto s = Store::open(t / "s", OpenMode::ReadWrite, small());
      rlimit lim{1 << 20, 1 << 20};
      setrlimit(RLIMIT_FSIZE, &lim);
      s->put_attr("big", std::string(4 << 20, 'x'));  // the catalog, not the arena, hits the limit
      s->commit();
      code = 1;
    } catch (const IOError& e) {
      code = std::string(e.what()).find("File too large") != std::string::npos ? 0 : 2;
      if (code) fprintf(stderr, "%s\n", e.what());
    } catch (...) {
    }
    _exit(code);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  auto s = Store::open(t / "s", OpenMode::ReadOnly, small());
  EXPECT_FALSE(s->get_attr("big"));
  EXPECT_TRUE(s->verify().empty());
}

// A compaction or creation killed midway leaves a sibling as large as the data; the next open
// for writing removes those of dead processes, never one whose process still runs.
TEST(Store, AWriterOpenRemovesSiblingsOfDeadCompactions) {
  TempDir t;
  Store::create(t / "s", {}, small());
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const auto gone = t / ("s.compact." + std::to_string(dead));
  const auto gone_too = t / ("s.creating." + std::to_string(dead));
  const auto alive = t / ("s.compact." + std::to_string(::getpid()));
  const auto other = t / ("sx.compact." + std::to_string(dead));  // another store's
  // The store a compaction killed during its creation step was making.
  const auto half_made =
      t / ("s.compact." + std::to_string(dead) + ".creating." + std::to_string(dead));
  const auto unknown =
      t / ("s.compact." + std::to_string(dead) + ".mine");  // not a name tdstore makes
  for (const auto& d : {gone, gone_too, alive, other, half_made, unknown}) {
    std::filesystem::create_directories(d);
    std::ofstream(d / "arena.tda") << "leftover";
  }
  Store::open(t / "s", OpenMode::ReadOnly, small());  // readers leave them alone
  EXPECT_TRUE(std::filesystem::exists(gone));
  Store::open(t / "s", OpenMode::ReadWrite, small());
  EXPECT_FALSE(std::filesystem::exists(gone));
  EXPECT_FALSE(std::filesystem::exists(gone_too));
  EXPECT_FALSE(std::filesystem::exists(half_made));
  EXPECT_TRUE(std::filesystem::exists(unknown));
  EXPECT_TRUE(std::filesystem::exists(alive));
  EXPECT_TRUE(std::filesystem::exists(other));
}

TEST(Store, CompactionKeepsContentAndDropsHoles) {
  TempDir t;
  auto dir = t / "s";
  {
    StoreOptions growing = small();
    growing.reuse_space = false;  // leaves the holes compaction removes
    auto s = Store::create(dir, {}, growing);
    for (int round = 0; round < 5; ++round) {
      for (int k = 0; k < 10; ++k)
        put_floats(*s, "k" + std::to_string(k), floats(1000, static_cast<float>(round)));
      s->commit();
    }
    s->erase("k9");
    s->put_attr("source", "test");
    s->put_meta("lazy/k0", "{}");
    s->put_cache("graph/f/x", encode_graph_record({{"prefix", ""}}, "blob"));
    s->commit();
  }
  uint64_t gen_before;
  {
    auto r = Store::open(dir, OpenMode::ReadOnly, small());
    gen_before = r->generation();
  }
  auto holder = Store::open(dir, OpenMode::ReadOnly, small());  // an old handle stays usable
  std::filesystem::create_directories(t / "s.compact.99999");   // a dead compaction's leftover
  CompactResult res = compact(dir, small());
  EXPECT_EQ(res.keys, 9u);
  EXPECT_LT(res.arena_after, res.arena_before / 3);
  EXPECT_EQ(res.generation, gen_before + 1);
  EXPECT_FALSE(std::filesystem::exists(t / "s.compact.99999"));
  auto s = Store::open(dir, OpenMode::ReadOnly, small());
  EXPECT_EQ(s->generation(), gen_before + 1);
  for (int k = 0; k < 9; ++k) EXPECT_EQ(read_floats(*s, "k" + std::to_string(k)), floats(1000, 4));
  EXPECT_FALSE(s->find("k9"));
  EXPECT_EQ(s->get_attr("source"), "test");
  EXPECT_EQ(s->get_meta("lazy/k0"), "{}");
  EXPECT_EQ(s->scan_cache("graph/").size(), 1u);
  EXPECT_TRUE(s->verify().empty());
  EXPECT_EQ(read_floats(*holder, "k3"), floats(1000, 4));
  EXPECT_EQ(holder->get_attr("source"), "test");
  auto w = Store::open(dir, OpenMode::ReadWrite, small());
  EXPECT_THROW(compact(dir, small()), LockError);
  put_floats(*w, "after", floats(3, 0));
  w->commit();
  EXPECT_EQ(w->generation(), gen_before + 2);
  // The old handle moves to the new store on refresh() and sees commits made after the swap;
  // bytes it handed out before stay readable.
  auto old_view = holder->find("k3");
  ASSERT_TRUE(old_view);
  auto old_mapping = holder->mapping();  // what a tensor view of those bytes holds
  const float* old_bytes = static_cast<const float*>(holder->view(*old_view).data);
  EXPECT_TRUE(holder->refresh());
  EXPECT_EQ(holder->generation(), gen_before + 2);
  EXPECT_EQ(read_floats(*holder, "after"), floats(3, 0));
  EXPECT_EQ(holder->get_attr("source"), "test");
  EXPECT_EQ(old_bytes[0], 4.0f);
  put_floats(*w, "later", floats(2, 7));
  w->commit();
  EXPECT_TRUE(holder->refresh());
  EXPECT_EQ(read_floats(*holder, "later"), floats(2, 7));
  EXPECT_FALSE(holder->refresh());
}

// A child compacts the store again and again (each compaction swaps the directory) until told
// to stop; meanwhile readers open it and must always see one whole store (keys and attributes
// together), and a writer's commits must all survive (its lock always belongs to the store it
// writes). The parent stops the child once it opened the store 200 times and at least 5
// compactions finished while it did: a bound on work, whatever the machine's speed.
TEST(Store, OpensRacingCompactionsSeeOneWholeStore) {
  TempDir t;
  auto dir = t / "s";
  {
    auto s = Store::create(dir, {}, small());
    for (int k = 0; k < 8; ++k)
      put_floats(*s, "k" + std::to_string(k), floats(256, static_cast<float>(k)));
    s->put_attr("source", "race");
    s->commit();
  }
  int stop[2];
  ASSERT_EQ(pipe(stop), 0);
  testing::Child compactor = testing::Child::fork(
      [&] {
        close(stop[1]);
        fcntl(stop[0], F_SETFL, O_NONBLOCK);
        StoreOptions o = small();
        o.lock_timeout_ms = 60000;
        char c;
        for (int64_t n = 1; read(stop[0], &c, 1) != 1; ++n) {
          testing::report("begin", n);
          try {
            compact(dir, o);
          } catch (const LockError&) {  // the parent's writer holds the store
          }
          testing::report("done", n);
        }
      },
      "compactor");
  close(stop[0]);
  ASSERT_TRUE(compactor.wait_for("done")) << "the compacting child never ran";
  int opens = 0, written = 0;
  int64_t compactions_at_start = *compactor.last_done();
  StoreOptions o = small();
  o.lock_timeout_ms = 60000;
  auto compactions = [&] {  // finished since the opens began, without waiting for more
    compactor.take_reported();
    return *compactor.last_done() - compactions_at_start;
  };
  while (opens < 200 || compactions() < 5) {
    if (opens >= 200) compactor.wait_for("done");  // enough opens: wait for compactions instead
    auto r = Store::open(dir, OpenMode::ReadOnly, o);
    ++opens;
    ASSERT_EQ(r->get_attr("source"), "race") << "open " << opens << ": keys without attributes";
    ASSERT_TRUE(r->find("k7")) << "open " << opens;
    if (opens % 20 == 0) {
      auto w = Store::open(dir, OpenMode::ReadWrite, o);
      ASSERT_EQ(w->find("w").has_value(), written > 0) << "commit " << written - 1 << " lost";
      if (written) {
        EXPECT_EQ(read_floats(*w, "w"), floats(4, static_cast<float>(written - 1)));
      }
      put_floats(*w, "w", floats(4, static_cast<float>(written)));
      w->commit();
      ++written;
    }
    if (HasFailure()) break;
  }
  ASSERT_EQ(write(stop[1], "s", 1), 1);
  close(stop[1]);
  EXPECT_EQ(compactor.wait(), 0) << "the compacting child failed";
  auto s = Store::open(dir, OpenMode::ReadOnly, o);
  if (written) {
    EXPECT_EQ(read_floats(*s, "w"), floats(4, static_cast<float>(written - 1)))
        << "the last commit lost";
  }
  EXPECT_TRUE(s->verify().empty());
}

TEST(Store, KeysNeverNameAPathOutsideTheirDirectory) {
  TempDir t;
  auto s = Store::create(t / "s", {}, small());
  for (const char* key : {"../../etc", "a/../b", "./x", "a/.", ".."})
    EXPECT_THROW(put_floats(*s, key, floats(1, 0)), KeyError) << key;
  put_floats(*s, "..a/b.", floats(1, 0));  // dots inside a name are fine
  s->commit();
  EXPECT_TRUE(s->find("..a/b."));
}

// ---- crash injection: a child commits in a loop and is SIGKILLed at random moments.

// State n: keys "k0".."k{n%7}" each holding 64*(1 + j) floats of value n*1000 + j, plus "n"
// holding n; key "odd" exists only in odd states. Attribute "n" is n too.
void write_state(Store& s, uint32_t n) {
  for (uint32_t j = 0; j < 8; ++j) {
    std::string key = "k" + std::to_string(j);
    if (j <= n % 7) {
      std::vector<float> v(64 * (1 + j), static_cast<float>(n * 1000 + j));
      put_floats(s, key, v);
    } else {
      s.erase(key);
    }
  }
  if (n % 2)
    put_floats(s, "odd", {static_cast<float>(n)});
  else
    s.erase("odd");
  s.put("n", DType::Int32, {}, &n, 4);
  s.put_attr("n", std::to_string(n));
}

void check_state(Store& s, uint32_t n) {
  auto e = s.find("n");
  ASSERT_TRUE(e);
  uint32_t got;
  std::memcpy(&got, s.view(*e).data, 4);
  ASSERT_EQ(got, n);
  for (uint32_t j = 0; j < 8; ++j) {
    std::string key = "k" + std::to_string(j);
    if (j <= n % 7) {
      EXPECT_EQ(read_floats(s, key),
                std::vector<float>(64 * (1 + j), static_cast<float>(n * 1000 + j)))
          << key << " at state " << n;
    } else {
      EXPECT_FALSE(s.find(key)) << key << " at state " << n;
    }
  }
  EXPECT_EQ(s.find("odd").has_value(), n % 2 == 1);
  if (n > 0) {
    EXPECT_EQ(s.get_attr("n"), std::to_string(n));
  }
  EXPECT_TRUE(s.verify().empty());
}

// A writer process commits state after state and is SIGKILLed at a point measured in its own
// progress: after its k-th begun commit (mostly landing inside it), or after its k-th finished
// one (landing in staged changes that are never committed), plus a short random window that
// starts at that report. Rounds go on until 100 kills landed mid-commit.
TEST(Crash, KilledWriterLeavesLastCommittedState) {
  TempDir t;
  auto dir = t / "s";
  Store::create(dir, {}, small());
  std::mt19937 rng(12345);
  const int wanted =
      std::getenv("TDSTORE_CRASH_KILLS") ? std::atoi(std::getenv("TDSTORE_CRASH_KILLS")) : 100;
  testing::KillRounds rounds(wanted, 20 * wanted);
  uint32_t acked = 0;
  while (rounds.more()) {
    testing::Child writer = testing::Child::fork(
        [&] {
          auto s = Store::open(dir, OpenMode::ReadWrite, small());
          uint32_t n = 0;
          if (auto e = s->find("n")) std::memcpy(&n, s->view(*e).data, 4);
          testing::report("ready", n);
          for (;;) {
            ++n;
            testing::report("begin", n);
            write_state(*s, n);
            s->commit();
            testing::report("done", n);
            write_state(*s, n + 1000000);  // staged, never committed: the kill may land in here
            s->rollback();
          }
        },
        "writer");
    auto ready = writer.wait_for("ready");
    ASSERT_TRUE(ready) << "round " << rounds.rounds();
    ASSERT_EQ(ready->value, acked) << "the writer opened another state than the last one";
    const bool in_commit = rng() % 4 != 0;
    ASSERT_TRUE(writer.wait_for(in_commit ? "begin" : "done", 1 + static_cast<int>(rng() % 4)));
    const auto window = std::chrono::microseconds(rng() % 2000);  // starts at the report
    for (auto end = std::chrono::steady_clock::now() + window;
         std::chrono::steady_clock::now() < end;) {
    }
    const testing::Killed k = writer.kill();
    ASSERT_TRUE(k.signaled) << "the writer exited by itself with " << k.code;
    rounds.count(k);
    acked = static_cast<uint32_t>(k.last_done.value_or(acked));
    auto s = Store::open(dir, OpenMode::ReadOnly, small());
    uint32_t n = 0;
    if (auto e = s->find("n")) std::memcpy(&n, s->view(*e).data, 4);
    // A kill after a commit and before its report leaves the begun state.
    ASSERT_TRUE(n == acked || (k.mid_operation && n == acked + 1))
        << "store at " << n << ", last done " << acked;
    if (n > 0) check_state(*s, n);
    acked = n;
    if (HasFailure()) return;
  }
  std::cerr << rounds.mid_operation() << " of " << rounds.rounds() << " kills landed mid-commit, "
            << acked << " states committed\n";
  auto s = Store::open(dir, OpenMode::ReadWrite, small());  // recovery, then it still works
  write_state(*s, acked + 1);
  s->commit();
  check_state(*s, acked + 1);
  // Space reuse was active in every writer: the free space each one derived at open after a
  // kill handed out nothing still live (the content checks above), and the arena holds a few
  // states' worth instead of one per commit.
  SpaceInfo sp = s->space();
  EXPECT_LT(sp.arena_end, 1u << 20) << acked << " states committed";
}

TEST(Crash, ReadersSeeOnlyCompleteCommits) {
  TempDir t;
  auto dir = t / "s";
  {
    auto s = Store::create(dir, {}, small());
    write_state(*s, 1);
    s->commit();
  }
  pid_t writer = fork();
  if (writer == 0) {
    auto s = Store::open(dir, OpenMode::ReadWrite, small());
    for (uint32_t n = 2; n < 400; ++n) {
      write_state(*s, n);
      s->commit();
    }
    _exit(0);
  }
  std::vector<pid_t> readers;
  for (int r = 0; r < 2; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      auto s = Store::open(dir, OpenMode::ReadOnly, small());
      uint32_t last = 0;
      for (int i = 0; i < 3000; ++i) {
        s->refresh();
        auto e = s->find("n");
        uint32_t n;
        std::memcpy(&n, s->view(*e).data, 4);
        if (n < last) _exit(10);
        last = n;
        check_state(*s, n);
        if (::testing::Test::HasFailure()) _exit(11);
        if (n == 399) break;
      }
      _exit(0);
    }
    readers.push_back(pid);
  }
  int status;
  waitpid(writer, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (pid_t pid : readers) {
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status)) << "reader crashed";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "reader saw an incomplete commit";
  }
}

}  // namespace
}  // namespace tdstore::storage
