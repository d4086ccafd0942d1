// Env::advise on a shared file mapping: Release reclaims pages inside the range and no
// neighbour's, and no advice changes a byte. Env::has_private_pages tells a private mapping's
// pages written in place from the file's; File::evict drops bytes from the page cache;
// File::read_once reads what read_at reads, past the page cache; File::copy_from copies in the
// kernel and through a buffer alike.
#include "tdstore/env.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "tdstore/errors.h"
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

// A private mapping of a file of `pages` pages, as the arena's (PrivateReserve).
struct PrivateFile {
  PrivateFile(const std::filesystem::path& path, size_t pages)
      : env(Env::posix()), page(static_cast<size_t>(::sysconf(_SC_PAGESIZE))) {
    file = env->open(path, Env::Access::Create);
    std::vector<uint8_t> bytes(pages * page, 7);
    file->write_at(0, bytes.data(), bytes.size());
    file->sync();
    region = env->map(*file, bytes.size(), Env::MapMode::PrivateReserve);
  }
  std::shared_ptr<Env> env;
  size_t page;
  std::unique_ptr<File> file;
  std::unique_ptr<Region> region;
};

TEST(Env, PrivatePagesAreThoseThisProcessWroteInPlace) {
  testing::TempDir dir;
  PrivateFile f(dir.path() / "f", 8);
  uint8_t* p = f.region->data();
  const size_t n = 8 * f.page;
  EXPECT_FALSE(f.env->has_private_pages(p, n)) << "untouched";
  f.env->advise(p, n, Env::Advice::Populate);
  EXPECT_FALSE(f.env->has_private_pages(p, n)) << "read: the file's pages";
  EXPECT_EQ(p[5 * f.page + 1], 7);
  p[5 * f.page + 1] = 9;  // copy on write: this process's page from now on
  EXPECT_TRUE(f.env->has_private_pages(p, n));
  EXPECT_TRUE(f.env->has_private_pages(p + 5 * f.page + 100, 1));
  EXPECT_TRUE(f.env->has_private_pages(p + 4 * f.page + 10, f.page)) << "reaching into page 5";
  EXPECT_FALSE(f.env->has_private_pages(p, 5 * f.page)) << "pages 0-4";
  EXPECT_FALSE(f.env->has_private_pages(p + 6 * f.page, 2 * f.page)) << "pages 6-7";
  EXPECT_FALSE(f.env->has_private_pages(p, 0));
  uint8_t back = 0;
  f.file->read_at(5 * f.page + 1, &back, 1);
  EXPECT_EQ(back, 7) << "the file never sees a private page";
}

TEST(Env, EvictDropsTheBytesFromThePageCache) {
  testing::TempDir dir;
  PrivateFile f(dir.path() / "f", 64);
  const uint8_t* p = f.region->data();  // never touched: mincore reports the page cache
  const size_t n = 64 * f.page;
  std::vector<uint8_t> bytes(n);
  f.file->read_at(0, bytes.data(), n);
  const auto before = resident(p, 64, f.page);
  ASSERT_EQ(before, std::vector<bool>(64, true));
  f.file->evict(0, n);
  const auto after = resident(p, 64, f.page);
  size_t kept = 0;
  for (size_t i = 0; i < 64; ++i) kept += after[i];
  EXPECT_LT(kept, 32u) << "of 64 pages evicted, still cached";
  f.file->read_at(0, bytes.data(), n);
  EXPECT_EQ(bytes, std::vector<uint8_t>(n, 7));
}

