// The state behind a tdstore handle (TensorDict, Dataset, CompiledFunction, StoreReader): a
// pointer that throws tdstore::Error naming the handle, instead of crashing, when the handle was
// moved from (as a moved-from at::Tensor is undefined and its methods throw).
#pragma once

#include <memory>
#include <utility>

#include "tdstore/export.h"

namespace tdstore::detail {

// Throws tdstore::Error: "use of a moved-from tdstore::<name>".
[[noreturn]] TDSTORE_API void throw_moved_from(const char* name);

template <class Ptr, const char* Name>
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
    if (!p_) throw_moved_from(Name);
    return p_.get();
  }
  Ptr p_;
};

inline constexpr char kTensorDictName[] = "TensorDict";
inline constexpr char kDatasetName[] = "Dataset";
inline constexpr char kCompiledFunctionName[] = "CompiledFunction";
inline constexpr char kStoreReaderName[] = "StoreReader";

}  // namespace tdstore::detail
