// The key directory of format 4 (docs/FORMAT.md, "Key index"): slots handed out in creation
// order behind a key index, so that a commit of many new keys writes few pages; slots of erased
// keys reused by other keys, so that churn never exhausts the directory; readers at old
// generations unaffected by new index entries; a commit killed at any instant leaves the last
// committed state; damage to the index reported, never taken for absent keys. Format 3 (slots
// placed by hash) is still created on request and must behave the same.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "storage/directory.h"
#include "storage/store.h"
#include "tdstore/admin.h"
#include "tdstore/errors.h"
#include "tests/kill_harness.h"
#include "tests/temp_dir.h"

namespace tdstore::storage {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

StoreOptions opts(int format, int64_t capacity) {
  StoreOptions o;
  o.format_version = format;
  o.key_capacity = capacity;
  o.arena_reserve = int64_t{1} << 32;
  return o;
}

void put_value(Store& s, const std::string& key, int64_t a, int64_t b) {
  int64_t v[2] = {a, b};
  s.put(key, DType::Int64, {2}, v, sizeof v);
}

// The key's two values, or nullopt when it is absent.
std::optional<std::pair<int64_t, int64_t>> value_of(Store& s, const std::string& key) {
  auto e = s.find(key);
  if (!e) return std::nullopt;
  int64_t v[2];
  std::memcpy(v, s.view(*e).data, sizeof v);
  return std::make_pair(v[0], v[1]);
}

std::vector<std::string> keys_in_slot_order(const Store& s) {
  std::vector<std::string> out;
  s.for_each([&](std::string_view k, const Entry&) { out.emplace_back(k); });
  return out;
}

// Churn state n: "step" = {n, 0} and keys "k/i" = {i, 7i} for the last kWindow i <= n; every
// commit creates one key and erases the oldest, so keys keep taking slots other keys left.
constexpr int64_t kWindow = 6;
void write_churn(Store& s, int64_t n) {
  put_value(s, "step", n, 0);
  put_value(s, "k/" + std::to_string(n), n, 7 * n);
  if (n > kWindow) s.erase("k/" + std::to_string(n - kWindow));
}

// Empty when the store holds exactly churn state n.
std::string churn_differs(Store& s, int64_t n) {
  std::set<std::string> want{"step"};
  for (int64_t i = std::max<int64_t>(1, n - kWindow + 1); i <= n; ++i)
    want.insert("k/" + std::to_string(i));
  std::set<std::string> got;
  s.for_each([&](std::string_view k, const Entry&) { got.emplace(k); });
  if (got != want) return "keys differ from state " + std::to_string(n);
  if (value_of(s, "step") != std::make_pair(n, int64_t{0})) return "step differs";
  for (int64_t i = std::max<int64_t>(1, n - kWindow + 1); i <= n; ++i)
    if (value_of(s, "k/" + std::to_string(i)) != std::make_pair(i, 7 * i))
      return "k/" + std::to_string(i) + " differs";
  for (int64_t i = 1; i <= n - kWindow; ++i)
    if (s.find("k/" + std::to_string(i))) return "erased k/" + std::to_string(i) + " is found";
  auto bad = s.verify();
  if (!bad.empty()) return "verify: " + bad[0];
  return "";
}

uint64_t allocated_bytes(const fs::path& file) {
  struct stat st {};
  ::stat(file.c_str(), &st);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// Raw access to a format-4 directory file for crafting damage.
struct RawDirectory {
  fs::path file;
  DirHeader header{};
  explicit RawDirectory(const fs::path& keys) : file(keys) {
    std::ifstream f(keys, std::ios::binary);
    DirHeader h[2];
    f.read(reinterpret_cast<char*>(&h[0]), sizeof h[0]);
    f.seekg(static_cast<std::streamoff>(kHeaderCopyOffset[1]));
    f.read(reinterpret_cast<char*>(&h[1]), sizeof h[1]);
    header = h[1].generation > h[0].generation ? h[1] : h[0];
  }
  uint64_t entry(uint64_t position) const {
    std::ifstream f(file, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(index_entry_offset(position)));
    uint64_t e = 0;
    f.read(reinterpret_cast<char*>(&e), sizeof e);
    return e;
  }
  void set_entry(uint64_t position, uint64_t e) const {
    std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(index_entry_offset(position)));
    f.write(reinterpret_cast<const char*>(&e), sizeof e);
  }
  std::vector<uint64_t> used_positions() const {
    std::vector<uint64_t> out;
    for (uint64_t p = 0; p < header.slot_count; ++p)
      if (entry(p)) out.push_back(p);
    return out;
  }
  std::optional<uint64_t> empty_position() const {
    for (uint64_t p = 0; p < header.slot_count; ++p)
      if (!entry(p)) return p;
    return std::nullopt;
  }
};

TEST(KeyIndex, NewKeysTakeSlotsInCreationOrder) {
  TempDir t;
  auto s = Store::create(t / "s", {}, opts(4, 64));
  std::vector<std::string> created;
  for (int i = 0; i < 20; ++i) {
    created.push_back("key/" + std::to_string((i * 7919) % 1000));
    put_value(*s, created.back(), i, i);
    if (i == 9) s->commit();
  }
  EXPECT_EQ(s->info().slots_used, 10u) << "committed slots only";
  EXPECT_EQ(keys_in_slot_order(*s), created) << "staged new keys follow the committed ones";
  s->commit();
  EXPECT_EQ(s->info().format_version, 4u);
  EXPECT_EQ(s->info().slots_used, 20u);
  auto r = Store::open(t / "s", OpenMode::ReadOnly, opts(4, 64));
  EXPECT_EQ(keys_in_slot_order(*r), created);
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(value_of(*r, created[i]), std::make_pair(int64_t{i}, int64_t{i}));
  EXPECT_TRUE(r->verify().empty());
}

TEST(KeyIndex, ACommitOfManyNewKeysWritesFewDirectoryPages) {
  TempDir t;
  uint64_t allocated[2];
  for (int format : {3, 4}) {
    fs::path dir = t / ("f" + std::to_string(format));
    auto s = Store::create(dir, {}, opts(format, 16384));
    for (int i = 0; i < 2000; ++i) put_value(*s, "k" + std::to_string(i), i, i);
    s->commit();
    allocated[format - 3] = allocated_bytes(dir / kDirectoryFile);
    EXPECT_EQ(s->info().format_version, static_cast<uint32_t>(format));
  }
  // Format 3 scatters 2,000 keys over 24,576 slots (most of their pages); format 4 writes
  // 2,000 contiguous versions and the index.
  EXPECT_LT(allocated[1] * 3, allocated[0])
      << "format 4 " << allocated[1] << " bytes, format 3 " << allocated[0];
  EXPECT_LT(allocated[1], uint64_t{2} << 20);
}

class KeyChurn : public ::testing::TestWithParam<int> {};

TEST_P(KeyChurn, ErasedSlotsAreTakenByOtherKeysSoChurnNeverFillsTheDirectory) {
  TempDir t;
  const int format = GetParam();
  auto s = Store::create(t / "s", {}, opts(format, 8));  // 16 slots
  for (int64_t n = 1; n <= 300; ++n) {
    write_churn(*s, n);
    s->commit();
    if (n % 50 == 0) {
      ASSERT_EQ(churn_differs(*s, n), "") << "state " << n;
    }
  }
  EXPECT_LE(s->info().slots_used, s->info().slot_count);
  s.reset();
  auto w =
      Store::open(t / "s", OpenMode::ReadWrite, opts(format, 8));  // checks the whole directory
  EXPECT_EQ(churn_differs(*w, 300), "");
  EXPECT_EQ(w->info().format_version, static_cast<uint32_t>(format));
}

INSTANTIATE_TEST_SUITE_P(Formats, KeyChurn, ::testing::Values(3, 4));

class KeyIndexReaders : public ::testing::TestWithParam<int> {};

TEST_P(KeyIndexReaders, AReaderKeepsItsGenerationWhileKeysAreCreatedAndSlotsReused) {
  TempDir t;
  const int format = GetParam();
  {
    auto w = Store::create(t / "s", {}, opts(format, 64));
    for (int64_t n = 1; n <= 10; ++n) {
      write_churn(*w, n);
      w->commit();
    }
  }
  auto reader = Store::open(t / "s", OpenMode::ReadOnly, opts(format, 64));
  ASSERT_EQ(churn_differs(*reader, 10), "");
  auto w = Store::open(t / "s", OpenMode::ReadWrite, opts(format, 64));
  for (int64_t n = 11; n <= 400; ++n) {
    write_churn(*w, n);
    if (n % 3 == 0) put_value(*w, "wide/" + std::to_string(n % 40), n, n);  // up to 40 more keys
    w->commit();
    if (n % 37 == 0) {
      ASSERT_EQ(churn_differs(*reader, 10), "") << "reader at 10, writer at " << n;
    }
  }
  EXPECT_EQ(churn_differs(*reader, 10), "");
  EXPECT_FALSE(reader->find("wide/3"));
  EXPECT_TRUE(reader->refresh());
  EXPECT_EQ(value_of(*reader, "step"), std::make_pair(int64_t{400}, int64_t{0}));
  EXPECT_EQ(value_of(*reader, "k/400"), std::make_pair(int64_t{400}, int64_t{2800}));
  EXPECT_TRUE(reader->find("wide/39"));
}

INSTANTIATE_TEST_SUITE_P(Formats, KeyIndexReaders, ::testing::Values(3, 4));

// A writer process doing churn commits (keys created, erased, slots taken over) is SIGKILLed at
// random instants; after each kill the store holds exactly the last committed state, by content,
// and the next writer continues from it.
TEST(KeyIndex, AKilledWriterLeavesTheLastCommittedState) {
  TempDir t;
  {
    auto w = Store::create(t / "s", {}, opts(4, 8));
    write_churn(*w, 1);
    w->commit();
  }
  std::mt19937 rng(7);
  int64_t last = 1;
  int advanced = 0, later = 0;  // kills after several commits: state advanced by 2 or more
  testing::KillRounds rounds(150, 1000);  // 150 kills inside a commit
  while (rounds.more()) {
    const int round = rounds.rounds();
    testing::Child writer = testing::Child::fork(
        [&] {
          auto w = Store::open(t / "s", OpenMode::ReadWrite, opts(4, 8));
          int64_t n = value_of(*w, "step")->first;
          testing::report("ready", n);
          for (++n;; ++n) {
            testing::report("begin", n);
            write_churn(*w, n);
            w->commit();
            testing::report("done", n);
          }
        },
        "writer");
    auto ready = writer.wait_for("ready");
    ASSERT_TRUE(ready) << "round " << round << ": the writer never opened the store";
    ASSERT_EQ(ready->value, last) << "round " << round << ": the writer opened another state";
    // Killed in its 1st-4th commit, at a random instant of a window that starts when it began.
    const int begun = 1 + static_cast<int>(rng() % 4);
    later += begun >= 3;
    ASSERT_TRUE(writer.wait_for("begin", begun)) << "round " << round;
    for (auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(rng() % 3000);
         std::chrono::steady_clock::now() < end;) {
    }
    const testing::Killed k = writer.kill();
    ASSERT_TRUE(k.signaled) << "round " << round << ": the writer exited with " << k.code;
    rounds.count(k);
    const int64_t reported = k.last_done.value_or(last);
    auto w = Store::open(t / "s", OpenMode::ReadWrite, opts(4, 8));
    const int64_t now = value_of(*w, "step")->first;
    // The commit begun last may have landed before the kill.
    ASSERT_TRUE(now == reported || (k.mid_operation && now == reported + 1))
        << "round " << round << ": state " << now << ", reported " << reported;
    ASSERT_EQ(churn_differs(*w, now), "") << "round " << round;
    advanced += now > last + 1;
    last = now;
  }
  EXPECT_GE(advanced, later)
      << "kills after the 3rd or 4th begun commit find 2 or more of them committed";
}

TEST(KeyIndex, DamageToTheIndexIsReportedAndAWriterRefusesTheStore) {
  TempDir t;
  {
    auto w = Store::create(t / "ref", {}, opts(4, 16));  // 32 positions: keys share probe paths
    for (int i = 0; i < 14; ++i) put_value(*w, "k" + std::to_string(i), i, i);
    w->commit();
  }
  int n = 0;
  auto damaged = [&](auto edit) {
    fs::path p = t / ("c" + std::to_string(n++));
    fs::copy(t / "ref", p, fs::copy_options::recursive);
    RawDirectory raw(p / kDirectoryFile);
    edit(raw);
    return p;
  };
  auto expect_reported = [&](const fs::path& p, const std::string& what, const std::string& label) {
    auto reader = Store::open(p, OpenMode::ReadOnly, opts(4, 16));
    auto problems = reader->verify();
    ASSERT_FALSE(problems.empty()) << label;
    EXPECT_NE(problems[0].find(what), std::string::npos) << label << ": " << problems[0];
    try {
      Store::open(p, OpenMode::ReadWrite, opts(4, 16));
      ADD_FAILURE() << label << ": a writer opened a directory whose index is damaged";
    } catch (const CorruptionError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << label << ": " << e.what();
    }
  };
  expect_reported(damaged([](RawDirectory& d) { d.set_entry(d.used_positions()[3], 0); }),
                  "index entries lost", "an entry zeroed");
  expect_reported(damaged([](RawDirectory& d) {
                    d.set_entry(*d.empty_position(), d.entry(d.used_positions()[0]));
                  }),
                  "both name slot", "an entry duplicated");
  expect_reported(
      damaged([](RawDirectory& d) { d.set_entry(*d.empty_position(), d.header.slot_count + 5); }),
      "past the", "an entry past the slots");
  // An entry moved off its key's probe path: to an empty position after an empty one that is
  // not its key's home.
  expect_reported(damaged([](RawDirectory& d) {
                    const uint64_t mask = d.header.slot_count - 1;
                    const uint64_t p = d.used_positions()[0], e = d.entry(p);
                    const SlotLayout layout =
                        slot_layout(d.header.format_version, d.header.slot_count);
                    SlotRecord r;
                    std::ifstream f(d.file, std::ios::binary);
                    f.seekg(static_cast<std::streamoff>(layout.offset(e - 1, 0)));
                    f.read(reinterpret_cast<char*>(&r), sizeof r);
                    uint64_t q = 0;
                    while (d.entry(q) || d.entry((q - 1) & mask) || q == (r.key_hash & mask)) ++q;
                    d.set_entry(p, 0);
                    d.set_entry(q, e);
                  }),
                  "index", "an entry moved");
}

// What a commit killed before its header leaves: index entries and slot versions of a newer
// generation. Readers ignore them; a writer's open clears them and hands the slots out again.
TEST(KeyIndex, EntriesOfAnUncommittedCommitAreIgnoredAndCleared) {
  TempDir t;
  {
    auto w = Store::create(t / "s", {}, opts(4, 16));
    for (int i = 0; i < 5; ++i) put_value(*w, "k" + std::to_string(i), i, i);
    w->commit();
  }
  // Build the uncommitted commit's bytes in a copy, then graft its key directory, without the
  // header pages, onto the original.
  fs::copy(t / "s", t / "next", fs::copy_options::recursive);
  {
    auto w = Store::open(t / "next", OpenMode::ReadWrite, opts(4, 16));
    for (int i = 5; i < 9; ++i) put_value(*w, "k" + std::to_string(i), i, i);
    w->commit();
  }
  std::ifstream in(t / "next" / kDirectoryFile, std::ios::binary);
  std::string next((std::istreambuf_iterator<char>(in)), {});
  {
    std::fstream f(t / "s" / kDirectoryFile, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(kIndexOffset));
    f.write(next.data() + kIndexOffset, static_cast<std::streamsize>(next.size() - kIndexOffset));
  }
  fs::copy_file(t / "next" / kArenaFile, t / "s" / kArenaFile,
                fs::copy_options::overwrite_existing);
  {
    auto reader = Store::open(t / "s", OpenMode::ReadOnly, opts(4, 16));
    EXPECT_EQ(reader->info().slots_used, 5u);
    EXPECT_FALSE(reader->find("k7")) << "an uncommitted key";
    EXPECT_EQ(value_of(*reader, "k4"), std::make_pair(int64_t{4}, int64_t{4}));
    EXPECT_TRUE(reader->verify().empty());
  }
  auto w = Store::open(t / "s", OpenMode::ReadWrite, opts(4, 16));
  EXPECT_EQ(RawDirectory(t / "s" / kDirectoryFile).used_positions().size(), 5u)
      << "the writer cleared them";
  put_value(*w, "other", 1, 2);
  w->commit();
  EXPECT_EQ(w->info().slots_used, 6u);
  EXPECT_FALSE(w->find("k7"));
  EXPECT_EQ(value_of(*w, "other"), std::make_pair(int64_t{1}, int64_t{2}));
  EXPECT_TRUE(w->verify().empty());
}

TEST(KeyIndex, AFormat3StoreKeepsItsLayoutAndCompactionRewritesItInFormat4) {
  TempDir t;
  {
    auto w = Store::create(t / "s", {}, opts(3, 16));
    for (int64_t n = 1; n <= 20; ++n) {
      write_churn(*w, n);
      w->commit();
    }
    EXPECT_EQ(fs::file_size(t / "s" / kDirectoryFile), kSlotsOffset + 32 * 1024)
        << "format 3 has no index";
  }
  auto reader = Store::open(t / "s", OpenMode::ReadOnly, opts(3, 16));
  EXPECT_EQ(reader->info().format_version, 3u);
  EXPECT_EQ(churn_differs(*reader, 20), "");
  tdstore::compact(t / "s", {});
  ASSERT_TRUE(reader->refresh());
  EXPECT_EQ(reader->info().format_version, 4u);
  EXPECT_EQ(churn_differs(*reader, 20), "");
  EXPECT_EQ(reader->info().slots_used, static_cast<uint64_t>(kWindow + 1));
  EXPECT_THROW(Store::create(t / "bad", {}, opts(5, 16)), Error);
}

}  // namespace
}  // namespace tdstore::storage
