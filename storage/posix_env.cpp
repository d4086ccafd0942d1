// POSIX implementation of tdstore::Env.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#ifndef MADV_PAGEOUT  // Linux 5.4; older kernels reject it, as advise() allows
#define MADV_PAGEOUT 21
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "storage/messages.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore {
using storage::throw_io_error;
namespace {

constexpr uint64_t kCopyPieceBytes = 1 << 20;  // File::copy_from's buffer, when it needs one

// IOError unless src holds [src_offset, src_offset + n).
void check_source(File& src, uint64_t src_offset, uint64_t n) {
  const uint64_t size = src.size();
  if (src_offset > size || size - src_offset < n)
    throw IOError(src.path().string() + ": " + std::to_string(size) + " bytes, fewer than the " +
                  std::to_string(src_offset) + " + " + std::to_string(n) + " to copy");
}

class PosixFile final : public File {
 public:
  PosixFile(std::filesystem::path path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixFile() override {
    ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }

  void read_at(uint64_t offset, void* dst, size_t n) override {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_io_error(path_, "pread");
      if (r == 0) {  // past end of file
        std::memset(p, 0, n);
        return;
      }
      p += r, n -= static_cast<size_t>(r), offset += static_cast<uint64_t>(r);
    }
  }

  void write_at(uint64_t offset, const void* src, size_t n) override {
    const auto* p = static_cast<const char*>(src);
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) throw_io_error(path_, "pwrite");
      p += w, n -= static_cast<size_t>(w), offset += static_cast<uint64_t>(w);
    }
  }

  void copy_from(File& src, uint64_t src_offset, uint64_t offset, uint64_t n) override {
    check_source(src, src_offset, n);
    while (n > 0) {
      auto from = static_cast<loff_t>(src_offset), to = static_cast<loff_t>(offset);
      const ssize_t r = ::copy_file_range(src.fd(), &from, fd_, &to,
                                          static_cast<size_t>(std::min<uint64_t>(n, 1 << 30)), 0);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP ||
                    errno == EBADF))
        return File::copy_from(src, src_offset, offset, n);  // these files: through a buffer
      if (r < 0) throw_io_error(path_, "copy_file_range from " + src.path().string());
      if (r == 0)
        throw IOError(src.path().string() + ": ended while copied into " + path_.string());
      src_offset += static_cast<uint64_t>(r), offset += static_cast<uint64_t>(r);
      n -= static_cast<uint64_t>(r);
    }
  }

  void sync() override {
    if (::fdatasync(fd_) != 0) throw_io_error(path_, "fdatasync");
  }

  void truncate(uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) throw_io_error(path_, "ftruncate");
  }

  void allocate(uint64_t size) override {
    int rc;
    while ((rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(size))) == EINTR) {
    }
    if (rc != 0) {
      errno = rc;
      throw_io_error(path_, "posix_fallocate");
    }
  }

  uint64_t size() override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) throw_io_error(path_, "fstat");
    return static_cast<uint64_t>(st.st_size);
  }

  void read_once(uint64_t offset, void* dst, size_t n) override {
    auto* p = static_cast<uint8_t*>(dst);
    const size_t done = n >= kDirectMinBytes ? read_direct(offset, p, n) : 0;
    if (done < n) File::read_once(offset + done, p + done, n - done);
  }

  void read_once_into_pages(uint64_t offset, uint8_t* pages, size_t n) override {
    const auto head = static_cast<size_t>(offset % kDirectAlign);
    const int fd = n >= kDirectMinBytes ? direct_fd() : -1;
    if (fd < 0) return read_once(offset, pages + head, n);
    // The pages holding the range, read straight into the caller's.
    const uint64_t from = offset - head;
    const size_t want = head + n, len = (want + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    size_t got = 0;
    while (got < len) {
      const ssize_t r = ::pread(fd, pages + got, len - got, static_cast<off_t>(from + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EINVAL) return File::read_once(offset, pages + head, n);  // buffered
      if (r < 0) throw_io_error(path_, "pread (O_DIRECT)");
      if (r == 0) break;  // end of file: the bytes past it read as zero, as read_at's
      got += static_cast<size_t>(r);
    }
    if (got < want) std::memset(pages + std::max(got, head), 0, want - std::max(got, head));
  }

  int fd() const override { return fd_; }
  const std::filesystem::path& path() const override { return path_; }

 private:
  // Reads of less bypass the page cache gaining nothing; the buffer between holds this much.
  static constexpr size_t kDirectMinBytes = 64 << 10, kDirectAlign = 4096,
                          kDirectChunk = size_t{8} << 20;

  // The descriptor for direct reads: the same open file as fd_ (through /proc/self/fd, so a
  // rename or an exchange of the path does not matter), opened once; -1 where the file system
  // refuses O_DIRECT or /proc is missing.
  int direct_fd() {
    std::call_once(direct_once_, [&] {
      const std::string self = "/proc/self/fd/" + std::to_string(fd_);
      direct_fd_ = ::open(self.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    });
    return direct_fd_;
  }

  // The bytes read by direct reads from the front of [offset, offset + n): n, or fewer when
  // the file system refuses them (read_once reads the rest). Throws IOError.
  size_t read_direct(uint64_t offset, uint8_t* dst, size_t n) {
    const int fd = direct_fd();
    if (fd < 0) return 0;
    // One aligned buffer per thread, kept: its pages are faulted in once.
    thread_local struct Bounce {
      uint8_t* p = nullptr;
      ~Bounce() {
        if (p) ::munmap(p, kDirectChunk + kDirectAlign);
      }
    } bounce;
    if (!bounce.p) {
      void* m = ::mmap(nullptr, kDirectChunk + kDirectAlign, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) return 0;
      bounce.p = static_cast<uint8_t*>(m);
    }
    size_t done = 0;
    while (done < n) {
      const uint64_t at = offset + done, from = at / kDirectAlign * kDirectAlign;
      const auto head = static_cast<size_t>(at - from);
      const size_t want = std::min(n - done, kDirectChunk - head);
      const size_t len = (head + want + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
      ssize_t r;
      while ((r = ::pread(fd, bounce.p, len, static_cast<off_t>(from))) < 0 && errno == EINTR) {
      }
      if (r < 0 && errno == EINVAL) return done;  // not for this file system: buffered reads
      if (r < 0) throw_io_error(path_, "pread (O_DIRECT)");
      // A short read ends at end of file: the bytes past it read as zero, as read_at's.
      const size_t got =
          static_cast<size_t>(r) > head ? std::min(want, static_cast<size_t>(r) - head) : 0;
      std::memcpy(dst + done, bounce.p + head, got);
      if (got < want) {
        std::memset(dst + done + got, 0, n - done - got);
        return n;
      }
      done += want;
    }
    return done;
  }

  std::filesystem::path path_;
  int fd_;
  std::once_flag direct_once_;
  int direct_fd_ = -1;
};

class PosixLock final : public FileLock {
 public:
  explicit PosixLock(int fd) : fd_(fd) {}
  ~PosixLock() override { ::close(fd_); }  // closing the description releases the flock

 private:
  int fd_;
};

class PosixEnv final : public Env {};

}  // namespace

std::unique_ptr<File> Env::open(const std::filesystem::path& path, Access access) {
  int flags = O_CLOEXEC;
  switch (access) {
    case Access::ReadOnly:
      flags |= O_RDONLY;
      break;
    case Access::ReadWrite:
      flags |= O_RDWR;
      break;
    case Access::Create:
      flags |= O_RDWR | O_CREAT | O_EXCL;
      break;
  }
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) throw_io_error(path, "open");
  return std::make_unique<PosixFile>(path, fd);
}

std::unique_ptr<FileLock> Env::try_lock(const std::filesystem::path& path, std::string* holder) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw_io_error(path, "open");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    if (holder) {
      char buf[128] = {};
      ssize_t r = ::pread(fd, buf, sizeof buf - 1, 0);
      holder->assign(buf, r > 0 ? static_cast<size_t>(r) : 0);
    }
    ::close(fd);
    if (err == EWOULDBLOCK) return nullptr;
    errno = err;
    throw_io_error(path, "flock");
  }
  std::string me = "pid " + std::to_string(::getpid());
  if (::ftruncate(fd, 0) == 0) {
    [[maybe_unused]] ssize_t w = ::pwrite(fd, me.data(), me.size(), 0);
  }
  return std::make_unique<PosixLock>(fd);
}

