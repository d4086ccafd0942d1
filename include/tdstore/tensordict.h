// TensorDict: named tensors sharing leading batch dimensions, nested by '/' paths
// ("next/obs"), either in memory or persistent in a store directory (docs/FORMAT.md).
//
// A TensorDict is a cheap handle with shared state, like at::Tensor: copies refer to the same
// dict. A sub-dict (sub("next")) is a handle on the same state restricted to a prefix.
//
// Persistent dicts: set() writes the tensor's bytes into the store at once (never over
// committed bytes) and stages the key; commit() makes every staged change durable and visible
// at once; a process killed at any instant leaves the last committed state. One writer per
// store across processes (LockError for the second); any number of readers, each reading the
// generation committed when it opened or last called refresh().
//
// Tensors returned by get() on a persistent dict are zero-copy views of the store's mapping.
// They stay valid as long as the tensor lives, even after the dict is closed. Writes into
// them are copy-on-write and private to this process: they never reach the store; call set()
// or set_rows() (td[i] = row).
//
// Thread safety: const member functions may be called concurrently; any call that modifies
// the dict (set, erase, commit, refresh, ...) requires that no other call runs at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tdstore/errors.h"
#include "tdstore/export.h"
#include "tdstore/handle_state.h"
#include "tdstore/keys.h"
#include "tdstore/options.h"

namespace tdstore {

namespace detail {
struct Access;
}

// Provenance of a lazy property (TensorDict::get_or_compute).
struct LazyInfo {
  std::string key;  // full path of the property
  // Each dependency with its fingerprint at compute time: for a persistent dict, the xxh3 of
  // its content checksum, dtype, shape and (ragged keys) offsets (docs/FORMAT.md); for an
  // in-memory one, a modification stamp renewed by every set().
  std::vector<std::pair<std::string, uint64_t>> deps;
  // Each dependency's xxh3 content checksum at compute time (0 in memory), in deps' order.
  std::vector<uint64_t> dep_checksums;
  std::string version;
  int64_t computed_at_ns = 0;  // wall clock, ns since the Unix epoch
  int64_t compute_ns = 0;      // how long fn ran
  bool valid = false;          // every dep and the property itself unchanged since
  bool persisted = false;      // stored in the catalog (false for in-memory results)
};

struct LazyStats {
  int64_t computed = 0;       // calls that ran fn
  int64_t reused = 0;         // calls served by a valid stored property
  int64_t not_persisted = 0;  // computed on a read-only store: returned, not stored
};

class TDSTORE_API TensorDict {
 public:
  // An empty in-memory dict.
  explicit TensorDict(std::vector<int64_t> batch_size = {});

  // Creates a new persistent store in `dir` (which must not exist, or be empty) and opens it
  // for writing. Throws Error (bad options, path in use), IOError.
  static TensorDict create(const std::filesystem::path& dir, std::vector<int64_t> batch_size,
                           StoreOptions options = {});
  // Opens an existing store. Throws FormatError (not a store, newer format), CorruptionError,
  // LockError (ReadWrite while another writer is active), IOError.
  static TensorDict open(const std::filesystem::path& dir, OpenMode mode = OpenMode::ReadOnly,
                         StoreOptions options = {});

  bool is_persistent() const;
  bool is_writable() const;  // in-memory dicts are writable
  // The store directory; empty for in-memory dicts.
  std::filesystem::path path() const;
  // The prefix of a sub-dict ("next/"), empty for a root dict.
  const std::string& prefix() const { return prefix_; }
  // Committed generation of a persistent dict (0 for a new store); 0 in memory.
  uint64_t generation() const;

