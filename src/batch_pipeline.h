// The worker pipeline of one Loader epoch, apart from what a batch is (torch-free, so clang's
// thread-safety analysis checks it: build-san compiles its test). Workers claim batch numbers
// in order and gather them outside the lock; the consumer takes them in order; the read-ahead
// thread follows the consumer and reports the windows it has copied; the first error is what
// the consumer sees. Everything shared lives under one annotated mutex, and every wait is a
// method here. Thread-safe; internal to src/ (src/loader_state.h).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <utility>

#include "storage/mutex.h"

namespace tdstore::detail {

template <class Batch>
class BatchPipeline {
 public:
  // A new epoch from batch `from` of `total`: nothing claimed, ready or failed, not stopped;
  // `claimed_ahead` batches may be claimed past the one the consumer takes next (>= 1).
  void reset(int64_t from, int64_t total, int64_t claimed_ahead) EXCLUDES(mu_) {
    storage::MutexLock l(&mu_);
    ready_.clear();
    error_ = nullptr;
    stop_ = false;
    next_claim_ = consumed_ = from;
    total_ = total;
    ahead_ = std::max<int64_t>(1, claimed_ahead);
    filled_ = -1;
  }

  // A worker's next batch, waiting while `claimed_ahead` batches past the consumer are
  // claimed; nullopt once stopped or when every batch is claimed.
  std::optional<int64_t> claim() EXCLUDES(mu_) {
    storage::MutexLock l(&mu_);
    while (!stop_ && next_claim_ < total_ && next_claim_ >= consumed_ + ahead_) cv_.wait(mu_);
    if (stop_ || next_claim_ >= total_) return std::nullopt;
    return next_claim_++;
  }

  // Batch b, gathered by a worker.
  void put(int64_t b, Batch batch) EXCLUDES(mu_) {
    {
      storage::MutexLock l(&mu_);
      ready_.emplace(b, std::move(batch));
    }
    cv_.notify_all();
  }

  // A worker's or the read-ahead thread's failure: the first one is rethrown to the consumer.
  void fail(std::exception_ptr e) EXCLUDES(mu_) {
    {
      storage::MutexLock l(&mu_);
      if (!error_) error_ = std::move(e);
    }
    cv_.notify_all();
  }

  // The consumer: batch b once a worker put it, or the first error rethrown.
  Batch take(int64_t b) EXCLUDES(mu_) {
    Batch batch;
    {
      storage::MutexLock l(&mu_);
      while (!error_ && !ready_.count(b)) cv_.wait(mu_);
      if (error_) std::rethrow_exception(error_);
      auto it = ready_.find(b);
      batch = std::move(it->second);
      ready_.erase(it);
      consumed_ = b + 1;
    }
    cv_.notify_all();
    return batch;
  }

  // The consumer gathered batch b itself (no workers).
  void took(int64_t b) EXCLUDES(mu_) {
    {
      storage::MutexLock l(&mu_);
      consumed_ = b + 1;
    }
    cv_.notify_all();
  }

  // Ends the epoch: every wait returns.
  void stop() EXCLUDES(mu_) {
    {
      storage::MutexLock l(&mu_);
      stop_ = true;
    }
    cv_.notify_all();
  }

  // The read-ahead thread: waits until `ready(consumed)` holds for the number of batches
  // taken; false once stopped (which wins over `ready`).
  template <class Ready>
  bool wait_for_consumer(Ready ready) EXCLUDES(mu_) {
    storage::MutexLock l(&mu_);
    while (!stop_ && !ready(consumed_)) cv_.wait(mu_);
    return !stop_;
  }

  // The read-ahead thread, after the epoch's last window: waits until every batch is taken;
  // false when stopped before.
  bool wait_all_taken() EXCLUDES(mu_) {
    storage::MutexLock l(&mu_);
    while (!stop_ && consumed_ < total_) cv_.wait(mu_);
    return consumed_ >= total_;
  }

  // The read-ahead thread copied window w (windows are copied in order).
  void filled(int64_t w) EXCLUDES(mu_) {
    {
      storage::MutexLock l(&mu_);
      filled_ = w;
    }
    cv_.notify_all();
  }

  // A worker: waits until window `need` is copied; false when stopped first (nobody takes the
  // batch); a window's failure rethrown.
  bool wait_filled(int64_t need) EXCLUDES(mu_) {
    storage::MutexLock l(&mu_);
    while (!stop_ && !error_ && filled_ < need) cv_.wait(mu_);
    if (error_) std::rethrow_exception(error_);
    return filled_ >= need;
  }

 private:
  storage::Mutex mu_;
  std::condition_variable_any cv_;                  // any change below
  std::map<int64_t, Batch> ready_ GUARDED_BY(mu_);  // gathered, not yet taken
  std::exception_ptr error_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  int64_t next_claim_ GUARDED_BY(mu_) = 0;  // the next batch a worker claims
  int64_t consumed_ GUARDED_BY(mu_) = 0;    // batches before it are taken
  int64_t total_ GUARDED_BY(mu_) = 0;
  int64_t ahead_ GUARDED_BY(mu_) = 1;
  int64_t filled_ GUARDED_BY(mu_) = -1;  // the last window copied
};

}  // namespace tdstore::detail