void Env::sync_dir(const std::filesystem::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io_error(dir, "open");
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  errno = err;
  if (rc != 0) throw_io_error(dir, "fsync");
}

bool Env::holes_allocate_on_read(const std::filesystem::path& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) != 0) throw_io_error(dir, "statfs");
  return fs.f_type == TMPFS_MAGIC || fs.f_type == HUGETLBFS_MAGIC;
}

void Env::advise(const void* addr, size_t n, Advice advice) {
  if (n == 0) return;
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  if (advice == Advice::Release || advice == Advice::Discard || advice == Advice::HugePages) {
    // Whole pages inside: a neighbour's bytes are neither released, discarded nor remapped.
    const auto begin = (reinterpret_cast<uintptr_t>(addr) + page - 1) & ~(page - 1);
    const auto end = (reinterpret_cast<uintptr_t>(addr) + n) & ~(page - 1);
    const int how = advice == Advice::Release   ? MADV_PAGEOUT
                    : advice == Advice::Discard ? MADV_DONTNEED
                                                : MADV_HUGEPAGE;
    if (begin < end) ::madvise(reinterpret_cast<void*>(begin), end - begin, how);
    return;
  }
  const auto begin = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(addr) + n;
  if (advice == Advice::Populate) {
    if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ) == 0) return;
    advice = Advice::WillNeed;  // before Linux 5.14
  }
  const int how = advice == Advice::Random     ? MADV_RANDOM
                  : advice == Advice::WillNeed ? MADV_WILLNEED
                                               : MADV_NORMAL;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, how);
}