  const std::vector<int64_t>& batch_size() const;
  int64_t batch_dims() const { return static_cast<int64_t>(batch_size().size()); }
  // Number of leaf tensors (under the prefix, for a sub-dict).
  int64_t size() const;
  // Leaf paths like "next/obs", sorted; relative to the prefix for a sub-dict.
  std::vector<std::string> keys() const;
  // True when key is a leaf. For a prefix of leaves use has_prefix().
  bool contains(std::string_view key) const;
  bool has_prefix(std::string_view prefix) const;
  // KeyError when absent.
  at::Tensor get(std::string_view key) const;
  // Stores value under key. ShapeError unless value's leading dims equal batch_size();
  // DTypeError for dtypes outside the registry; KeyError for an empty key, an empty path
  // component, a NUL byte, more than 304 bytes, or a path whose ancestor is a leaf.
  // In memory the dict holds value itself (no copy); a persistent dict copies its bytes.
  // IOError when they cannot be written; tensors of at most 4 KiB are written together with
  // the next ones (docs/DESIGN.md, "Commit protocol"), so their IOError comes from a later
  // call and breaks the handle, as a failed commit() does.
  void set(std::string_view key, const at::Tensor& value);
  // set() with the key's own compression (docs/FORMAT.md, "Compressed keys"; ArgumentError for
  // a level or block size out of range); set(key, value) uses the handle's,
  // StoreOptions::compression. A compressed key's get() returns a new tensor decompressed from
  // the store, which the caller owns (nothing is kept by the dict); a raw key's is a view of the
  // mapping. In memory the dict holds value itself: compression applies when a store writes it.
  void set(std::string_view key, const at::Tensor& value, const Compression& compression);
  // The compression set(key, value) applies: StoreOptions::compression, or the store's
  // recorded default; none in memory.
  Compression compression() const;
  // The compression `key` is stored with (its level and block size as its block index records
  // them): none for a raw key and in memory. KeyError when absent; CorruptionError naming the
  // key when its block index is damaged. O(blocks). Under a compile recording the call runs
  // eagerly (it is not a read the compile cache models).
  Compression compression_of(std::string_view key) const;
  // A sub-dict as a value: replaces what is under "key/" (and a leaf named key) with value's
  // leaves under "key/", as assigning a sub-dict in tensordict does. value may be a view of
  // this dict (its leaves are taken first). All or nothing, as update().
  void set(std::string_view key, const TensorDict& value);
  // KeyError when absent.
  void erase(std::string_view key);
  // Grows batch dim 0 by the rows of `rows`, a dict with the same keys, dtypes and trailing
  // shapes (the first append to a dict without keys creates them). Persistent: rows are written
  // after the stored ones without moving them while the key's reserved capacity lasts, else the
  // key moves to an extent four times as large (amortized O(rows), about a third of the bytes
  // copied once; none with reserve()); visible at the next commit, all
  // keys at once. KeyError, DTypeError, ShapeError before anything is written; on an IOError
  // or CapacityError the append is undone as a whole and changes staged before it stay staged
  // (tests/write_group_test.cpp). REQUIRES: a root handle (no prefix).
  void append(const TensorDict& rows);
  // Capacity hint for batch dim 0: extents allocated by later appends hold at least this many
  // rows, so a dataset whose size is known is written without moving anything.
  void reserve(int64_t rows);
  // Persistent: makes every change since the last commit durable and visible at once
  // (all or nothing). In memory: no-op.
  void commit();
  // Persistent: drops every change since the last commit.
  void rollback();
  // Readers: move to the newest committed generation. Returns true when it changed (lazy
  // properties computed in memory by this handle are forgotten then).
  bool refresh();
  // Re-hashes stored bytes; returns the keys whose xxh3 checksum does not match (persistent
  // only; an in-memory dict returns none). Through a root handle it also decodes the catalog:
  // a damaged record is listed as "/catalog/<record key>" (never a key, which has no empty
  // component).
  std::vector<std::string> verify() const;

  // String attributes of the dict (store attributes in the LMDB catalog when persistent),
  // staged and committed with the tensors.
  void set_attr(std::string_view name, std::string value);
  void erase_attr(std::string_view name);
  std::optional<std::string> attr(std::string_view name) const;
  std::vector<std::string> attr_names() const;

  // ---- ragged keys: rows of varying length in the first non-batch dimension, stored as
  // values [total, ...] plus int64 offsets [rows + 1]: row i is values[offsets[i]:offsets[i+1]].
  // REQUIRES: one batch dim. get() of a ragged key returns its rows zero-padded to the longest,
  // [rows, max_len, ...]; a Loader batch holds them padded plus "<key>.lengths".
  struct Ragged {
    at::Tensor values;
    at::Tensor offsets;
  };
  // ShapeError unless offsets is int64 [rows + 1], starts at 0, never decreases and ends at
  // values.size(0).
  void set_ragged(std::string_view key, const at::Tensor& values, const at::Tensor& offsets);
  // Rows as tensors [length, ...]: ShapeError unless every row has row 0's dims after the
  // first, DTypeError unless its dtype (naming the row).
  void set_ragged(std::string_view key, const std::vector<at::Tensor>& rows);
  Ragged get_ragged(std::string_view key) const;  // KeyError unless key is ragged
  bool is_ragged(std::string_view key) const;

  // ---- lazy properties (docs/DESIGN.md, "Lazy properties")

