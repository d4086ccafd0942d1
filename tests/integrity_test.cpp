// Damaged stores: a store either opens with exactly its committed state or says what is
// damaged (an error, or verify_structure()/verify() naming it). No libtorch; built under ASan.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "storage/directory.h"
#include "storage/graph_record.h"
#include "storage/store.h"
#include "tdstore/errors.h"
#include "tests/temp_dir.h"

namespace tdstore::storage {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using namespace std::string_literals;

StoreOptions tiny() {
  StoreOptions o;
  o.key_capacity = 16;  // 32 slots: keys share probe chains
  o.arena_reserve = int64_t{1} << 28;
  return o;
}

// What a store holds: every key's dtype, shape and bytes, and every attribute.
struct State {
  std::map<std::string, std::pair<std::vector<int64_t>, std::string>> keys;
  std::map<std::string, std::string> attrs;
  bool operator==(const State&) const = default;
};

State read_state(Store& s) {
  State st;
  std::vector<std::pair<std::string, Entry>> entries;
  s.for_each([&](std::string_view k, const Entry& e) { entries.emplace_back(std::string(k), e); });
  for (auto& [k, e] : entries) {
    auto found = s.find(k);  // by probing, as get() does
    if (!found) throw KeyError("listed key '" + k + "' is not found by lookup");
    const char* p = static_cast<const char*>(s.view(*found).data);
    st.keys[k] = {found->shape, std::string(p, found->nbytes)};
  }
  for (const auto& name : s.attr_names()) st.attrs[name] = *s.get_attr(name);
  return st;
}

void put_bytes(Store& s, const std::string& key, int64_t n, char fill) {
  std::string bytes(static_cast<size_t>(n) * 4, fill);
  s.put(key, DType::Float32, {n}, bytes.data(), bytes.size());
}

// A reference store: keys across probe chains, overwritten with other shapes, an erased key,
// attributes; four generations.
State make_reference(const fs::path& dir) {
  auto s = Store::create(dir, {}, tiny());
  for (int i = 0; i < 10; ++i)
    put_bytes(*s, "k" + std::to_string(i), 4 + i, static_cast<char>('a' + i));
  s->put_attr("source", "reference v1");
  s->commit();
  for (int i = 0; i < 5; ++i)
    put_bytes(*s, "k" + std::to_string(i), 20 + i, static_cast<char>('A' + i));
  s->commit();
  s->erase("k5");
  s->put_attr("note", "k5 erased");
  s->commit();
  put_bytes(*s, "nested/x", 3, 'z');
  s->commit();
  return read_state(*s);
}

void flip_bit(const fs::path& file, uint64_t byte, int bit) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(byte));
  char c;
  f.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(byte));
  f.write(&c, 1);
}

// Outcomes of checking a damaged copy; the rule is violated only by `silent_wrong`.
enum Outcome { kError = 1, kReported = 2, kExact = 3, kSilentWrong = 4 };

// Opens a copy as a reader and then as a writer. Each open must raise an error, or report
// damage, or hold exactly the reference state; a clean verify with other data is the failure.
Outcome check_copy(const fs::path& dir, const State& want, std::string* why) {
  Outcome worst = kExact;
  for (OpenMode mode : {OpenMode::ReadOnly, OpenMode::ReadWrite}) {
    try {
      auto s = Store::open(dir, mode, tiny());
      auto problems = s->verify();
      State got = read_state(*s);
      if (!problems.empty()) {
        worst = std::min(worst, kReported);
        continue;
      }
      if (!(got == want)) {
        *why = std::string(mode == OpenMode::ReadOnly ? "reader" : "writer") +
               ": verify() is clean but the state differs";
        return kSilentWrong;
      }
    } catch (const Error&) {
      worst = std::min(worst, kError);
    }
  }
  return worst;
}

// Where keys.tdd keeps its slot versions (from its first header copy).
SlotLayout layout_of(const fs::path& keys) {
  std::ifstream f(keys, std::ios::binary);
  DirHeader h;
  f.read(reinterpret_cast<char*>(&h), sizeof h);
  return slot_layout(h.format_version, h.slot_count);
}

