// The operating-system boundary of the storage engine's own files. Every operation on a store's
// key directory and arena (open, pread, pwrite, copy_file_range, fdatasync, ftruncate, fallocate,
// fstat; their mappings and madvise), its writer lock (flock) and the wait for it, the directory's
// identity (stat), the rename that publishes a new store, compaction's directory exchange and the
// directory syncs of both go through an Env, so tests can inject faults (fail the Nth read,
// write, sync or mapping, simulate a full disk) and count syncs and waits. Not through an Env:
// the LMDB catalog (LMDB's own I/O), the reader table (a MAP_SHARED file of its own), the
// directory listing and removal of leftovers (std::filesystem), the file-format readers and
// writers of tdstore/formats.h, and the user's key files (tdstore/trust.h: O_EXCL, O_NOFOLLOW
// and mode checks an Env does not offer).
//
// Thread safety: a File may be used from several threads at once for pread/pwrite at
// distinct offsets; an Env is stateless unless a subclass documents otherwise.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "tdstore/export.h"

namespace tdstore {

// What a path or an open file is (st_dev, st_ino): two names of one file compare equal.
struct FileIdentity {
  uint64_t device = 0, inode = 0;
  bool operator==(const FileIdentity&) const = default;
};

class TDSTORE_API File {
 public:
  virtual ~File() = default;
  // Reads exactly n bytes at offset; bytes past end of file read as zero.
  virtual void read_at(uint64_t offset, void* dst, size_t n) = 0;
  // Writes exactly n bytes at offset, extending the file if needed. Throws IOError.
  virtual void write_at(uint64_t offset, const void* src, size_t n) = 0;
  // Copies n bytes of src at src_offset to this file at offset, extending it if needed: in the
  // kernel where the file systems allow (copy_file_range: no byte passes through user space),
  // else through a buffer with src.read_at and write_at (what a File of another Env gets unless
  // it overrides this). IOError naming the file when a call fails, and when src holds fewer than
  // src_offset + n bytes. Not atomic: after an IOError, part of the range may be written.
  virtual void copy_from(File& src, uint64_t src_offset, uint64_t offset, uint64_t n);
  // Makes every completed write durable (fdatasync). Throws IOError.
  virtual void sync() = 0;
  virtual void truncate(uint64_t size) = 0;
  // Extends the file to at least `size` bytes with their blocks reserved (posix_fallocate), so
  // touching its pages through a mapping never faults for want of space: IOError (ENOSPC)
  // now instead of SIGBUS later.
  virtual void allocate(uint64_t size) = 0;
  virtual uint64_t size() = 0;
  // Bytes of disk blocks the file occupies (fstat's st_blocks * 512; 0 when unknown).
  virtual uint64_t allocated_bytes();
  // The n bytes at offset will not be read again soon: drops them from the page cache where
  // nothing maps them (posix_fadvise DONTNEED), so that one pass over data larger than memory
  // does not evict everything else. Best effort: failures are ignored.
  virtual void evict(uint64_t offset, uint64_t n);
  // Reads exactly n bytes at offset, as read_at, for bytes read once: past the page cache where
  // the file system allows it (O_DIRECT through a second descriptor of the same open file, an
  // aligned buffer of the calling thread's own between), else read_at then evict. Sees every
  // completed write, through any handle (the kernel writes the range's dirty cached pages back
  // first). Throws IOError. May be called concurrently.
  virtual void read_once(uint64_t offset, void* dst, size_t n);
  // Reads [offset, offset + n) as read_once does, into whole pages of the caller's, with no
  // buffer between where read_once has one: the byte at offset lands at pages + offset % 4096.
  // `pages` is 4096-aligned, and all of [pages, pages + round_up(offset % 4096 + n, 4096)) is
  // the caller's to overwrite: the file's bytes around the range may land there too. Throws
  // IOError. May be called concurrently.
  virtual void read_once_into_pages(uint64_t offset, uint8_t* pages, size_t n);
  // What this open file is (fstat), or nullopt when fstat fails.
  virtual std::optional<FileIdentity> identity();
  // The descriptor, for Env::map. Valid for the File's lifetime.
  virtual int fd() const = 0;
  virtual const std::filesystem::path& path() const = 0;
};

// A mapping of a file's bytes, unmapped when destroyed.
class TDSTORE_API Region {
 public:
  virtual ~Region() = default;
  virtual uint8_t* data() const = 0;
  virtual size_t size() const = 0;
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
  // later reads take no page fault; WillNeed where the kernel lacks MADV_POPULATE_READ),
  // Release (not read again soon: reclaim the pages inside the range now, MADV_PAGEOUT, so
  // that memory pressure does not evict pages still to be read; a page reaching outside the
  // range, or a large folio of the page cache doing so, is kept; the bytes stay as they are and
  // a later read faults them back in), Discard (drop this process's own copies of the pages
  // inside the range, which writes through a private mapping made: later reads see the file's
  // bytes; MADV_DONTNEED), HugePages (process memory about to be written whole, such as a
  // decompressed key: the whole pages inside the range backed by huge pages where the kernel
  // has them, MADV_HUGEPAGE, so that writing it takes one page fault per 2 MiB rather than per
  // 4 KiB). Best effort: failures are ignored (Discard does not fail on a mapped range).
  enum class Advice { Normal, Random, WillNeed, Populate, Release, Discard, HugePages };
  virtual void advise(const void* addr, size_t n, Advice advice);
  // Whether a page of a mapped range holds this process's own copy of its bytes rather than
  // the file's: a PrivateReserve page written in place, resident or swapped out
  // (/proc/self/pagemap). True when it cannot tell.
  virtual bool has_private_pages(const void* addr, size_t n);
  // Maps the first n bytes of f (n > 0). SharedRead: read-only, shared: the bytes the file holds
  // (the key directory; verify's view of the arena). PrivateReserve: read-write, private and
  // without commit charge: writes stay in this process, and n may exceed the file's size (the
  // arena's reserved range; pages past the end are never touched). Throws IOError naming the
  // file and the byte count.
  enum class MapMode { SharedRead, PrivateReserve };
  virtual std::unique_ptr<Region> map(File& f, size_t n, MapMode mode);
  // Renames from to to (rename(2): replaces an empty directory at `to`). Throws IOError.
  virtual void rename(const std::filesystem::path& from, const std::filesystem::path& to);
  // Swaps two directory entries atomically (renameat2 RENAME_EXCHANGE). Throws IOError.
  virtual void exchange(const std::filesystem::path& a, const std::filesystem::path& b);
  // What path names now (stat), or nullopt when it cannot be looked up.
  virtual std::optional<FileIdentity> identity(const std::filesystem::path& path);
  // Waits before trying a lock again (a writer waiting for another, lock_timeout_ms).
  virtual void sleep_for(std::chrono::milliseconds ms);

  // The process-wide default (POSIX) Env.
  static std::shared_ptr<Env> posix();
};

}  // namespace tdstore
