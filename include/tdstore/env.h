// The operating-system boundary of the storage engine's own files. Every operation on a store's
// key directory and arena (open, pread, pwrite, fdatasync, ftruncate; mmap of the File's
// descriptor), its writer lock (flock) and the directory syncs of creation and compaction go
// through an Env, so tests can inject faults (fail the Nth write or sync, simulate a full disk)
// and count syncs. Not through an Env: the LMDB catalog (LMDB's own I/O), the reader table
// (a MAP_SHARED file), compaction's directory exchange (renameat2) and the file-format readers
// and writers of tdstore/formats.h.
//
// Thread safety: a File may be used from several threads at once for pread/pwrite at
// distinct offsets; an Env is stateless unless a subclass documents otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "tdstore/export.h"

namespace tdstore {

class TDSTORE_API File {
 public:
  virtual ~File() = default;
  // Reads exactly n bytes at offset; bytes past end of file read as zero.
  virtual void read_at(uint64_t offset, void* dst, size_t n) = 0;
  // Writes exactly n bytes at offset, extending the file if needed. Throws IOError.
  virtual void write_at(uint64_t offset, const void* src, size_t n) = 0;
  // Makes every completed write durable (fdatasync). Throws IOError.
  virtual void sync() = 0;
  virtual void truncate(uint64_t size) = 0;
  // Extends the file to at least `size` bytes with their blocks reserved (posix_fallocate), so
  // touching its pages through a mapping never faults for want of space: IOError (ENOSPC)
  // now instead of SIGBUS later.
  virtual void allocate(uint64_t size) = 0;
  virtual uint64_t size() = 0;
  // The descriptor, for mmap. Valid for the File's lifetime.
  virtual int fd() const = 0;
  virtual const std::filesystem::path& path() const = 0;
};

// An advisory exclusive lock held until destroyed (flock, per open file description).
class TDSTORE_API FileLock {
 public:
  virtual ~FileLock() = default;
};

class TDSTORE_API Env {
 public:
  virtual ~Env() = default;
  enum class Access { ReadOnly, ReadWrite, Create };
  // Create: O_CREAT|O_EXCL. Throws IOError naming the path and errno text.
  virtual std::unique_ptr<File> open(const std::filesystem::path& path, Access access);
  // Non-blocking exclusive lock on path (created if missing). Returns nullptr when another
  // holder has it; `holder` then receives what the holder wrote into the lock file.
  virtual std::unique_ptr<FileLock> try_lock(const std::filesystem::path& path,
                                             std::string* holder);
  // fsync of a directory, so that created or renamed entries are durable.
  virtual void sync_dir(const std::filesystem::path& dir);
  // Whether reading a hole of a file under dir through a shared mapping allocates memory, as on
  // tmpfs and hugetlbfs (statfs): a full file system then faults (SIGBUS) where others read
  // zeros, so mapped files there are allocated up front (File::allocate).
  virtual bool holes_allocate_on_read(const std::filesystem::path& dir);
  // How a range of mapped file bytes will be read (madvise, the range widened to whole pages):
  // Normal (readahead around faults), Random (no readahead: data larger than memory read at
  // random), WillNeed (read it now, asynchronously), Populate (read it and map it now, waiting:
  // later reads take no page fault; WillNeed where the kernel lacks MADV_POPULATE_READ). Best
  // effort: failures are ignored.
  enum class Advice { Normal, Random, WillNeed, Populate };
  virtual void advise(const void* addr, size_t n, Advice advice);

  // The process-wide default (POSIX) Env.
  static std::shared_ptr<Env> posix();
};

}  // namespace tdstore
