// The generation a handle reads, on its own (storage/snapshot.h), over a key directory built in
// memory and an arena file: which of a slot's two inline versions is visible, the history walk
// when both are newer, a damaged committed version restored from its arena copy (or reported),
// history pointing outside the arena, and the format-4 key index entries.
#include "storage/snapshot.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "error_message.h"
#include "storage/directory.h"
#include "storage/format.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"
#include "temp_dir.h"

namespace tdstore::storage {
namespace snapshot_test {

// Bytes in memory standing for keys.tdd's mapping.
class Bytes : public Region {
 public:
  explicit Bytes(size_t n) : bytes_(n, '\0') {}
  uint8_t* data() const override { return reinterpret_cast<uint8_t*>(bytes_.data()); }
  size_t size() const override { return bytes_.size(); }

 private:
  mutable std::string bytes_;
};

SlotRecord version(uint64_t generation, uint64_t self, uint64_t prev, uint64_t content) {
  SlotRecord r{};
  r.generation = generation;
  r.self = self;
  r.prev = prev;
  r.state = static_cast<uint8_t>(SlotState::Live);
  r.data_offset = kArenaDataOffset;
  r.content_hash = content;  // tells the versions apart
  r.key_len = 1;
  r.key[0] = 'k';
  seal(r);
  return r;
}

struct Harness {
  testing::TempDir dir;
  std::shared_ptr<Bytes> directory;
  std::shared_ptr<File> arena;
  Snapshot snap;

  // A store of 4 slots in `format`, read at generation g.
  Harness(uint32_t format, uint64_t g) {
    const SlotLayout layout = slot_layout(format, 4);
    directory = std::make_shared<Bytes>(layout.end());
    arena = Env::posix()->open(dir / "arena.tda", Env::Access::Create);
    arena->truncate(64 * kPageSize);
    DirHeader h{};
    h.format_version = format;
    h.generation = g;
    h.slot_count = 4;
    h.arena_end = 64 * kPageSize;
    snap.dir = dir.path();
    snap.directory = directory;
    snap.dir_map = directory->data();
    snap.dir_map_size = directory->size();
    snap.adopt(h);
    snap.arena = arena;
    snap.mapping = std::make_shared<Mapping>(*Env::posix(), *arena, 64 * kPageSize);
  }
  void put_inline(uint64_t slot, int v, const SlotRecord& r) {
    std::memcpy(directory->data() + snap.slot_at(slot, v), &r, sizeof r);
  }
  void put_copy(const SlotRecord& r) { arena->write_at(r.self, &r, sizeof r); }
};

constexpr uint64_t kCopies = 2 * kPageSize;  // where the tests put arena copies

TEST(Snapshot, TheNewestVersionAtOrBelowTheGenerationIsVisible) {
  Harness h(kHashedFormatVersion, 5);
  h.put_inline(0, 0, version(3, kCopies, 0, 30));
  h.put_inline(0, 1, version(5, kCopies + 512, kCopies, 50));
  EXPECT_EQ(h.snap.resolve(0, false)->content_hash, 50u);
  h.put_inline(1, 1, version(6, kCopies + 1024, 0, 60));  // committed after this generation
  EXPECT_FALSE(h.snap.resolve(1, false)) << "a key created after the generation is absent";
  EXPECT_FALSE(h.snap.resolve(2, false)) << "an empty slot";
}

TEST(Snapshot, BothVersionsNewerWalkTheHistoryInTheArena) {
  Harness h(kHashedFormatVersion, 4);
  const SlotRecord g2 = version(2, kCopies, 0, 20), g4 = version(4, kCopies + 512, kCopies, 40),
                   g6 = version(6, kCopies + 1024, g4.self, 60),
                   g7 = version(7, kCopies + 1536, g6.self, 70);
  for (const auto& r : {g2, g4, g6, g7}) h.put_copy(r);
  h.put_inline(0, 0, g6);
  h.put_inline(0, 1, g7);
  EXPECT_EQ(h.snap.resolve(0, false)->content_hash, 40u) << "generation 4's version, via prev";

  SlotRecord loop = version(8, kCopies + 2048, g7.self + 64 * kPageSize, 80);  // past the arena
  h.put_inline(1, 0, loop);
  h.put_inline(1, 1, version(9, kCopies + 2560, loop.self, 90));
  h.put_copy(loop);
  EXPECT_THROW(h.snap.resolve(1, false), CorruptionError);
  EXPECT_NE(testing::message_of([&] {
              h.snap.resolve(1, false);
            }).find("keys.tdd: slot 1 history points outside the arena"),
            std::string::npos);
}

TEST(Snapshot, ADamagedCommittedVersionIsRestoredFromItsArenaCopyOrReported) {
  Harness h(kIndexedFormatVersion, 5);
  const SlotRecord good = version(5, kCopies, 0, 50);
  h.put_copy(good);
  SlotRecord damaged = good;
  damaged.content_hash ^= 1;  // checksum now fails
  h.put_inline(0, 0, damaged);
  bool restored = false;
  auto r = h.snap.resolve(0, false, &restored);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->content_hash, 50u);
  EXPECT_TRUE(restored);

