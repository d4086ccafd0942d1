// FreeSpace and ExtentPins on their own: the free map's union and coalescing, take()'s whole
// pages, release() waiting for old readers and pinned views, trim(); and a random sequence of
// operations checked byte for byte against a plain model.
#include "storage/free_space.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "storage/format.h"

namespace tdstore::storage {
namespace free_space_test {

constexpr uint64_t P = kPageSize;

TEST(FreeSpace, AddFreeIsAUnionOfCoalescedRuns) {
  FreeSpace f;
  f.add_free(100, 50);
  f.add_free(150, 50);  // adjacent: one run
  f.add_free(120, 40);  // inside: nothing new
  f.add_free(300, 10);
  EXPECT_EQ(f.free_bytes(), 110u);
  EXPECT_EQ(f.free_runs(), (std::map<uint64_t, uint64_t>{{100, 100}, {300, 10}}));
  f.add_free(190, 115);  // bridges both
  EXPECT_EQ(f.free_runs(), (std::map<uint64_t, uint64_t>{{100, 210}}));
  EXPECT_EQ(f.free_bytes(), 210u);
  f.add_free(0, 0);
  EXPECT_EQ(f.free_bytes(), 210u);
}

TEST(FreeSpace, TakeHandsOutTheWholePagesOfTheLowestRunThatFits) {
  FreeSpace f;
  f.add_free(100, 3 * P);     // whole pages [P, 3P): two
  f.add_free(10 * P, 5 * P);  // five, page-aligned
  f.add_free(20 * P + 1, P);  // no whole page
  EXPECT_FALSE(f.take(5 * P + 1)) << "no run holds six whole pages";
  auto t = f.take(3 * P);
  ASSERT_TRUE(t);
  EXPECT_EQ(*t, std::make_pair(10 * P, 5 * P)) << "the lowest run with three pages, all of it";
  t = f.take(1);
  ASSERT_TRUE(t);
  EXPECT_EQ(*t, std::make_pair(P, 2 * P));
  // What is left: the fragments around the pages taken.
  EXPECT_EQ(f.free_runs(),
            (std::map<uint64_t, uint64_t>{{100, P - 100}, {3 * P, 100}, {20 * P + 1, P}}));
  EXPECT_FALSE(f.take(1)) << "fragments are never handed out";
}

TEST(FreeSpace, ReleaseWaitsForOldReadersAndPinnedViews) {
  FreeSpace f;
  auto pins = std::make_shared<ExtentPins>();
  f.add_pending(0, P, /*freed_at=*/5);
  f.add_pending(4 * P, P, 7);
  f.add_pending(8 * P, P, 5);
  auto view = pins->pin(8 * P, nullptr);
  EXPECT_EQ(f.pending_bytes(), 3 * P);
  f.release(/*oldest=*/4, pins.get());
  EXPECT_EQ(f.free_bytes(), 0u) << "a reader at generation 4 may read them all";
  f.release(6, pins.get());
  EXPECT_EQ(f.free_runs(), (std::map<uint64_t, uint64_t>{{0, P}})) << "8P is pinned, 4P newer";
  view.reset();
  EXPECT_FALSE(pins->held(8 * P));
  f.release(UINT64_MAX, pins.get());
  EXPECT_EQ(f.free_bytes(), 3 * P);
  EXPECT_EQ(f.pending_bytes(), 0u);
}

TEST(FreeSpace, TrimDropsFreeBytesFromTheEnd) {
  FreeSpace f;
  f.add_free(0, 2 * P);
  f.add_free(3 * P, 2 * P);
  f.trim(4 * P);
  EXPECT_EQ(f.free_runs(), (std::map<uint64_t, uint64_t>{{0, 2 * P}, {3 * P, P}}));
  f.trim(P / 2);
  EXPECT_EQ(f.free_runs(), (std::map<uint64_t, uint64_t>{{0, P / 2}}));
  EXPECT_EQ(f.free_bytes(), P / 2);
}

// Random add_free / take / trim against a byte map: the free bytes always agree, runs are
// disjoint, coalesced and counted once, and take() hands out page-aligned bytes that were free.
TEST(FreeSpace, RandomOperationsMatchAByteModel) {
  constexpr uint64_t kSpace = 16 * P;
  std::mt19937_64 rng(7);
  for (int round = 0; round < 10; ++round) {
    FreeSpace f;
    std::vector<bool> free(kSpace, false);
    for (int op = 0; op < 300; ++op) {
      const int kind = static_cast<int>(rng() % 10);
      if (kind < 6) {
        const uint64_t off = rng() % kSpace;
        const uint64_t len = rng() % std::min<uint64_t>(3 * P, kSpace - off);
        f.add_free(off, len);
        for (uint64_t b = off; b < off + len; ++b) free[b] = true;
      } else if (kind < 9) {
        const uint64_t want = 1 + rng() % (4 * P);
        auto t = f.take(want);
        if (t) {
          ASSERT_EQ(t->first % P, 0u);
          ASSERT_EQ(t->second % P, 0u);
          ASSERT_GE(t->second, want);
          for (uint64_t b = t->first; b < t->first + t->second; ++b) {
            ASSERT_TRUE(free[b]) << "took a byte that was not free: " << b;
            free[b] = false;
          }
        }
      } else {
        const uint64_t end = rng() % kSpace;
        f.trim(end);
        for (uint64_t b = end; b < kSpace; ++b) free[b] = false;
      }
      if (op % 10 != 9) continue;  // the byte-for-byte comparison, every tenth operation
      uint64_t model = 0;
      for (bool b : free) model += b;
      ASSERT_EQ(f.free_bytes(), model) << "round " << round << " op " << op;
      uint64_t prev_end = 0, sum = 0;
      bool first = true;
      for (auto [o, l] : f.free_runs()) {
        ASSERT_GT(l, 0u);
        ASSERT_TRUE(first || o > prev_end) << "runs overlap or touch at " << o;
        for (uint64_t b = o; b < o + l; ++b) ASSERT_TRUE(free[b]);
        prev_end = o + l, sum += l, first = false;
      }
      ASSERT_EQ(sum, model);
    }
  }
}

}  // namespace free_space_test
}  // namespace tdstore::storage