// read_once against read_at over one file: unaligned ranges, ranges across its 8 MiB buffer,
// past end of file, bytes written but not yet synced, a write through another handle after a
// rename; and afterwards, on a disk's file system, the bytes are not left in the page cache.
void expect_read_once_reads_what_read_at_reads(const std::filesystem::path& dir, bool on_disk) {
  auto env = Env::posix();
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t size = (size_t{20} << 20) + 123;
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 131 + i / 4096);
  auto file = env->open(dir / "f", Env::Access::Create);
  file->write_at(0, bytes.data(), size);  // dirty in the page cache: never synced
  auto check = [&](uint64_t offset, size_t n) {
    std::vector<uint8_t> once(n, 0xEE), at(n, 0xDD);
    file->read_once(offset, once.data(), n);
    file->read_at(offset, at.data(), n);
    EXPECT_EQ(once, at) << "at " << offset << ", " << n << " bytes";
  };
  const std::pair<uint64_t, size_t> ranges[] = {
      {0, size},                      // all of it, across the buffer's size twice
      {4097, (size_t{9} << 20) + 5},  // unaligned both ends, across the buffer once
      {77, 70000},                    // just above the size read directly
      {size - 100, 300000},           // past end of file: zeros
      {size + 5000, 100000},          // wholly past it
      {12345, 1000},                  // small: buffered
      {(size_t{8} << 20) - 1, 2}};    // one byte each side of a buffer's end
  for (auto [offset, n] : ranges) check(offset, n);

  std::filesystem::rename(dir / "f", dir / "g");
  auto other = env->open(dir / "g", Env::Access::ReadWrite);
  const std::vector<uint8_t> patch(300000, 0x5A);
  other->write_at(1 << 20, patch.data(), patch.size());
  std::vector<uint8_t> got(patch.size() + 2);
  file->read_once((1 << 20) - 1, got.data(), got.size());
  EXPECT_EQ(got.front(), bytes[(1 << 20) - 1]);
  EXPECT_EQ(std::vector<uint8_t>(got.begin() + 1, got.end() - 1), patch);
  EXPECT_EQ(got.back(), bytes[(1 << 20) + patch.size()]);

  if (!on_disk) return;  // the page cache is where a memory file system keeps its files
  file->sync();
  file->evict(0, size);
  auto region = env->map(*file, size, Env::MapMode::SharedRead);  // never touched
  std::vector<uint8_t> all(size);
  file->read_once(0, all.data(), size);
  const size_t pages = size / page;
  const auto cached = resident(region->data(), pages, page);
  size_t kept = 0;
  for (bool c : cached) kept += c;
  EXPECT_LT(kept, pages / 2) << "of " << pages << " pages read once, still cached";
}

// read_once_into_pages against read_at: the range lands at its offset within its page, past end
// of file reads as zero, and nothing past the range's last page is written. Small ranges (read
// through the buffer), large ones (straight into the pages), unaligned at either end or both.
void expect_read_once_into_pages_reads_what_read_at_reads(const std::filesystem::path& dir) {
  auto env = Env::posix();
  const size_t size = (size_t{3} << 20) + 321;
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<uint8_t>(i * 73 + i / 4096);
  auto file = env->open(dir / "f", Env::Access::Create);
  file->write_at(0, bytes.data(), size);  // dirty in the page cache: never synced
  const std::pair<uint64_t, size_t> ranges[] = {
      {0, size},                      // all of it, aligned start
      {4096 * 3, 1 << 20},            // aligned both ends
      {4097, (size_t{1} << 20) + 5},  // unaligned both ends
      {8191, 70000},                  // one byte before a page, just over the direct minimum
      {size - 5000, 200000},          // past end of file: zeros
      {12345, 1000},                  // small: through the buffer
      {(size_t{2} << 20) - 1, 2}};    // one byte each side of a page
  for (auto [offset, n] : ranges) {
    const size_t head = offset % 4096, span = (head + n + 4095) / 4096 * 4096;
    // Room for the span and a guard page after it, 4096-aligned.
    void* mem = std::aligned_alloc(4096, span + 4096);
    auto* pages = static_cast<uint8_t*>(mem);
    std::memset(pages, 0xEE, span + 4096);
    file->read_once_into_pages(offset, pages, n);
    std::vector<uint8_t> want(n), got(pages + head, pages + head + n);
    file->read_at(offset, want.data(), n);
    EXPECT_EQ(got, want) << "at " << offset << ", " << n << " bytes";
    EXPECT_EQ(std::vector<uint8_t>(pages + span, pages + span + 4096),
              std::vector<uint8_t>(4096, 0xEE))
        << "written past the range's pages, at " << offset << ", " << n << " bytes";
    std::free(mem);
  }
}

