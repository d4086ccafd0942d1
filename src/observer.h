// The hook through which a compiled function watches what it observes of a TensorDict.
// Internal to src/. When no observer is installed on this thread, TensorDict pays one
// thread-local load per call.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string_view>

#include "tdstore/tensordict.h"

namespace tdstore::detail {

class Observer {
 public:
  explicit Observer(const void* target) : target_(target) {}
  virtual ~Observer() = default;
  const void* target() const { return target_; }

  // get() returned value for key (a full path).
  virtual void read(std::string_view key, const at::Tensor& value) = 0;
  // contains() (prefix == false) or has_prefix() (prefix == true) answered present.
  virtual void probe(std::string_view key, bool prefix, bool present) = 0;
  // keys() or size() observed the key set under prefix.
  virtual void key_set(std::string_view prefix) = 0;
  // set() stored value under key; existed: the key was present before.
  virtual void write(std::string_view key, const at::Tensor& value, bool existed) = 0;
  virtual void erased(std::string_view key) = 0;
  // get_or_compute is about to reuse (valid) or compute the property `request.key`. A tensor
  // returned here is used as the property instead.
  virtual std::optional<at::Tensor> lazy(const LazyInfo& request, bool valid) = 0;

 private:
  const void* target_;
};

// The observer installed on this thread, or nullptr.
Observer*& current_observer();

// The observer watching `impl`, if any.
inline Observer* observer_for(const void* impl) {
  Observer* o = current_observer();
  return o && o->target() == impl ? o : nullptr;
}

// Installs an observer for a scope.
class ObserverScope {
 public:
  explicit ObserverScope(Observer* o) : saved_(current_observer()) { current_observer() = o; }
  ~ObserverScope() { current_observer() = saved_; }
  ObserverScope(const ObserverScope&) = delete;
  ObserverScope& operator=(const ObserverScope&) = delete;

 private:
  Observer* saved_;
};

}  // namespace tdstore::detail
