// The writer's arena allocator on its own (storage/arena_allocator.h): extents from the tail
// without reuse; with reuse, from free runs once no reader can see them, cut one after the
// other from a run taken whole; a view's pages shared by nothing allocated later; commit and
// rollback moving what the transaction retired and took; a group undone; the arena's limit.
#include "storage/arena_allocator.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "storage/format.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace arena_allocator_test {

constexpr uint64_t P = kPageSize;

struct Harness {
  uint64_t oldest = 0;  // the oldest generation a reader reads
  std::vector<std::pair<uint64_t, uint64_t>> taken;
  std::shared_ptr<ExtentPins> pins = std::make_shared<ExtentPins>();
  std::unique_ptr<ArenaAllocator> make(uint64_t tail, uint64_t limit, bool reuse) {
    ArenaAllocator::Setup s;
    s.where = "/s";
    s.tail = tail;
    s.limit = limit;
    if (reuse) s.free = std::make_unique<FreeSpace>();
    s.oldest_reader = [this] { return oldest; };
    s.pins = pins;
    s.taken = [this](uint64_t o, uint64_t n) { taken.emplace_back(o, n); };
    return std::make_unique<ArenaAllocator>(std::move(s));
  }
};

TEST(ArenaAllocator, WithoutReuseExtentsComeFromTheTailUpToTheLimit) {
  Harness h;
  auto a = h.make(P, 4 * P, false);
  EXPECT_EQ(a->allocate(10, 64), P);
  EXPECT_EQ(a->allocate(10, 64), P + 64);  // aligned
  EXPECT_EQ(a->tail(), P + 74);
  a->retire(P, 10);
  a->committed(1);
  EXPECT_EQ(a->tail(), 2 * P) << "the next commit starts on a fresh page";
  EXPECT_EQ(a->free_and_pending(5), (std::pair<uint64_t, uint64_t>{0, 0})) << "nothing reused";
  try {
    a->allocate(2 * P + 1, 64);
    FAIL() << "past the limit";
  } catch (const CapacityError& e) {
    EXPECT_NE(std::string(e.what()).find("/s: arena full"), std::string::npos) << e.what();
  }
  EXPECT_EQ(a->allocate(2 * P, 64), 2 * P) << "a failed allocation takes nothing";
}

TEST(ArenaAllocator, FreedSpaceIsReusedOnceNoReaderSeesItCutFromOneRun) {
  Harness h;
  auto a = h.make(P, 64 * P, true);
  const uint64_t x = a->allocate(4 * P, 64);  // generation 1 writes x
  a->committed(1);
  a->retire(x, 4 * P);  // generation 2 replaces it
  const uint64_t y = a->allocate(4 * P, 64);
  EXPECT_NE(y, x);
  a->committed(2);
  h.oldest = 1;  // a reader still reads generation 1: x is pending
  EXPECT_EQ(a->free_and_pending(h.oldest).second, 4 * P);
  EXPECT_GE(a->allocate(P, 64), y + 4 * P) << "x is not handed out while a reader sees it";
  a->committed(3);
  h.oldest = 3;  // the reader moved on
  const uint64_t first = a->allocate(100, 64), second = a->allocate(100, 64);
  EXPECT_EQ(first, x);
  EXPECT_EQ(second, x + 128) << "cut from the same run, aligned";
  ASSERT_EQ(h.taken.size(), 1u) << "one run taken, told once";
  EXPECT_EQ(h.taken[0].first, x);
  // A view of `second`: nothing allocated later shares its page.
  a->note_view(second, 100);
  EXPECT_EQ(a->exposed_end(), second + 100);
  EXPECT_EQ(a->allocate(100, 64), x + P);
}

TEST(ArenaAllocator, ARollbackGivesBackTheTailButNotAnExposedPage) {
  Harness h;
  auto a = h.make(P, 64 * P, true);
  a->allocate(10, 64);
  a->committed(1);  // committed arena end: P + 10, tail 2P
  const uint64_t staged = a->allocate(3 * P, 64), other = a->allocate(3 * P, 64);
  EXPECT_EQ(staged, 2 * P);
  a->note_view(staged, 3 * P);  // a view of a staged extent outlives the rollback
  a->rolled_back(2, P + 10);
  EXPECT_EQ(a->tail(), 5 * P) << "back to the committed end, but past the exposed pages";
  EXPECT_EQ(other, 5 * P);
  EXPECT_EQ(a->allocate(10, 64), 5 * P) << "other's bytes were never exposed: tail again";
}

TEST(ArenaAllocator, AnUndoneGroupRetiresWhatItAllocatedAndKeepsWhatItDidNotRetire) {
  Harness h;
  auto a = h.make(P, 64 * P, true);
  const uint64_t kept = a->allocate(P, 64);
  a->retire(kept, P);  // retired before the group
  const size_t before = a->retired_count();
  const uint64_t in_group = a->allocate(2 * P, 64);
  a->retire(7 * P, P);  // retired inside the group: staged again by the undo
  a->abort_group(before, {{in_group, 2 * P}});
  EXPECT_EQ(a->retired_count(), before + 1) << "the group's allocation, not its retirement";
  a->committed(1);
  h.oldest = 1;
  EXPECT_EQ(a->free_and_pending(h.oldest), (std::pair<uint64_t, uint64_t>{3 * P, 0}))
      << "kept and the group's extent are free, and nothing else";
}

}  // namespace arena_allocator_test
}  // namespace tdstore::storage
