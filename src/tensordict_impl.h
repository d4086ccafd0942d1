// Shared state behind TensorDict handles. Internal to src/.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "src/packed_part.h"
#include "storage/messages.h"
#include "storage/mutex.h"
#include "storage/store.h"
#include "tdstore/tensordict.h"

namespace tdstore {

using storage::in_quotes;
using storage::shape_text;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct TDSTORE_HIDDEN TensorDict::Impl {
  std::vector<int64_t> batch_size;

  // In memory: the leaves and attributes themselves.
  std::map<std::string, at::Tensor, std::less<>> tensors;
  std::map<std::string, std::string, std::less<>> attrs;

  // Persistent: the store, and views already handed out (dropped when their key changes or
  // the snapshot moves). `mu` guards `views` so that const calls may run concurrently.
  std::unique_ptr<storage::Store> store;
  Compression compression;  // of keys set without one of their own (StoreOptions::compression)
  mutable storage::Mutex mu;
  struct View {
    at::Tensor tensor;  // the stored tensor (a ragged key's values)
    bool ragged;        // get() pads it with the offsets of the companion key
  };
  mutable std::unordered_map<std::string, View, StringHash, std::equal_to<>> views GUARDED_BY(mu);

  // Lazy properties kept in memory: an in-memory dict's provenance, or a read-only store's
  // results that could not be persisted (tensor kept beside its provenance).
  struct MemoryLazy {
    LazyInfo info;
    // In-memory dicts: the property's stamp when stored. Read-only stores: the result's own
    // stamp, which properties computed from it record as their dependency's fingerprint.
    uint64_t property_fingerprint = 0;
    at::Tensor result;  // read-only stores: the unpersisted result
  };
  std::map<std::string, MemoryLazy, std::less<>> lazy;
  LazyStats lazy_stats;
  // In memory: a stamp per key standing in for content checksums, renewed by every set() and,
  // when a key's tensors were written in place since (through any view: their version counter,
  // which views share, moved), by the next look at it (stamp(), under mu: a const call).
  struct Stamp {
    uint64_t value = 0;
    int64_t version = 0;  // version_of(key) when `value` was given
  };
  mutable std::map<std::string, Stamp, std::less<>> stamps;
  mutable uint64_t next_stamp = 0;
  int64_t reserve_rows = 0;  // TensorDict::reserve hint

  // After TensorDict::close(): every field above is empty and `closed_where` names what the
  // dict was (the store directory), for ClosedError and printing.
  bool closed = false;
  std::string closed_where;

  bool persistent() const { return store != nullptr; }

  // set() without its checks, for builders whose keys and shapes are valid by construction
  // (the Loader's batches: keys of a valid source, rows gathered from it).
  // REQUIRES: in memory; k a valid full key clashing with no leaf; t's sizes start with
  // batch_size; t's dtype storable.
  void insert_unchecked(std::string k, at::Tensor t) {
    tensors.insert_or_assign(k, std::move(t));
    renew_stamp(k);
  }
  // In memory: a new stamp for key k, whose tensors are in `tensors`.
  void renew_stamp(const std::string& k) const { stamps[k] = {++next_stamp, version_of(k)}; }
  // The sum of the version counters of k's tensors (a ragged key's values and offsets): it
  // grows with every in-place write into them. 0 for inference tensors, which keep none.
  int64_t version_of(std::string_view k) const;
  // k's stamp now (renewed first when its tensors were written in place since); nullopt when
  // k has none. Takes mu.
  std::optional<uint64_t> stamp(std::string_view k) const;

  // The dict's state without observation (src/observer.h); keys are full paths.
  std::vector<std::string> keys_under(std::string_view prefix) const;  // sorted, no companions
  int64_t count_under(std::string_view prefix) const;
  bool contains(std::string_view full) const;
  bool has_prefix(std::string_view prefix) const;  // prefix ends with '/'
  at::Tensor get(std::string_view full) const;     // a ragged key padded; KeyError when absent
  // The stored tensor (a ragged key's values, unpadded); `ragged` tells which.
  at::Tensor stored(std::string_view full, bool* ragged = nullptr) const;
  bool is_leaf(std::string_view full) const;
  // KeyError's message for a key that is not there: where, the key, and what is there instead
  // (the closest keys by spelling, and every key of a dict of a few). O(keys). Takes mu.
  std::string missing_key(std::string_view full) const;
  // A dense key stored compressed, its block index read and checked (CorruptionError naming
  // the key otherwise); nullptr for any other key (raw, ragged, absent, in memory). Bypasses
  // observers: callers under one read through get(). O(blocks).
  std::shared_ptr<const detail::PackedPart> packed(std::string_view full) const;
  // set()'s rule, asked through detail::for_each_set_question (src/observer.h): ReadOnlyError
  // on a read-only store; ShapeError unless `shape` (when given; a ragged key's rows are
  // checked by set_ragged) starts with the batch size; KeyError when an ancestor of k is a leaf
  // or k is a prefix of other keys.
  void check_set(const std::string& k, std::optional<c10::IntArrayRef> shape) const;
};

namespace detail {
// Backs t's memory with huge pages where the kernel has them (Env::Advice::HugePages) when t is
// about to be written whole and is large enough to have a mapping of its own (2 MiB or more:
// advising a smaller one, which the malloc heap holds, would split the heap's mapping).
void advise_huge_pages(const at::Tensor& t);

// The batch dims td.index(idx) gives: idx a bool mask over leading batch dims or an integral
// tensor of rows of batch dim 0 in range (ShapeError, IndexError naming td otherwise).
std::vector<int64_t> batch_of_index(const TensorDict& td, const at::Tensor& idx);

// Runs write() as one change of td: on a store in a write group, undone whole when it throws;
// in memory with the dict's tensors and stamps put back when it throws.
void all_or_nothing(TensorDict& td, const std::function<void()>& write);

// Internal access to a handle's shared state (src/ only).
struct Access {
  static TensorDict::Impl& impl(const TensorDict& td) { return *td.impl_; }
  // The handle on the whole dict (no prefix).
  static TensorDict root(const TensorDict& td) { return TensorDict(td.impl_.ptr(), ""); }
  // "" or the sub-dict's prefix, ending with '/'.
  static const std::string& prefix(const TensorDict& td) { return td.prefix_; }
};
}  // namespace detail

// Ragged rows `idx` (all rows when undefined) zero-padded to the longest: {padded, lengths}.
std::pair<at::Tensor, at::Tensor> pad_ragged(const at::Tensor& values, const at::Tensor& offsets,
                                             const at::Tensor& idx = at::Tensor());

// What error messages name: the store directory, or "in-memory TensorDict".
std::string where(const TensorDict::Impl& impl);

inline std::string where(const TensorDict& td) { return where(detail::Access::impl(td)); }

// storage::shape_text of a libtorch shape.
std::string shape_string(at::IntArrayRef shape);

}  // namespace tdstore