// Offsets of the used slot versions of keys.tdd (the newest first in each slot).
std::vector<std::pair<uint64_t, uint64_t>> used_versions(const fs::path& keys) {
  std::ifstream f(keys, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  std::vector<std::pair<uint64_t, uint64_t>> out;  // offset, generation
  for (uint64_t off = layout_of(keys).base; off + sizeof(SlotRecord) <= bytes.size();
       off += sizeof(SlotRecord)) {
    SlotRecord r;
    std::memcpy(&r, bytes.data() + off, sizeof r);
    if (record_valid(r)) out.emplace_back(off, r.generation);
  }
  return out;
}

TEST(Integrity, AFlippedBitInTheKeyDirectoryNeverRollsAKeyBack) {
  TempDir t;
  const State want = make_reference(t / "ref");
  auto versions = used_versions(t / "ref" / kDirectoryFile);
  ASSERT_GT(versions.size(), 10u);
  std::mt19937_64 rng(2026);
  int counts[5] = {};
  for (int round = 0; round < 160; ++round) {
    fs::path copy = t / ("c" + std::to_string(round));
    fs::copy(t / "ref", copy, fs::copy_options::recursive);
    auto [off, gen] = versions[rng() % versions.size()];
    uint64_t byte = off + rng() % offsetof(SlotRecord, checksum);
    flip_bit(copy / kDirectoryFile, byte, static_cast<int>(rng() % 8));
    std::string why;
    Outcome o = check_copy(copy, want, &why);
    ++counts[o];
    EXPECT_NE(o, kSilentWrong) << "byte " << byte << " (slot version at " << off << ", generation "
                               << gen << "): " << why;
    fs::remove_all(copy);
  }
  // Most single flips are repaired from the arena copy (exact) or reported.
  EXPECT_EQ(counts[kSilentWrong], 0);
  EXPECT_GT(counts[kExact] + counts[kReported] + counts[kError], 0);
}

TEST(Integrity, ADamagedNewestVersionIsReadFromItsArenaCopyAndReported) {
  TempDir t;
  const State want = make_reference(t / "s");
  // k0 was rewritten at generation 2: damage its newest inline version's shape.
  auto versions = used_versions(t / "s" / kDirectoryFile);
  uint64_t target = 0;
  {
    std::ifstream f(t / "s" / kDirectoryFile, std::ios::binary);
    for (auto [off, gen] : versions) {
      SlotRecord r;
      f.seekg(static_cast<std::streamoff>(off));
      f.read(reinterpret_cast<char*>(&r), sizeof r);
      if (record_key(r) == "k0" && gen == 2) target = off;
    }
  }
  ASSERT_NE(target, 0u);
  flip_bit(t / "s" / kDirectoryFile, target + offsetof(SlotRecord, shape), 1);
  {
    auto reader = Store::open(t / "s", OpenMode::ReadOnly, tiny());
    EXPECT_EQ(read_state(*reader), want) << "never the previous shape";
    auto problems = reader->verify_structure();
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_EQ(problems[0].rfind("/directory/slot ", 0), 0u) << problems[0];
  }
  {
    auto writer = Store::open(t / "s", OpenMode::ReadWrite, tiny());  // rewrites it from the copy
    EXPECT_EQ(read_state(*writer), want);
    EXPECT_TRUE(writer->verify().empty());
  }
  auto again = Store::open(t / "s", OpenMode::ReadOnly, tiny());
  EXPECT_TRUE(again->verify().empty());
  EXPECT_EQ(read_state(*again), want);
}

void zero_bytes(const fs::path& file, uint64_t offset, uint64_t n) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  std::string zeros(n, '\0');
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(zeros.data(), static_cast<std::streamsize>(n));
}

