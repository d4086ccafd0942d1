// The Loader's worker pipeline on its own (src/batch_pipeline.h), torch-free so that build-san
// runs it under ASan, UBSan and clang's thread-safety analysis: batches delivered in order
// whatever order workers finish in, at most `claimed_ahead` claimed past the consumer, the
// first error rethrown to the consumer, and every wait ended by stop(). No assertion depends on
// timing: orders are observed through counters the threads advance.
#include "src/batch_pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tdstore::detail {
namespace {

TEST(BatchPipeline, WorkersFinishingInAnyOrderDeliverEveryBatchOnceInOrder) {
  constexpr int64_t kBatches = 2000;
  BatchPipeline<std::string> p;
  p.reset(0, kBatches, 3);
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w)
    workers.emplace_back([&p, w] {
      while (const auto b = p.claim()) {
        if ((*b + w) % 3 == 0) std::this_thread::yield();  // some finish later than others
        p.put(*b, "batch " + std::to_string(*b));
      }
    });
  for (int64_t b = 0; b < kBatches; ++b) ASSERT_EQ(p.take(b), "batch " + std::to_string(b));
  for (auto& t : workers) t.join();  // every claim after the last batch returned nullopt
}

TEST(BatchPipeline, NoMoreThanClaimedAheadBatchesAreClaimedPastTheConsumer) {
  BatchPipeline<int> p;
  p.reset(0, 10, 2);
  std::atomic<int> step{0}, third_claim_at{-1}, claims{0};
  std::thread worker([&] {
    for (int i = 0; i < 3; ++i) {
      const auto b = p.claim();
      ASSERT_TRUE(b.has_value());
      EXPECT_EQ(*b, i);
      if (i == 2) third_claim_at = step++;
      ++claims;
    }
  });
  while (claims.load() < 2) std::this_thread::yield();
  p.put(0, 0);
  const int take_at = step++;
  EXPECT_EQ(p.take(0), 0);  // now batch 2 is within two of the consumer
  worker.join();
  EXPECT_GT(third_claim_at.load(), take_at) << "batch 2 was claimed before batch 0 was taken";
  p.stop();
}

TEST(BatchPipeline, TheFirstErrorIsWhatTheConsumerSees) {
  BatchPipeline<int> p;
  p.reset(0, 4, 2);
  p.put(1, 1);
  p.fail(std::make_exception_ptr(std::runtime_error("first")));
  p.fail(std::make_exception_ptr(std::runtime_error("second")));
  try {
    p.take(0);
    FAIL() << "take returned without the error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first");
  }
  EXPECT_THROW(p.wait_filled(0), std::runtime_error);  // a gather waiting for a window too
  p.reset(0, 4, 2);                                    // a new epoch forgets it
  p.put(0, 7);
  EXPECT_EQ(p.take(0), 7);
}

TEST(BatchPipeline, StopEndsEveryWait) {
  BatchPipeline<int> p;
  p.reset(0, 100, 1);
  ASSERT_EQ(p.claim(), std::optional<int64_t>(0));
  std::atomic<int> ended{0};
  std::vector<std::thread> waiters;
  waiters.emplace_back([&] {  // one ahead of the consumer: waits
    EXPECT_FALSE(p.claim().has_value());
    ++ended;
  });
  waiters.emplace_back([&] {
    EXPECT_FALSE(p.wait_filled(5));
    ++ended;
  });
  waiters.emplace_back([&] {
    EXPECT_FALSE(p.wait_for_consumer([](int64_t consumed) { return consumed >= 50; }));
    ++ended;
  });
  waiters.emplace_back([&] {
    EXPECT_FALSE(p.wait_all_taken());
    ++ended;
  });
  p.stop();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(ended.load(), 4);
}

TEST(BatchPipeline, TheReadAheadSideFollowsTheConsumerAndTheWindowsCopied) {
  BatchPipeline<int> p;
  p.reset(2, 4, 1);  // resumed at batch 2 of 4
  int64_t seen = -1;
  EXPECT_TRUE(p.wait_for_consumer([&](int64_t consumed) { return (seen = consumed) >= 2; }));
  EXPECT_EQ(seen, 2);
  std::thread reader([&] {
    EXPECT_TRUE(p.wait_for_consumer([](int64_t consumed) { return consumed >= 3; }));
    p.filled(0);
    EXPECT_TRUE(p.wait_all_taken());
  });
  p.took(2);  // the consumer gathered batch 2 itself
  EXPECT_TRUE(p.wait_filled(0));
  p.took(3);
  reader.join();
  EXPECT_TRUE(p.wait_all_taken());
}

}  // namespace
}  // namespace tdstore::detail
