// The state behind a tdstore handle (TensorDict, Dataset, CompiledFunction, StoreReader): a
// pointer that throws tdstore::Error naming the handle, instead of crashing, when the handle was
// moved from (as a moved-from at::Tensor is undefined and its methods throw), and, for handles
// that can be closed (a Tag with check_open), ClosedError when the shared state was closed.
#pragma once

#include <memory>
#include <utility>

#include "tdstore/export.h"

namespace tdstore {

// Throws tdstore::ClosedError: "use of a moved-from tdstore::<name>".
[[noreturn]] TDSTORE_API void throw_moved_from(const char* name);
// ClosedError naming the store when the dict's (dataset's) shared state `impl` was closed.
TDSTORE_API void check_tensordict_open(const void* impl);
TDSTORE_API void check_dataset_open(const void* impl);

namespace detail {

// Tag: a type with `static constexpr const char* kName`, the handle's class name.
template <class Ptr, class Tag>
class HandleState {
 public:
  HandleState() = default;
  HandleState(Ptr p) : p_(std::move(p)) {}  // NOLINT: converts like the pointer it wraps
  HandleState(const HandleState&) = default;
  HandleState& operator=(const HandleState&) = default;
  HandleState(HandleState&& o) noexcept : p_(std::move(o.p_)) {}
  HandleState& operator=(HandleState&& o) noexcept {
    p_ = std::move(o.p_);
    return *this;
  }
  auto* operator->() const { return get_checked(); }
  auto& operator*() const { return *get_checked(); }
  auto* get() const { return p_.get(); }  // null when moved from; no throw
  const Ptr& ptr() const {
    get_checked();
    return p_;
  }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  auto* get_checked() const {
    if (!p_) throw_moved_from(Tag::kName);
    if constexpr (requires { Tag::check_open(p_.get()); }) Tag::check_open(p_.get());
    return p_.get();
  }
  Ptr p_;
};

// Names as constant values, never as objects: a library exports no symbol for them.
// check_open: ClosedError naming the store when the state was closed.
struct TensorDictTag {
  static constexpr const char* kName = "TensorDict";
  static void check_open(const void* impl) { check_tensordict_open(impl); }
};
struct DatasetTag {
  static constexpr const char* kName = "Dataset";
  static void check_open(const void* impl) { check_dataset_open(impl); }
};
struct CompiledFunctionTag {
  static constexpr const char* kName = "CompiledFunction";
};
struct StoreReaderTag {
  static constexpr const char* kName = "StoreReader";
};

}  // namespace detail
}  // namespace tdstore