  // Returns the property stored under key when its provenance is still valid: every dep
  // present with the fingerprint it had when the property was computed, the same version
  // string, and the property itself unchanged. Otherwise calls fn(*this), stores the result
  // under key with its provenance and returns it. On a writable persistent dict the result and
  // its provenance are committed together (this commits every change staged before the call
  // too). On a read-only store the result is computed in memory, kept for this handle, counted
  // in lazy_stats().not_persisted and reported once on stderr; nothing is written. Through
  // this handle the key then reads as that result (get(), and the deps of other properties:
  // one computed from the stale stored value is stale too), until refresh() moves to another
  // generation and forgets it.
  // KeyError when a dep is absent (fn is not called). Error, and nothing stored, when a dep
  // changed while fn ran (another thread wrote it) or is a stale lazy property. Checking
  // validity compares stored checksums; it never re-hashes the deps.
  at::Tensor get_or_compute(std::string_view key, std::vector<std::string> deps,
                            std::function<at::Tensor(const TensorDict&)> fn,
                            std::string_view version = "");
  // Provenance of every lazy property (stored or computed in memory), sorted by key.
  std::vector<LazyInfo> lazy_properties() const;
  std::optional<LazyInfo> lazy_info(std::string_view key) const;
  // Forgets a property's provenance (the tensor stays): the next get_or_compute recomputes.
  // Returns false when key has none. Staged like set().
  bool invalidate(std::string_view key);
  LazyStats lazy_stats() const;

  // ---- tensordict operations. They return in-memory dicts whose leaves are views where
  // libtorch makes views (int, slice), and copies otherwise (index tensors, clone).

  // The dict of keys under "prefix/", sharing state with this one (writes go through).
  TensorDict sub(std::string_view prefix) const;
  // Deep copy into memory (ragged keys stay ragged; attributes are copied).
  TensorDict clone() const;
  // Indexing along batch dim 0: an integer (negative counts from the end), a slice, an integer
  // index tensor, or a bool mask over the leading batch dims (a uint8 tensor is a mask, as in
  // torch; IndexError for a floating index tensor). Ragged keys keep their rows'
  // true lengths: a slice, index tensor or mask gives them ragged again (a 1-d index or mask;
  // ShapeError naming the key otherwise), an integer gives the row itself, [length, ...]. A
  // compressed key's rows are decompressed from only the blocks holding them, each once (an
  // integer, a slice, an index tensor, a 1-d mask), except under a compile recording, where
  // the whole key is read through get().
  TensorDict index(int64_t i) const;
  TensorDict slice(int64_t start, int64_t end, int64_t step = 1) const;
  TensorDict index(const at::Tensor& indices_or_mask) const;
  // Keys (or whole prefixes; a trailing '/' names the prefix) kept or dropped. Ragged keys stay
  // ragged. select: KeyError naming the first name that is neither a key nor a prefix.
  TensorDict select(const std::vector<std::string>& keys) const;
  TensorDict exclude(const std::vector<std::string>& keys) const;
  // fn applied to every leaf; the result must keep the batch dims (ShapeError otherwise)
  // unless new_batch_size is given.
  TensorDict apply(const std::function<at::Tensor(const at::Tensor&)>& fn,
                   std::optional<std::vector<int64_t>> new_batch_size = std::nullopt) const;
  // Every leaf of other set into this dict (ragged keys as ragged), all or nothing: when a leaf
  // is refused (KeyError, ShapeError, DTypeError, CapacityError, IOError) the dict is as it was.
  void update(const TensorDict& other);
  // Dicts with the same keys joined along a batch dim. Everything is checked before anything
  // is joined: KeyError naming a key that is not in every dict; ShapeError naming the dict and
  // both batch sizes (stack: equal; cat: equal but in dim), or the key and both shapes. Ragged
  // keys are joined by cat along dim 0 (stack refuses them).
  static TensorDict stack(const std::vector<TensorDict>& dicts, int64_t dim = 0);
  static TensorDict cat(const std::vector<TensorDict>& dicts, int64_t dim = 0);

  // ---- writing rows: td[i] = row, td[a:b] = rows, td[mask] = rows

  // Writes `rows` into the rows an index selects (the index as index() and slice() take it),
  // as `t[index] = value` does for each key of rows; keys rows does not hold are unchanged.
  // rows' keys must be dense keys of this dict (KeyError naming the first that is not;
  // ShapeError for a ragged key: set_ragged() it whole); each value must broadcast to its key's
  // selected rows, once leading dims of 1 beyond theirs are dropped (as torch does; ShapeError
  // naming the key and both shapes otherwise), and is cast to the key's dtype. Everything is
  // checked before anything is written; all or nothing; selecting no row changes nothing.
  //  - In memory: written into the leaves in place (views of them see the rows), except a leaf
  //    over memory the dict does not own (a view of a store, from_blob, numpy) or with
  //    overlapping elements (expand), which is copied first and replaced. A value sharing memory
  //    with a leaf written is read first; when torch refuses a write (ArgumentError naming the
  //    key), the rows written before it are put back.
  //  - Persistent: each key rows holds is rewritten whole into new bytes and staged until
  //    commit(), keeping its compression: O(the key's bytes) per call (assign many rows at once:
  //    td[a:b] = rows). Committed bytes, and tensors read before, never change.
  //    ReadOnlyError on a read-only store.
  // Under a compile recording the call runs eagerly.
  void set_rows(int64_t i, const TensorDict& rows);
  void set_rows(int64_t start, int64_t end, int64_t step, const TensorDict& rows);
  void set_rows(const at::Tensor& indices_or_mask, const TensorDict& rows);

