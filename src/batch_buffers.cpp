#include "src/batch_buffers.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <deque>
#include <mutex>
#include <utility>

#include "src/fork_safe_mutex.h"

namespace tdstore::detail {

// The pool's state, shared with every buffer in use: a buffer released after its pool's
// BatchBuffers is gone is freed, not kept.
struct BatchBuffers::Shared : c10::Allocator {
  mutable ForkSafeRecursiveMutex mu;  // a forked child may release a buffer the parent handed out
  std::deque<std::pair<size_t, void*>> free_list GUARDED_BY(mu);  // oldest first
  size_t max_free GUARDED_BY(mu) = 0;
  bool open GUARDED_BY(mu) = true;  // the owner still exists
  size_t allocations GUARDED_BY(mu) = 0;
  std::weak_ptr<Shared> self;

  // One buffer in use: what its deleter needs to give it back.
  struct Lease {
    std::shared_ptr<Shared> pool;
    size_t bytes;
    void* data;
  };

  ~Shared() override {
    for (auto& [bytes, data] : free_list) c10::free_cpu(data);
  }

  void trim() REQUIRES(mu) {
    while (free_list.size() > max_free) {
      c10::free_cpu(free_list.front().second);
      free_list.pop_front();
    }
  }

  static void release(void* ctx) {
    std::unique_ptr<Lease> lease(static_cast<Lease*>(ctx));
    Shared& s = *lease->pool;
    {
      ForkSafeLock lock(&s.mu);
      if (s.open && s.max_free > 0) {
        s.free_list.emplace_back(lease->bytes, lease->data);
        s.trim();
        return;
      }
    }
    c10::free_cpu(lease->data);
  }

  c10::DataPtr allocate(size_t bytes) const override {
    if (bytes == 0) return {nullptr, c10::Device(c10::DeviceType::CPU)};
    auto* me = const_cast<Shared*>(this);
    void* data = nullptr;
    {
      ForkSafeLock lock(&me->mu);
      for (auto it = me->free_list.rbegin(); it != me->free_list.rend(); ++it)
        if (it->first == bytes) {
          data = it->second;
          me->free_list.erase(std::next(it).base());
          break;
        }
      if (!data) ++me->allocations;
    }
    if (!data) data = c10::alloc_cpu(bytes);
    auto* lease = new Lease{self.lock(), bytes, data};
    return {data, lease, &Shared::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
};

BatchBuffers::BatchBuffers(size_t max_free) : shared_(std::make_shared<Shared>()) {
  shared_->self = shared_;
  shared_->max_free = max_free;
}

BatchBuffers::~BatchBuffers() {
  ForkSafeLock lock(&shared_->mu);
  shared_->open = false;
  shared_->max_free = 0;
  shared_->trim();
}

at::Tensor BatchBuffers::empty(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::detail::empty_generic(shape, shared_.get(), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   dtype, c10::nullopt);
}

size_t BatchBuffers::free_buffers() const {
  ForkSafeLock lock(&shared_->mu);
  return shared_->free_list.size();
}

size_t BatchBuffers::allocations() const {
  ForkSafeLock lock(&shared_->mu);
  return shared_->allocations;
}

void BatchBuffers::set_max_free(size_t max_free) {
  ForkSafeLock lock(&shared_->mu);
  shared_->max_free = max_free;
  shared_->trim();
}

}  // namespace tdstore::detail
