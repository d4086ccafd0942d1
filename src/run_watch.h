// What a C++ body's recording run did through libtorch's operators that a trace cannot replay.
// Internal to src/.
//
// A C++ body's control flow is not recorded by the tracer: a value read into C++ (item(), a
// bool of a tensor, at::equal) or a size of a tensor whose shape depends on values (nonzero,
// masked_select, unique, a boolean-mask index) becomes a constant of the graph, and a grad-mode
// or autocast switch inside the body (NoGradGuard, InferenceMode) is not in the graph, which
// runs under the caller's state. The eager run of a miss is watched for these through a
// thread-local RecordFunction callback, so the entry runs eagerly instead. (Python bodies are
// watched by the binding, which sees Python's own reads; see docs/DESIGN.md.)
#pragma once

#include <ATen/record_function.h>

#include <memory>
#include <string>

namespace tdstore::detail {

// While it lives, watches the operators this thread runs (other threads are not seen). Made
// around one call of a body, at no operator's depth. Not copyable.
class RunWatch {
 public:
  RunWatch();
  ~RunWatch();
  RunWatch(const RunWatch&) = delete;
  RunWatch& operator=(const RunWatch&) = delete;

  // Why a trace of the watched run would not replay it (the first such operator), or "".
  const std::string& why() const { return why_; }

  // Whether this thread's operators are being watched, or traced (torch.jit's tracer): code
  // that would read a tensor's values into C++ without an operator (which neither sees) takes
  // its operator path instead.
  static bool watched_or_traced();

  struct Scope;  // the thread's watch state, internal to run_watch.cpp

  // While it lives, operators this thread runs are not judged: for the dict's own checks whose
  // values decide only whether it throws (an index tensor's bounds), which a graph replays by
  // the indexing operator's own check. Not copyable.
  class Unwatched {
   public:
    Unwatched();
    ~Unwatched();
    Unwatched(const Unwatched&) = delete;
    Unwatched& operator=(const Unwatched&) = delete;

   private:
    Scope* scope_;
  };

 private:
  at::CallbackHandle handle_;
  std::string why_;
  std::unique_ptr<Scope> scope_;
};

}  // namespace tdstore::detail