TEST(Integrity, LostSlotsAreReportedAndAWriterRefusesTheStore) {
  TempDir t;
  make_reference(t / "ref");
  const uint64_t slot_count = slot_count_for(16);
  // One zeroed slot of a probe chain, then the whole slot area.
  for (bool all : {false, true}) {
    fs::path copy = t / (all ? "all" : "one");
    fs::copy(t / "ref", copy, fs::copy_options::recursive);
    const SlotLayout layout = layout_of(copy / kDirectoryFile);
    if (all) {
      zero_bytes(copy / kDirectoryFile, layout.base, slot_count * 2 * sizeof(SlotRecord));
    } else {
      const uint64_t slot = layout.slot_of(used_versions(copy / kDirectoryFile)[3].first).first;
      for (int v = 0; v < 2; ++v)
        zero_bytes(copy / kDirectoryFile, layout.offset(slot, v), sizeof(SlotRecord));
    }
    auto reader = Store::open(copy, OpenMode::ReadOnly, tiny());  // O(1): no scan
    auto problems = reader->verify();
    ASSERT_FALSE(problems.empty()) << (all ? "slot area zeroed" : "one slot zeroed");
    EXPECT_EQ(problems[0].rfind("/directory: the header counts", 0), 0u) << problems[0];
    try {
      Store::open(copy, OpenMode::ReadWrite, tiny());
      FAIL() << "a writer must not open a directory that lost slots";
    } catch (const CorruptionError& e) {
      EXPECT_NE(std::string(e.what()).find("slots lost or altered"), std::string::npos) << e.what();
    }
  }
}

TEST(Integrity, ALostOrTruncatedCatalogIsCorruption) {
  TempDir t;
  make_reference(t / "ref");
  {
    fs::copy(t / "ref", t / "no_data", fs::copy_options::recursive);
    fs::remove(t / "no_data" / kCatalogDir / "data.mdb");
    for (OpenMode mode : {OpenMode::ReadOnly, OpenMode::ReadWrite})
      EXPECT_THROW(Store::open(t / "no_data", mode, tiny()), CorruptionError);
  }
  {
    fs::copy(t / "ref", t / "no_dir", fs::copy_options::recursive);
    fs::remove_all(t / "no_dir" / kCatalogDir);
    for (OpenMode mode : {OpenMode::ReadOnly, OpenMode::ReadWrite})
      EXPECT_THROW(Store::open(t / "no_dir", mode, tiny()), CorruptionError);
  }
  {
    fs::copy(t / "ref", t / "short", fs::copy_options::recursive);
    auto data = t / "short" / kCatalogDir / "data.mdb";
    fs::resize_file(data, fs::file_size(data) / 2 - 1);
    for (OpenMode mode : {OpenMode::ReadOnly, OpenMode::ReadWrite})
      EXPECT_THROW(Store::open(t / "short", mode, tiny()), CorruptionError);
  }
}

// Rewrites a header copy or slot version with a valid checksum after `edit`.
template <class R, class F>
void craft(const fs::path& file, uint64_t offset, F edit) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  R r;
  f.seekg(static_cast<std::streamoff>(offset));
  f.read(reinterpret_cast<char*>(&r), sizeof r);
  edit(r);
  seal(r);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(&r), sizeof r);
}

// The header copy holding the committed generation.
uint64_t live_header(const fs::path& keys) {
  std::ifstream f(keys, std::ios::binary);
  DirHeader h[2];
  f.read(reinterpret_cast<char*>(&h[0]), sizeof h[0]);
  f.seekg(static_cast<std::streamoff>(kHeaderCopyOffset[1]));
  f.read(reinterpret_cast<char*>(&h[1]), sizeof h[1]);
  return h[1].generation > h[0].generation ? kHeaderCopyOffset[1] : kHeaderCopyOffset[0];
}

