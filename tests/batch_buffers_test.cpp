// BatchBuffers: the loader's reuse of released batch memory.
#include "src/batch_buffers.h"

#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <gtest/gtest.h>

#include <vector>

namespace tdstore::detail {
namespace {

TEST(BatchBuffers, AReleasedBufferOfTheSameSizeIsReused) {
  BatchBuffers pool(4);
  const void* first = nullptr;
  for (int i = 0; i < 100; ++i) {
    at::Tensor t = pool.empty({256, 784}, at::kFloat);
    if (i == 0) first = t.data_ptr();
    EXPECT_EQ(t.data_ptr(), first);
  }
  EXPECT_EQ(pool.allocations(), 1u);
  EXPECT_EQ(pool.free_buffers(), 1u);
}

TEST(BatchBuffers, AHeldBufferIsNeverHandedOutAgain) {
  BatchBuffers pool(4);
  at::Tensor held = pool.empty({64, 3}, at::kLong);
  held.fill_(7);
  {
    at::Tensor view = held.slice(0, 1, 2);  // a view keeps the buffer in use too
    held = at::Tensor();
    for (int i = 0; i < 10; ++i) pool.empty({64, 3}, at::kLong).fill_(-1);
    EXPECT_TRUE(at::equal(view, at::full({1, 3}, 7, at::kLong)));
    EXPECT_EQ(pool.allocations(), 2u);
  }
  EXPECT_EQ(pool.free_buffers(), 2u);
  at::Tensor other = pool.empty({10}, at::kByte);  // another size: a new buffer
  EXPECT_EQ(pool.allocations(), 3u);
}

TEST(BatchBuffers, KeepsAtMostItsBoundAndFreesTheOldest) {
  BatchBuffers pool(3);
  std::vector<at::Tensor> in_use;
  for (int i = 0; i < 8; ++i) in_use.push_back(pool.empty({1000}, at::kFloat));
  EXPECT_EQ(pool.allocations(), 8u);
  in_use.clear();
  EXPECT_EQ(pool.free_buffers(), 3u);
  pool.set_max_free(1);
  EXPECT_EQ(pool.free_buffers(), 1u);
  pool.set_max_free(0);
  at::Tensor t = pool.empty({1000}, at::kFloat);
  t = at::Tensor();
  EXPECT_EQ(pool.free_buffers(), 0u) << "a bound of 0 keeps nothing";
}

TEST(BatchBuffers, TensorsOutliveTheirPool) {
  at::Tensor t, empty;
  {
    BatchBuffers pool(2);
    t = pool.empty({128}, at::kDouble);
    empty = pool.empty({0, 5}, at::kFloat);
    t.fill_(1.5);
  }
  EXPECT_TRUE(at::equal(t, at::full({128}, 1.5, at::kDouble)));
  EXPECT_EQ(empty.numel(), 0);
  t = at::Tensor();  // freed, not returned to the gone pool (ASan would see a leak or misuse)
}

}  // namespace
}  // namespace tdstore::detail