  // ---- tensordict's reshaping, renaming and comparison. Results are in-memory dicts.

  // Along batch dim `dim` (negative counts from the end): split into pieces of `size` rows (the
  // last one shorter) or of the given sizes (ShapeError unless they sum to the dim's size);
  // chunk into `chunks` pieces of ceil(n / chunks) rows (fewer when n is small, `chunks` empty
  // ones when n is 0, as torch.chunk);
  // unbind into one dict per row, without the dim. Along dim 0 the pieces are slice()s (ragged
  // and compressed keys read as slice() reads them); along another dim a ragged key is a
  // ShapeError.
  std::vector<TensorDict> split(int64_t size, int64_t dim = 0) const;
  std::vector<TensorDict> split(const std::vector<int64_t>& sizes, int64_t dim = 0) const;
  std::vector<TensorDict> chunk(int64_t chunks, int64_t dim = 0) const;
  std::vector<TensorDict> unbind(int64_t dim = 0) const;
  // Regroups an in-memory dict's batch dims: every leaf's leading dims must equal batch_size
  // (ShapeError naming the first that does not; a ragged key allows one batch dim). A store's
  // batch size is its rows: ArgumentError (regroup a clone() or select()).
  void set_batch_size(std::vector<int64_t> batch_size);
  // The same leaves with '/' in their keys replaced by sep (flatten_keys: "a/b" -> "a.b"), or
  // sep replaced by '/' (unflatten_keys: "a.b" -> "a/b"). KeyError when two keys map to one,
  // or a key would be invalid. Ragged keys stay ragged.
  TensorDict flatten_keys(std::string_view sep = ".") const;
  TensorDict unflatten_keys(std::string_view sep = ".") const;
  // Moves key `from` (a leaf, with its rows, ragged or compressed as it is) to `to`: KeyError
  // when from is absent or to exists (or clashes with a leaf or prefix). In memory the tensor
  // moves; a store writes its bytes under the new key and erases the old one, staged, all or
  // nothing. A lazy property's provenance stays behind: the renamed key is a plain key.
  void rename_key(std::string_view from, std::string_view to);
  // Leaves on one device: cast to dtype (a ragged key's values; its offsets stay int64;
  // DTypeError for a dtype outside the registry), or moved to device (ArgumentError naming it
  // when torch cannot). to(device) returns this dict itself when every leaf is already there.
  TensorDict to(at::ScalarType dtype) const;
  TensorDict to(at::Device device) const;
  // The device every leaf is on: CPU for a store; in memory, nullopt when the leaves are on
  // different devices or there are none.
  std::optional<at::Device> device() const;
  // Elementwise comparison key by key, as tensordict's == and !=: a dict of bool tensors with
  // this dict's keys and batch size. other: a dict with the same keys (KeyError naming one that
  // is not in both) whose leaves broadcast to this one's (ShapeError naming the key); or a
  // tensor or number compared with every leaf. A ragged key compares its padded get().
  TensorDict eq(const TensorDict& other) const;
  TensorDict ne(const TensorDict& other) const;
  TensorDict eq(const at::Tensor& other) const;
  TensorDict ne(const at::Tensor& other) const;
  // True when every element of every leaf is nonzero (all; true for a dict without keys), or
  // some element of some leaf is (any).
  bool all() const;
  bool any() const;

  // "TensorDict(batch_size=[8], keys=3)" followed by one indented line per leaf with dtype
  // and shape, grouped by nesting level; "TensorDict(closed, was <path>)" once closed.
  std::string to_string() const;

  // ---- closing

  // Closes the dict's shared state for every handle on it (copies, sub-dicts, loaders and
  // datasets reading it): a persistent dict unmaps its store, releases its writer lock and
  // closes its catalog now, not when the last handle goes; changes staged and not committed
  // are discarded, as when the last handle is destroyed. Tensors handed out by get() stay
  // valid (they pin their own mapping). Every later call on any handle of the dict throws
  // ClosedError naming the store, except close() (a no-op) and closed(). A modifying call:
  // no other call on the dict may run at once.
  void close();
  bool closed() const;  // never throws

  struct Impl;

 private:
  friend struct detail::Access;
  TensorDict(std::shared_ptr<Impl> impl, std::string prefix);
  std::string full_key(std::string_view key) const;
  detail::HandleState<std::shared_ptr<Impl>, detail::TensorDictTag> impl_;
  std::string prefix_;  // "" or ends with '/'
};

TDSTORE_API std::ostream& operator<<(std::ostream& os, const TensorDict& td);

}  // namespace tdstore