TEST(Integrity, CraftedValuesWithValidChecksumsAreErrorsNeverCrashes) {
  TempDir t;
  make_reference(t / "ref");
  int n = 0;
  auto fresh = [&] {
    fs::path p = t / ("c" + std::to_string(n++));
    fs::copy(t / "ref", p, fs::copy_options::recursive);
    return p;
  };
  auto opens_and_reads = [](const fs::path& p) {
    auto s = Store::open(p, OpenMode::ReadOnly, tiny());
    read_state(*s);
    s->verify();
  };
  {  // slot_count whose byte size overflows
    auto p = fresh();
    craft<DirHeader>(p / kDirectoryFile, live_header(p / kDirectoryFile),
                     [](DirHeader& h) { h.slot_count = uint64_t{1} << 54; });
    EXPECT_THROW(opens_and_reads(p), CorruptionError);
  }
  {  // a negative batch size
    auto p = fresh();
    craft<DirHeader>(p / kDirectoryFile, live_header(p / kDirectoryFile), [](DirHeader& h) {
      h.batch_ndim = 1;
      h.batch_size[0] = -3;
    });
    EXPECT_THROW(opens_and_reads(p), CorruptionError);
  }
  auto versions = used_versions(t / "ref" / kDirectoryFile);
  auto newest_of = [&](const fs::path& p, const std::string& key) {
    std::ifstream f(p / kDirectoryFile, std::ios::binary);
    uint64_t best = 0, best_gen = 0;
    for (auto [off, gen] : versions) {
      SlotRecord r;
      f.seekg(static_cast<std::streamoff>(off));
      f.read(reinterpret_cast<char*>(&r), sizeof r);
      if (record_key(r) == key && gen > best_gen) best = off, best_gen = gen;
    }
    return best;
  };
  {  // an extent whose end wraps past 2^64
    auto p = fresh();
    craft<SlotRecord>(p / kDirectoryFile, newest_of(p, "k7"),
                      [](SlotRecord& r) { r.data_offset = UINT64_MAX - 8; });
    EXPECT_THROW(opens_and_reads(p), CorruptionError);
  }
  {  // a key length past the record
    auto p = fresh();
    craft<SlotRecord>(p / kDirectoryFile, newest_of(p, "k8"),
                      [](SlotRecord& r) { r.key_len = 600; });
    EXPECT_THROW(opens_and_reads(p), CorruptionError);
  }
  {  // a history pointer near 2^64, and one pointing to itself, read by a reader behind both
    for (uint64_t prev : {UINT64_MAX - 100, uint64_t{0}}) {
      auto p = fresh();
      auto reader = Store::open(p, OpenMode::ReadOnly, tiny());  // at generation 4
      {
        auto w = Store::open(p, OpenMode::ReadWrite, tiny());
        for (int i = 0; i < 2; ++i) {
          put_bytes(*w, "k9", 2 + i, 'q');
          w->commit();
        }
      }
      uint64_t off = newest_of(p, "k9");
      // The older inline version of k9's slot (generation 5) is what the reader walks from.
      const SlotLayout layout = layout_of(p / kDirectoryFile);
      auto [slot, version] = layout.slot_of(off);
      uint64_t older = layout.offset(slot, 1 - version);
      craft<SlotRecord>(p / kDirectoryFile, older,
                        [prev](SlotRecord& r) { r.prev = prev ? prev : r.self; });
      EXPECT_THROW(reader->find("k9"), CorruptionError) << "prev " << prev;
    }
  }
}

TEST(Integrity, AttributeNamesLongerThanTheCatalogHoldsAreRefusedWhenGiven) {
  TempDir t;
  auto s = Store::create(t / "s", {}, tiny());
  put_bytes(*s, "x", 2, 'x');
  EXPECT_THROW(s->put_attr(std::string(600, 'n'), "v"), KeyError);
  s->commit();  // the staged tensor is not lost
  EXPECT_TRUE(s->find("x"));
  EXPECT_EQ(s->generation(), 1u);
}

// One round: flip a random bit of a random file of a copy in a child process (a crash is a
// distinct status), and check the rule there.
TEST(Integrity, RandomBitFlipsInEveryFileAreFoundOrHarmless) {
  TempDir t;
  const State want = make_reference(t / "ref");
  std::vector<fs::path> files = {kDirectoryFile, kArenaFile, fs::path(kCatalogDir) / "data.mdb"};
  std::mt19937_64 rng(77);
  int rounds =
      std::getenv("TDSTORE_FLIP_ROUNDS") ? std::atoi(std::getenv("TDSTORE_FLIP_ROUNDS")) : 300;
  int outcomes[5] = {};
  for (int round = 0; round < rounds; ++round) {
    fs::path copy = t / ("r" + std::to_string(round));
    fs::copy(t / "ref", copy, fs::copy_options::recursive);
    const fs::path& file = files[rng() % files.size()];
    uint64_t size = fs::file_size(copy / file);
    uint64_t byte = rng() % size;
    int bit = static_cast<int>(rng() % 8);
    flip_bit(copy / file, byte, bit);
    pid_t pid = fork();
    if (pid == 0) {
      std::string why;
      _exit(10 + check_copy(copy, want, &why));
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status))
        << file << " byte " << byte << " bit " << bit << ": the check crashed (signal "
        << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ")";
    int o = WEXITSTATUS(status) - 10;
    ASSERT_TRUE(o >= kError && o <= kSilentWrong)
        << "the child never ran the check: status " << status;
    ++outcomes[o];
    EXPECT_NE(o, kSilentWrong) << file << " byte " << byte << " bit " << bit;
    fs::remove_all(copy);
  }
  EXPECT_EQ(outcomes[kSilentWrong], 0);
}