void File::copy_from(File& src, uint64_t src_offset, uint64_t offset, uint64_t n) {
  check_source(src, src_offset, n);
  std::vector<uint8_t> buffer(static_cast<size_t>(std::min<uint64_t>(n, kCopyPieceBytes)));
  for (uint64_t done = 0; done < n;) {
    const size_t piece = static_cast<size_t>(std::min<uint64_t>(n - done, buffer.size()));
    src.read_at(src_offset + done, buffer.data(), piece);
    // read_at reads zeros past the end: a source cut short meanwhile is refused, not copied
    // as zeros (which the check as they land, reading the source the same way, would pass).
    check_source(src, src_offset + done, piece);
    write_at(offset + done, buffer.data(), piece);
    done += piece;
  }
}

void File::read_once(uint64_t offset, void* dst, size_t n) {
  read_at(offset, dst, n);
  evict(offset, n);
}

void File::read_once_into_pages(uint64_t offset, uint8_t* pages, size_t n) {
  read_once(offset, pages + offset % 4096, n);
}

void File::evict(uint64_t offset, uint64_t n) {
  ::posix_fadvise(fd(), static_cast<off_t>(offset), static_cast<off_t>(n), POSIX_FADV_DONTNEED);
}

bool Env::has_private_pages(const void* addr, size_t n) {
  if (n == 0) return false;
  static const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(addr) / page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(addr) + n - 1) / page;
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  constexpr uint64_t kPresent = uint64_t{1} << 63, kSwapped = uint64_t{1} << 62,
                     kFileOrShared = uint64_t{1} << 61;
  uint64_t entries[512];
  bool found = false;
  for (uintptr_t at = first; at <= last && !found;) {
    const size_t count = std::min<uintptr_t>(512, last - at + 1);
    const ssize_t got =
        ::pread(fd, entries, count * sizeof(uint64_t), static_cast<off_t>(at * sizeof(uint64_t)));
    if (got != static_cast<ssize_t>(count * sizeof(uint64_t))) {
      found = true;  // cannot tell
      break;
    }
    for (size_t i = 0; i < count && !found; ++i)
      found = (entries[i] & kSwapped) || ((entries[i] & kPresent) && !(entries[i] & kFileOrShared));
    at += count;
  }
  ::close(fd);
  return found;
}

uint64_t File::allocated_bytes() {
  struct stat st;
  return ::fstat(fd(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
}

std::optional<FileIdentity> File::identity() {
  struct stat st;
  if (::fstat(fd(), &st) != 0) return std::nullopt;
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

namespace {
class PosixRegion final : public Region {
 public:
  PosixRegion(uint8_t* data, size_t size) : data_(data), size_(size) {}
  ~PosixRegion() override { ::munmap(data_, size_); }
  uint8_t* data() const override { return data_; }
  size_t size() const override { return size_; }

 private:
  uint8_t* data_;
  size_t size_;
};
}  // namespace

std::unique_ptr<Region> Env::map(File& f, size_t n, MapMode mode) {
  const bool shared = mode == MapMode::SharedRead;
  void* p = ::mmap(nullptr, n, shared ? PROT_READ : PROT_READ | PROT_WRITE,
                   shared ? MAP_SHARED : MAP_PRIVATE | MAP_NORESERVE, f.fd(), 0);
  if (p == MAP_FAILED) throw_io_error(f.path(), "mmap of " + std::to_string(n) + " bytes");
  return std::make_unique<PosixRegion>(static_cast<uint8_t*>(p), n);
}

void Env::rename(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) throw_io_error(to, "rename from " + from.string());
}

void Env::exchange(const std::filesystem::path& a, const std::filesystem::path& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) != 0)
    throw_io_error(b, "renameat2(RENAME_EXCHANGE) with " + a.string());
}

std::optional<FileIdentity> Env::identity(const std::filesystem::path& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

void Env::sleep_for(std::chrono::milliseconds ms) { std::this_thread::sleep_for(ms); }

std::shared_ptr<Env> Env::posix() {
  static auto env = std::make_shared<PosixEnv>();
  return env;
}

}  // namespace tdstore
