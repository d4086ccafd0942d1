// Memory for the batches a Loader hands out, reused once a batch's tensor is released.
//
// A fresh batch buffer of a few hundred KiB comes from mmap in glibc's allocator (or from a
// heap it trims again), so filling it page-faults every page: on virtual machines that costs
// more than the gather itself. The pool keeps released buffers and hands them out again.
// Invariant: a buffer is in the free list only after the last tensor (or view) over it is
// gone; its storage's deleter is what puts it there. Internal to src/.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <memory>

namespace tdstore::detail {

class BatchBuffers {
 public:
  // Keeps at most `max_free` released buffers (the oldest is freed first); the buffers in use
  // are not bounded here (the loader's prefetch bounds them).
  explicit BatchBuffers(size_t max_free);
  ~BatchBuffers();
  BatchBuffers(const BatchBuffers&) = delete;
  BatchBuffers& operator=(const BatchBuffers&) = delete;

  // An uninitialized contiguous CPU tensor whose memory is a released buffer of the same byte
  // size when there is one. Thread safe; tensors may outlive this object (their buffers are
  // then freed on release).
  at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype);

  // Buffers waiting for reuse, and buffers allocated since construction (tests).
  size_t free_buffers() const;
  size_t allocations() const;

  // Changes the bound; frees released buffers beyond it.
  void set_max_free(size_t max_free);

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

}  // namespace tdstore::detail
