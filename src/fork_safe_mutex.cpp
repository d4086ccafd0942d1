#include "src/fork_safe_mutex.h"

#include <pthread.h>

#include <set>

namespace tdstore::detail {

struct ForkSafeRegistry {
  std::mutex mu;  // held across fork(): the child finds the set consistent
  std::set<ForkSafeRecursiveMutex*> all;

  static ForkSafeRegistry& get() {
    static auto* r = [] {
      auto* reg = new ForkSafeRegistry;  // leaked: instances may outlive static destruction
      pthread_atfork([] { get().mu.lock(); }, [] { get().mu.unlock(); },
                     [] {
                       auto& g = get();
                       for (auto* m : g.all)
                         if (m->state_->owner.load() != std::this_thread::get_id())
                           m->state_ = new ForkSafeRecursiveMutex::State;
                       g.mu.unlock();
                     });
      return reg;
    }();
    return *r;
  }
};

ForkSafeRecursiveMutex::ForkSafeRecursiveMutex() : state_(new State) {
  auto& r = ForkSafeRegistry::get();
  std::lock_guard lock(r.mu);
  r.all.insert(this);
}

ForkSafeRecursiveMutex::~ForkSafeRecursiveMutex() {
  {
    auto& r = ForkSafeRegistry::get();
    std::lock_guard lock(r.mu);
    r.all.erase(this);
  }
  delete state_;
}

void ForkSafeRecursiveMutex::lock() {
  State* s = state_;
  if (s->owner.load() == std::this_thread::get_id()) {
    ++s->depth;
    return;
  }
  s->mu.lock();
  s->owner = std::this_thread::get_id();
  s->depth = 1;
}

void ForkSafeRecursiveMutex::unlock() {
  State* s = state_;
  if (--s->depth > 0) return;
  s->owner = std::thread::id();
  s->mu.unlock();
}

}  // namespace tdstore::detail
