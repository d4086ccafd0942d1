// Random numbers a compiled call draws from the default CPU generator, seen per thread: a
// trace and a first-call check run the function more than once, and only the draws of this
// thread are theirs to undo or compare (another thread drawing meanwhile is not a difference).
// Internal to src/.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

#include <cstdint>

namespace tdstore::detail {

// The default CPU generator's state, and setting it (under the generator's own mutex).
at::Tensor default_rng_state();
void set_default_rng_state(const at::Tensor& state);

// While it lives, counts the operators this thread runs whose schema takes a Generator (every
// kernel that draws random numbers takes one: dropout reaches bernoulli_, randn reaches
// normal_). Thread-local: operators other threads run are not seen. Not copyable.
class DrawWatch {
 public:
  DrawWatch();
  ~DrawWatch();
  DrawWatch(const DrawWatch&) = delete;
  DrawWatch& operator=(const DrawWatch&) = delete;

  // Whether this thread ran a drawing operator since the watch was made.
  bool drew() const;

 private:
  at::CallbackHandle handle_;
  uint64_t start_;
};

// Puts the default CPU generator back where it was when made, if this thread drew from it
// meanwhile: the runs of a call that are not its one eager run (the trace of a miss, the graph
// run a first call is compared with) draw numbers eager would not have drawn. A scope that drew
// nothing leaves the generator alone, so the draws of other threads are never undone; one that
// drew rewinds it, and a draw another thread made in that window is made again.
class RngRestore {
 public:
  RngRestore();
  ~RngRestore();
  RngRestore(const RngRestore&) = delete;
  RngRestore& operator=(const RngRestore&) = delete;

 private:
  at::Tensor state_;
  DrawWatch watch_;
};

}  // namespace tdstore::detail
