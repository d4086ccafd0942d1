// A recursive mutex a forked child can still take. The child of fork() has only the thread that
// called it, so a mutex another thread held at that moment would stay locked in the child
// forever: every instance is registered, and a pthread_atfork child handler gives each one held
// by another thread a fresh, unlocked state (the old one is leaked). One held by the forking
// thread stays held by it. Internal to src/.
#pragma once

#include <atomic>
#include <mutex>
#include <thread>

#include "storage/mutex.h"  // the thread-safety annotations

namespace tdstore::detail {

class CAPABILITY("mutex") ForkSafeRecursiveMutex {
 public:
  ForkSafeRecursiveMutex();
  ~ForkSafeRecursiveMutex();
  ForkSafeRecursiveMutex(const ForkSafeRecursiveMutex&) = delete;
  ForkSafeRecursiveMutex& operator=(const ForkSafeRecursiveMutex&) = delete;

  void lock() ACQUIRE();
  void unlock() RELEASE();

 private:
  struct State {
    std::mutex mu;
    std::atomic<std::thread::id> owner{};
    int depth = 0;  // written by the owner only
  };
  State* state_;  // replaced only in a forked child, which has one thread
  friend struct ForkSafeRegistry;
};

// Holds `mu` for its scope (re-entered by the thread holding it).
class SCOPED_CAPABILITY ForkSafeLock {
 public:
  explicit ForkSafeLock(ForkSafeRecursiveMutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~ForkSafeLock() RELEASE() { mu_->unlock(); }
  ForkSafeLock(const ForkSafeLock&) = delete;
  ForkSafeLock& operator=(const ForkSafeLock&) = delete;

 private:
  ForkSafeRecursiveMutex* mu_;
};

}  // namespace tdstore::detail