// The compiled-graph record framing: every way its bytes can be wrong is a CorruptionError
// naming the record, and a frame header's size claim is checked before anything is allocated.
TEST(Integrity, GraphRecordFramingIsCheckedBeforeItIsTrusted) {
  nlohmann::json meta = {{"prefix", ""}, {"observations", nlohmann::json::array()}};
  std::string module(5000, 'm');
  std::string good = encode_graph_record(meta, module);
  auto back = decode_graph_record(good, "graph/f");
  EXPECT_EQ(back.meta, meta);
  EXPECT_EQ(back.module, module);

  auto fails = [](std::string_view value, const std::string& what) {
    try {
      decode_graph_record(value, "graph/f/k");
      ADD_FAILURE() << "accepted: " << what;
    } catch (const CorruptionError& e) {
      EXPECT_NE(std::string(e.what()).find("graph/f/k"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  fails(good.substr(0, 3), "truncated");
  std::string overrun = good;
  overrun[3] = '\x7f';  // meta length ~2 GiB
  fails(overrun, "overruns");
  std::string bad_json = good;
  bad_json[4] = '[';
  fails(bad_json, "not valid JSON");
  fails(encode_graph_record(meta, module).substr(0, good.size() - 1), "not a whole zstd frame");
  fails(good + "x", "bytes follow");
  std::string not_object = "\x02\0\0\0[]"s + good.substr(4 + meta.dump().size());
  fails(not_object, "not a JSON object");
  // A frame whose header claims 2^40 bytes, holding one empty raw block.
  std::string frame = "\x28\xb5\x2f\xfd\xe0"s + std::string("\0\0\0\0\0\x01\0\0", 8) + "\x01\0\0"s;
  std::string meta_text = meta.dump();
  uint32_t n = static_cast<uint32_t>(meta_text.size());
  std::string huge(reinterpret_cast<const char*>(&n), 4);
  fails(huge + meta_text + frame, "claims 1099511627776 bytes");
  frame[10] = '\0';
  frame[8] = '\x01';  // 2^24 bytes: under the limit, but more than 16 bytes of blocks can hold
  fails(huge + meta_text + frame, "claims 16777216 bytes, more than its 16 bytes can hold");
  std::string flipped = good;
  flipped[flipped.size() - 10] ^= 0x40;
  EXPECT_THROW(decode_graph_record(flipped, "graph/f/k"), CorruptionError);
  EXPECT_THROW(encode_graph_record(nlohmann::json::array(), module), Error);
}

// verify() decodes each graph record's framing: damage inside a well-framed catalog value is
// reported, not left for a loader to stumble on.
TEST(Integrity, VerifyReportsAGraphRecordWhoseFramingIsDamaged) {
  TempDir t;
  auto s = Store::create(t / "s", {2}, tiny());
  s->commit();
  s->put_cache("graph/f/0/1.13.0/00", encode_graph_record({{"prefix", ""}}, "archive"));
  EXPECT_TRUE(s->verify().empty());
  s->put_cache("graph/f/0/1.13.0/01", "\x01\0\0\0{"s);
  auto bad = s->verify();
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].rfind("/catalog/graph/f/0/1.13.0/01: ", 0), 0u) << bad[0];
}

}  // namespace
}  // namespace tdstore::storage