  SlotRecord lost = version(5, kCopies + 512, 0, 51);  // no copy at its self
  lost.content_hash ^= 1;
  h.put_inline(1, 0, lost);
  EXPECT_THROW(h.snap.resolve(1, false), CorruptionError) << "no intact copy";
  EXPECT_NE(testing::message_of([&] {
              h.snap.resolve(1, false);
            }).find("keys.tdd: slot 1 version 0 fails its checksum"),
            std::string::npos);
  // A torn version newer than the generation (a commit in progress) is not damage.
  SlotRecord torn = version(6, kCopies + 1024, 0, 60);
  torn.content_hash ^= 1;
  h.put_inline(2, 0, torn);
  EXPECT_FALSE(h.snap.resolve(2, false));
}

// A reader one generation behind, while the writer overwrites the version it reads: the slot
// holds generation 6 (newer than the reader's 5) and, being rewritten, generation 7 over
// generation 4, whose `self` still names generation 4's arena copy. The reader gets generation
// 4's version and no damage: verify() of a lagging reader reported the slot as damaged
// (Crash.ReadersSeeOnlyCompleteCommits under ASan beside CPU hogs).
TEST(Snapshot, ACommitInProgressIsNoDamageToAReaderThatFellBehind) {
  Harness h(kIndexedFormatVersion, 5);
  const SlotRecord g4 = version(4, kCopies, 0, 40), g6 = version(6, kCopies + 512, g4.self, 60);
  h.put_copy(g4);
  h.put_copy(g6);
  SlotRecord in_progress = g4;  // the writer wrote generation 7's generation field first
  in_progress.generation = 7;
  h.put_inline(0, 0, in_progress);
  h.put_inline(0, 1, g6);
  bool damaged = false;
  auto r = h.snap.resolve(0, false, &damaged);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->content_hash, 40u);
  EXPECT_FALSE(damaged) << "a commit in progress is not damage";
}

TEST(Snapshot, KeyIndexEntriesNameSlotsWithinTheDirectory) {
  Harness h(kIndexedFormatVersion, 1);
  auto set_entry = [&](uint64_t position, uint64_t e) {
    std::memcpy(h.directory->data() + index_entry_offset(position), &e, sizeof e);
  };
  EXPECT_FALSE(h.snap.index_slot(0));
  set_entry(0, 3);  // slot 2
  EXPECT_EQ(h.snap.index_slot(0), 2u);
  set_entry(1, 5);  // slot 4 of 4
  EXPECT_THROW(h.snap.index_slot(1), CorruptionError);
}

}  // namespace snapshot_test
}  // namespace tdstore::storage
