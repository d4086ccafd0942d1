// An Env that injects faults: fail the Nth write or sync with a chosen errno, count syncs.
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
  int error = ENOSPC;

  std::unique_ptr<File> open(const std::filesystem::path& path, Access access) override {
    return std::make_unique<FaultFile>(this, Env::open(path, access));
  }

 private:
  class FaultFile : public File {
   public:
    FaultFile(FaultEnv* env, std::unique_ptr<File> f) : env_(env), f_(std::move(f)) {}
    void read_at(uint64_t o, void* d, size_t n) override { f_->read_at(o, d, n); }
    void write_at(uint64_t o, const void* s, size_t n) override {
      if (++env_->writes == env_->fail_write_at) fail("pwrite");
      f_->write_at(o, s, n);
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
    [[noreturn]] void fail(const char* call) {
      throw IOError(f_->path().string() + ": " + call + " failed: " + std::strerror(env_->error) +
                    " (injected)");
    }
    FaultEnv* env_;
    std::unique_ptr<File> f_;
  };
};

}  // namespace tdstore::testing
