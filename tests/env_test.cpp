// Env::advise on a shared file mapping: Release reclaims pages inside the range and no
// neighbour's, and no advice changes a byte.
#include "tdstore/env.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "tests/temp_dir.h"

namespace tdstore {
namespace {

std::vector<bool> resident(const uint8_t* p, size_t pages, size_t page) {
  std::vector<unsigned char> v(pages);
  EXPECT_EQ(::mincore(const_cast<uint8_t*>(p), pages * page, v.data()), 0);
  std::vector<bool> out(pages);
  for (size_t i = 0; i < pages; ++i) out[i] = v[i] & 1;
  return out;
}

TEST(Env, ReleaseReclaimsTheWholePagesInsideTheRangeAndKeepsEveryByte) {
  testing::TempDir dir;
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t pages = 4096;  // 16 MiB: most of the kernel's large folios (up to 2 MiB) inside
  auto env = Env::posix();
  auto file = env->open(dir.path() / "f", Env::Access::Create);
  std::vector<uint8_t> bytes(pages * page);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  file->write_at(0, bytes.data(), bytes.size());
  file->sync();  // clean pages: reclaimable without writeback
  auto region = env->map(*file, bytes.size(), Env::MapMode::SharedRead);
  const uint8_t* p = region->data();
  env->advise(p, bytes.size(), Env::Advice::Populate);
  ASSERT_EQ(resident(p, pages, page), std::vector<bool>(pages, true));

  // Pages 1..1022 in part or whole: the first and the last belong to neighbours and stay.
  env->advise(p + page - 100, (pages - 2) * page + 150, Env::Advice::Release);
  const auto after = resident(p, pages, page);
  size_t kept = 0;
  for (size_t i = 1; i + 1 < pages; ++i) kept += after[i];
  EXPECT_TRUE(after[0]);
  EXPECT_TRUE(after[pages - 1]);
  // Best effort: the kernel keeps a large folio that lies across an end of the range whole.
  EXPECT_LT(kept, pages / 2) << "of " << pages - 2 << " pages released, still resident";

  EXPECT_EQ(std::vector<uint8_t>(p, p + bytes.size()), bytes);  // read back from the file
  for (auto advice : {Env::Advice::Normal, Env::Advice::Random, Env::Advice::WillNeed})
    env->advise(p, bytes.size(), advice);
  EXPECT_EQ(std::vector<uint8_t>(p, p + bytes.size()), bytes);
  env->advise(p, 0, Env::Advice::Release);             // an empty range: nothing
  env->advise(p + 1, page - 2, Env::Advice::Release);  // no whole page inside: nothing
  EXPECT_TRUE(resident(p, 1, page)[0]);
}

}  // namespace
}  // namespace tdstore
