// Recording a compiled function's eager call, and replaying it under the tracer. Internal to
// src/ (the observer protocol is in src/observer.h).
//
// A Recorder watches the real call: every member the function calls is answered by the dict
// and kept on a tape, in call order. From the tape it derives the entry's guard (what the
// answers depended on in the dict as it was when the call started) and effects (the final
// state of every key the call wrote or erased).
//
// A Replayer answers the same calls, in the same order, from the tape while the function runs
// under the tracer: reads return the trace inputs (copies of what the eager call read, taken
// when it read them), writes go to an overlay, errors are rethrown. The dict is not touched,
// so the trace sees exactly what the eager call saw and no effect happens twice. A call that
// differs from the tape (a function that is not deterministic in what it asks) aborts the
// trace.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "src/guard.h"
#include "src/observer.h"

namespace tdstore::detail {

struct Event {
  enum class Op : uint8_t { Read, Query, BatchSize, Set, Erase, Lazy };
  Op op = Op::Read;
  ReadKind read = ReadKind::Get;  // Read
  Query query = Query::Contains;  // Query
  std::string key;
  Answer answer;                   // Query, BatchSize, Lazy
  std::optional<Failure> failure;  // the call threw
  int64_t input = -1;              // Read: the trace input it returned; -1: a key the call wrote
};

struct Recording {
  Guard guard;
  Effects effects;
  std::vector<Event> tape;
  std::vector<at::Tensor> inputs;     // per guard read: a copy taken when it was read
  std::vector<at::Tensor> originals;  // per guard read: the tensor the call got
  std::string unsupported;            // why this call cannot be traced; empty when it can
  // The default CPU generator's state before and after the call, when the call drew from it
  // (undefined when this thread drew nothing): a trace must draw as it drew.
  at::Tensor rng_before, rng_after;
  // Per returned tensor of the eager call: whether it requires grad (a trace does not record
  // requires_grad set on a tensor the body made).
  std::vector<bool> returns_grad;
};

class Recorder final : public Observer {
 public:
  // Watches calls on root's dict made through a handle of `prefix`.
  Recorder(const TensorDict& root, const std::string& prefix, const std::vector<at::Tensor>& extra);

  at::Tensor read(ReadKind kind, const std::string& key, FunctionRef<at::Tensor()> real) override;
  Answer query(Query q, const std::string& key, FunctionRef<Answer()> real) override;
  const std::vector<int64_t>& batch_size(FunctionRef<const std::vector<int64_t>&()> real) override;
  void set(const std::string& key, const at::Tensor& value, FunctionRef<void()> real) override;
  void erase(const std::string& key, FunctionRef<void()> real) override;
  bool lazy(const std::string& key, const std::vector<std::string>& deps, std::string_view version,
            FunctionRef<bool()> real) override;
  void unsupported(std::string_view what) override;
  bool dry() const override { return false; }

  // The recording of the finished call; fn returned `returns` tensors.
  Recording finish(int64_t returns);

 private:
  struct PendingLazy {
    std::string key;
    std::vector<std::string> deps;
    std::string version;
  };
  bool touched(const std::string& key) const;
  // Adds a guard observation of q unless one of the same question exists.
  void observe(Query q, const std::string& key, const Answer& answer,
               std::optional<Failure> failure);
  // The answer over keys the call has not touched; for HasPrefix, Keys, Count.
  Answer untouched_answer(Query q, const std::string& prefix, const Answer& answer,
                          std::vector<std::string>* exclude) const;
  void precondition(Query q, const std::string& key);  // observes q now, without a tape event
  void touch(const std::string& key, bool present);
  void fail(Event e, const Error& error);  // records a call that threw

  const TensorDict::Impl& impl_;
  Recording rec_;
  std::set<std::string> guarded_;                // questions already in the guard
  std::map<std::string, int64_t> inputs_;        // read kind + key -> trace input
  std::set<std::string> touched_;                // keys this call set or erased
  std::vector<std::string> order_;               // in order of first touch
  std::map<std::string, bool> final_;            // key -> set (true) or erased (false) last
  std::vector<PendingLazy> pending_;             // get_or_compute calls computing now
  std::map<std::string, LazyInfo> lazy_writes_;  // keys last written by get_or_compute
};

class Replayer final : public Observer {
 public:
  // inputs: the traced tensors standing for rec.inputs.
  Replayer(const TensorDict& root, const Recording& rec, std::vector<at::Tensor> inputs);

  at::Tensor read(ReadKind kind, const std::string& key, FunctionRef<at::Tensor()> real) override;
  Answer query(Query q, const std::string& key, FunctionRef<Answer()> real) override;
  const std::vector<int64_t>& batch_size(FunctionRef<const std::vector<int64_t>&()> real) override;
  void set(const std::string& key, const at::Tensor& value, FunctionRef<void()> real) override;
  void erase(const std::string& key, FunctionRef<void()> real) override;
  bool lazy(const std::string& key, const std::vector<std::string>& deps, std::string_view version,
            FunctionRef<bool()> real) override;
  void unsupported(std::string_view what) override;
  bool dry() const override { return true; }

  // The returned tensors (as many as the recording returned) + final values of the effects'
  // writes, then lazy writes. Throws Error when the replay did not follow the whole tape.
  std::vector<at::Tensor> outputs(const std::vector<at::Tensor>& returned) const;

 private:
  const Event& next(Event::Op op, const std::string& key, uint8_t sub);

  const Recording& rec_;
  std::vector<at::Tensor> inputs_;
  bool persistent_;
  size_t pos_ = 0;
  std::map<std::string, at::Tensor> overlay_;  // keys written under the tracer; undefined: erased
};

// A private copy for tracing and checking, so in-place updates of the original happen once.
at::Tensor trace_copy(const at::Tensor& t);

}  // namespace tdstore::detail
