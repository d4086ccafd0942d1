#include "storage/process.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>

namespace tdstore::storage {
namespace {

std::atomic<int> cached{0};

void forget() { cached.store(0, std::memory_order_relaxed); }

}  // namespace

int process_id() {
  static const bool registered = [] { return ::pthread_atfork(nullptr, nullptr, forget) == 0; }();
  int pid = cached.load(std::memory_order_relaxed);
  if (pid == 0 || !registered) {
    pid = ::getpid();
    cached.store(pid, std::memory_order_relaxed);
  }
  return pid;
}

void raise_open_file_limit() {
  static const bool raised = [] {
    struct rlimit lim;
    if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return false;
    lim.rlim_cur = lim.rlim_max;
    return ::setrlimit(RLIMIT_NOFILE, &lim) == 0;
  }();
  (void)raised;
}

}  // namespace tdstore::storage
