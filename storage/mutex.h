// Mutex and MutexLock with clang's thread-safety annotations (as LevelDB's port::Mutex and
// util/mutexlock.h): fields marked GUARDED_BY(mu_) and functions marked REQUIRES(mu_) are
// checked at compile time by `clang -Wthread-safety` (scripts/test.sh builds storage/ so, with
// -Werror). Other compilers see plain std::mutex.
#pragma once

#include <mutex>

#if defined(__clang__)
#define TDSTORE_TSA(x) __attribute__((x))
#else
#define TDSTORE_TSA(x)
#endif

#define CAPABILITY(x) TDSTORE_TSA(capability(x))
#define SCOPED_CAPABILITY TDSTORE_TSA(scoped_lockable)
#define GUARDED_BY(x) TDSTORE_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) TDSTORE_TSA(pt_guarded_by(x))
#define REQUIRES(...) TDSTORE_TSA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) TDSTORE_TSA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) TDSTORE_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) TDSTORE_TSA(release_capability(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS TDSTORE_TSA(no_thread_safety_analysis)

namespace tdstore::storage {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  void lock() ACQUIRE() { mu_.lock(); }
  void unlock() RELEASE() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds `mu` for its scope.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->lock(); }
  ~MutexLock() RELEASE() { mu_->unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* mu_;
};

}  // namespace tdstore::storage