TEST(Env, ReadOnceIntoPagesReadsWhatReadAtReads) {
  testing::TempDir dir;
  expect_read_once_into_pages_reads_what_read_at_reads(dir.path());
  const std::filesystem::path shm = "/dev/shm";  // no O_DIRECT there: buffered reads
  if (!std::filesystem::is_directory(shm)) return;
  const auto mem = shm / ("tdstore-env-test-pages-" + std::to_string(::getpid()));
  std::filesystem::create_directories(mem);
  expect_read_once_into_pages_reads_what_read_at_reads(mem);
  std::filesystem::remove_all(mem);
}

TEST(Env, ReadOnceReadsWhatReadAtReadsAndLeavesNoPageCache) {
  testing::TempDir dir;
  expect_read_once_reads_what_read_at_reads(dir.path(), true);
}

TEST(Env, ReadOnceReadsWhatReadAtReadsInMemoryFileSystems) {
  const std::filesystem::path shm = "/dev/shm";
  if (!std::filesystem::is_directory(shm)) GTEST_SKIP() << "no /dev/shm";
  const auto dir = shm / ("tdstore-env-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  expect_read_once_reads_what_read_at_reads(dir, false);
  std::filesystem::remove_all(dir);
}

// A File that does not override copy_from: it gets File's, through a buffer.
class BufferedFile : public File {
 public:
  explicit BufferedFile(std::unique_ptr<File> f) : f_(std::move(f)) {}
  bool fail_writes = false;
  void read_at(uint64_t o, void* d, size_t n) override { f_->read_at(o, d, n); }
  void write_at(uint64_t o, const void* s, size_t n) override {
    if (fail_writes) throw IOError(f_->path().string() + ": pwrite failed (injected)");
    f_->write_at(o, s, n);
  }
  void sync() override { f_->sync(); }
  void truncate(uint64_t s) override { f_->truncate(s); }
  void allocate(uint64_t s) override { f_->allocate(s); }
  uint64_t size() override { return f_->size(); }
  int fd() const override { return f_->fd(); }
  const std::filesystem::path& path() const override { return f_->path(); }

 private:
  std::unique_ptr<File> f_;
};

// copy_from lands the source's bytes at any offset, extending the file, whether the kernel
// copies them (a POSIX File) or a buffer does (File's own, which another Env's File gets); a
// source shorter than the range and a failed write are IOErrors naming the file.
TEST(Env, CopyFromCopiesTheRangeInTheKernelAndThroughABuffer) {
  testing::TempDir dir;
  std::vector<uint8_t> bytes((3 << 20) + 4099);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + i / 7);
  auto env = Env::posix();
  env->open(dir / "src", Env::Access::Create)->write_at(0, bytes.data(), bytes.size());
  for (const bool kernel : {true, false}) {
    const auto out = dir / (kernel ? "kernel" : "buffer");
    auto src = env->open(dir / "src", Env::Access::ReadOnly);
    std::unique_ptr<File> dst = env->open(out, Env::Access::Create);
    if (!kernel) dst = std::make_unique<BufferedFile>(std::move(dst));
    dst->write_at(0, "head", 4);
    const uint64_t from = 4097, at = 8191, n = bytes.size() - from;
    dst->copy_from(*src, from, at, n);
    EXPECT_EQ(dst->size(), at + n) << out;
    std::vector<uint8_t> got(n);
    dst->read_at(at, got.data(), n);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes.begin() + from)) << out;
    char head[4];
    dst->read_at(0, head, 4);
    EXPECT_EQ(std::string(head, 4), "head") << "bytes before the range kept: " << out;
    dst->copy_from(*src, 0, 0, 0);  // nothing to copy: nothing changes
    EXPECT_EQ(dst->size(), at + n);
    try {
      dst->copy_from(*src, from, 0, n + 1);
      ADD_FAILURE() << "a range past the source's end was copied";
    } catch (const IOError& e) {
      EXPECT_NE(std::string(e.what()).find((dir / "src").string()), std::string::npos) << e.what();
    }
  }
  auto src = env->open(dir / "src", Env::Access::ReadOnly);
  BufferedFile failing(env->open(dir / "failed", Env::Access::Create));
  failing.fail_writes = true;
  EXPECT_THROW(failing.copy_from(*src, 0, 0, bytes.size()), IOError);
}

}  // namespace
}  // namespace tdstore
