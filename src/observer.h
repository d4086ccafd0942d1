// The hook through which a compiled function records, and later replays, everything it
// observes of a TensorDict. Internal to src/.
//
// Every TensorDict member a function can call goes through the observer watching the dict's
// state (if any) with a `real` callback computing the answer from the dict:
//  - recording (Recorder, src/recording.h): the observer calls `real`, keeps the question and
//    the answer (or the tdstore::Error it threw) and passes it on;
//  - replaying (Replayer): the observer answers from what was recorded and never calls
//    `real`, so a trace sees exactly what the eager call saw, and the dict is not touched.
// Members the compile cache does not model call unsupported(): the entry then runs eagerly.
// When no observer is installed on this thread, TensorDict pays one thread-local load.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "tdstore/tensordict.h"

namespace tdstore::detail {

// A non-owning reference to a callable, valid for the duration of the call it is passed to.
template <class Sig>
class FunctionRef;
template <class R, class... A>
class FunctionRef<R(A...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT: implicit, like std::function
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, A... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...);
        }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

// The questions a function can ask of a dict, other than reading tensors. The names in
// query_name() appear in persisted guards (docs/FORMAT.md, "Compiled graphs").
enum class Query : uint8_t {
  Contains,      // contains(key): bool
  HasPrefix,     // has_prefix(prefix): bool; key ends with '/'
  Keys,          // keys() and iteration: the sorted full keys under a prefix
  Count,         // size(): the number of keys under a prefix
  BatchSize,     // batch_size(), batch_dims()
  Attr,          // attr(name): optional string
  AttrNames,     // attr_names()
  IsRagged,      // is_ragged(key), get_ragged(key)'s check
  IsPersistent,  // is_persistent()
  IsWritable,    // is_writable(), and every set or erase (a read-only store refuses them)
  Path,          // path(), and error messages that name it
  Generation,    // generation()
};

// What set(key, value) asks of the dict besides the value, in the order it asks: the store's
// mode (IsWritable), the batch size (BatchSize), whether each ancestor of key is a leaf
// (Contains), whether key is a prefix of other keys (HasPrefix "<key>/"). set() answers each
// (TensorDict::Impl::check_set); a recording records each as a precondition of the set.
void for_each_set_question(const std::string& key,
                           FunctionRef<void(Query, const std::string&)> ask);
const char* query_name(Query q);
std::optional<Query> query_from_name(std::string_view name);

using Answer = std::variant<bool, int64_t, std::string, std::optional<std::string>,
                            std::vector<std::string>, std::vector<int64_t>>;

// Where a tensor read comes from.
enum class ReadKind : uint8_t {
  Get,         // get(key): the tensor, a ragged key padded
  Stored,      // get_ragged(key): the stored values, or offsets (key "<key>\0offsets")
  LazyMemory,  // a lazy property reused from memory (computed on a read-only store)
};

class Observer {
 public:
  explicit Observer(const void* target) : target_(target) {}
  virtual ~Observer() = default;
  const void* target() const { return target_; }

  // A tensor read of a full key; real() throws KeyError when absent.
  virtual at::Tensor read(ReadKind kind, const std::string& key,
                          FunctionRef<at::Tensor()> real) = 0;
  // Any other question; key is the full key, prefix or attribute name (empty when none).
  virtual Answer query(Query q, const std::string& key, FunctionRef<Answer()> real) = 0;
  // batch_size() hands out a reference: an observer returns one that outlives the call.
  virtual const std::vector<int64_t>& batch_size(
      FunctionRef<const std::vector<int64_t>&()> real) = 0;
  // set() of value under a full key; real() validates and stores it.
  virtual void set(const std::string& key, const at::Tensor& value, FunctionRef<void()> real) = 0;
  // erase() of a full key; real() throws KeyError when absent.
  virtual void erase(const std::string& key, FunctionRef<void()> real) = 0;
  // get_or_compute's validity check of property `key` (full key, full deps); real() computes
  // it (KeyError when a dep is absent).
  virtual bool lazy(const std::string& key, const std::vector<std::string>& deps,
                    std::string_view version, FunctionRef<bool()> real) = 0;
  // A member the compile cache does not model (e.g. "verify()"): the call runs eagerly.
  virtual void unsupported(std::string_view what) = 0;
  // True while replaying: effects outside the observed calls (commits, catalog writes,
  // counters) must be skipped.
  virtual bool dry() const = 0;

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

// The answer to q about the dict's current state, without observation: what TensorDict's
// members return (full keys), and what guards compare with.
Answer ask(const TensorDict::Impl& impl, Query q, const std::string& key);

// The class of a tdstore::Error, so a replay can throw what the recorded call threw.
enum class ErrorKind : uint8_t { Key, Shape, DType, Capacity, ReadOnly, Other };
ErrorKind error_kind(const Error& e);
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);
const char* error_kind_name(ErrorKind kind);  // "KeyError", ...; in persisted guards
std::optional<ErrorKind> error_kind_from_name(std::string_view name);

// What a call produced: an answer, or the tdstore::Error it threw.
struct Failure {
  ErrorKind kind = ErrorKind::Other;
  std::string message;
  bool operator==(const Failure&) const = default;
};

}  // namespace tdstore::detail
