// An Env that injects faults: fail the Nth read, write (copies count), sync or mapping, a rename
// or a directory exchange with a chosen errno; corrupt copies; count syncs, writes, reads,
// mappings, discarded pages and lock waits (a wait returns at once: no test waits for
// wall-clock time).
#pragma once

#include <atomic>
#include <cerrno>
#include <cstring>

#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore::testing {

class FaultEnv : public Env {
 public:
  std::atomic<int> syncs{0};
  std::atomic<int> writes{0};
  // 0 = never; otherwise the Nth call (1-based, counted from now) fails.
  std::atomic<int> fail_write_at{0};
  std::atomic<int> fail_sync_at{0};
  std::atomic<int> reads{0}, fail_read_at{0};
  std::atomic<int> maps{0}, fail_map_at{0};
  std::atomic<bool> fail_rename{false}, fail_exchange{false};
  std::atomic<int> lock_waits{0};
  std::atomic<int> discards{0};  // advise(Discard) calls
  // File::copy_from copies through the wrapped file, then flips the first byte it wrote (a copy
  // that lands other bytes than its source's).
  std::atomic<bool> corrupt_copies{false};
  int error = ENOSPC;

  std::unique_ptr<File> open(const std::filesystem::path& path, Access access) override {
    return std::make_unique<FaultFile>(this, Env::open(path, access));
  }
  std::unique_ptr<Region> map(File& f, size_t n, MapMode mode) override {
    if (++maps == fail_map_at) fail(f.path(), "mmap");
    return Env::map(f, n, mode);
  }
  void advise(const void* addr, size_t n, Advice advice) override {
    if (advice == Advice::Discard) ++discards;
    Env::advise(addr, n, advice);
  }
  void rename(const std::filesystem::path& from, const std::filesystem::path& to) override {
    if (fail_rename) fail(to, "rename");
    Env::rename(from, to);
  }
  void exchange(const std::filesystem::path& a, const std::filesystem::path& b) override {
    if (fail_exchange) fail(b, "renameat2(RENAME_EXCHANGE)");
    Env::exchange(a, b);
  }
  void sleep_for(std::chrono::milliseconds) override { ++lock_waits; }

  [[noreturn]] void fail(const std::filesystem::path& path, const char* call) const {
    throw IOError(path.string() + ": " + call + " failed: " + std::strerror(error) + " (injected)");
  }

 private:
  class FaultFile : public File {
   public:
    FaultFile(FaultEnv* env, std::unique_ptr<File> f) : env_(env), f_(std::move(f)) {}
    void read_at(uint64_t o, void* d, size_t n) override {
      if (++env_->reads == env_->fail_read_at) fail("pread");
      f_->read_at(o, d, n);
    }
    void write_at(uint64_t o, const void* s, size_t n) override {
      if (++env_->writes == env_->fail_write_at) fail("pwrite");
      f_->write_at(o, s, n);
    }
    void copy_from(File& src, uint64_t src_offset, uint64_t offset, uint64_t n) override {
      if (++env_->writes == env_->fail_write_at) fail("copy_file_range");
      f_->copy_from(src, src_offset, offset, n);
      if (!env_->corrupt_copies || n == 0) return;
      uint8_t b = 0;
      f_->read_at(offset, &b, 1);
      b ^= 0xFF;
      f_->write_at(offset, &b, 1);
    }
    void sync() override {
      if (++env_->syncs == env_->fail_sync_at) fail("fdatasync");
      f_->sync();
    }
    void truncate(uint64_t s) override { f_->truncate(s); }
    void allocate(uint64_t s) override {
      if (++env_->writes == env_->fail_write_at) fail("posix_fallocate");
      f_->allocate(s);
    }
    uint64_t size() override { return f_->size(); }
    int fd() const override { return f_->fd(); }
    const std::filesystem::path& path() const override { return f_->path(); }

   private:
    [[noreturn]] void fail(const char* call) { env_->fail(f_->path(), call); }
    FaultEnv* env_;
    std::unique_ptr<File> f_;
  };
};

}  // namespace tdstore::testing
