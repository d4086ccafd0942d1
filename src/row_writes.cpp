// Writing rows: td[i] = row, td[a:b] = rows, td[mask] = rows (TensorDict::set_rows).
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/List.h>
#include <ATen/ops/index.h>
#include <ATen/ops/index_put.h>
#include <c10/core/InferenceMode.h>

#include "src/observer.h"
#include "src/tensordict_impl.h"

namespace tdstore {
namespace {

// One way of selecting rows: the batch shape it selects, how a value is put there, and a copy
// of what is there (to put back).
struct Selection {
  std::vector<int64_t> batch;                                      // the selected rows' batch dims
  std::function<void(at::Tensor& leaf, const at::Tensor& v)> put;  // v cast and broadcastable
  std::function<at::Tensor(const at::Tensor& leaf)> take;
};

// sel.put(leaf, v), torch's refusals as an ArgumentError naming the key.
void put(const Selection& sel, const std::string& w, const std::string& k, at::Tensor& leaf,
         const at::Tensor& v) {
  try {
    sel.put(leaf, v);
  } catch (const c10::Error& e) {
    throw ArgumentError(w + ": td[index] = rows: key " + in_quotes(k) + ": " +
                        e.what_without_backtrace());
  }
}

struct Write {
  std::string key;
  at::Tensor value;  // cast to the key's dtype, broadcastable to its selected rows
  at::Tensor leaf;   // in memory: the tensor written (the leaf, or a copy to replace it)
};

// In memory: into the leaves in place, all or nothing (what was there is put back when a write
// fails), each value read before any leaf it shares memory with is written.
void write_in_memory(TensorDict& td, const Selection& sel, const std::string& w,
                     std::vector<Write>& writes) {
  for (auto& x : writes) {
    x.leaf = td.get(x.key);
    // Memory the dict does not own (a store's mapping, from_blob, numpy) is never written, nor
    // one holding an element twice (expand).
    if (!x.leaf.has_storage() || !x.leaf.storage().resizable() ||
        at::has_internal_overlap(x.leaf) == at::MemOverlap::Yes)
      x.leaf = x.leaf.clone();
  }
  for (auto& x : writes)
    for (const auto& y : writes)
      if (at::get_overlap_status(y.leaf, x.value) != at::MemOverlapStatus::No) {
        x.value = x.value.clone();  // td[a] = td[b]: read before it is written
        break;
      }
  std::vector<at::Tensor> before;
  try {
    for (auto& x : writes) {
      before.push_back(sel.take(x.leaf));
      put(sel, w, x.key, x.leaf, x.value);
    }
  } catch (...) {
    // Torch may refuse a write after making it (an inference tensor): every leaf tried is put
    // back, with autograd's refusals off (what was there is written back, nothing is recorded).
    c10::InferenceMode restoring;
    for (size_t i = before.size(); i-- > 0;) sel.put(writes[i].leaf, before[i]);
    throw;
  }
  auto& impl = detail::Access::impl(td);
  for (auto& x : writes)
    impl.insert_unchecked(detail::Access::prefix(td) + x.key, x.leaf);  // a new stamp: changed
}

// rows written into the rows `sel` selects: every check first, then every write.
void write_rows(TensorDict& td, const Selection& sel, const TensorDict& rows) {
  auto& impl = detail::Access::impl(td);
  if (auto* o = detail::observer_for(&impl)) [[unlikely]]
    o->unsupported("set_rows()");  // not a modelled write: the call runs eagerly
  const std::string w = where(impl);
  if (td.is_persistent() && !td.is_writable())
    throw ReadOnlyError(w + ": td[index] = rows on a store opened read-only (mode 'r+' writes)");
  std::vector<Write> writes;
  for (const auto& k : rows.keys()) {
    if (!td.contains(k))
      throw KeyError(w + ": td[index] = rows: key " + in_quotes(k) +
                     " of the rows is not a key of the dict (set it whole first)");
    if (td.is_ragged(k) || rows.is_ragged(k))
      throw ShapeError(w + ": td[index] = rows: key " + in_quotes(k) +
                       " is ragged: its rows' lengths are its own; set_ragged() it whole");
    const at::Tensor leaf = td.get(k);
    std::vector<int64_t> target = sel.batch;
    target.insert(target.end(), leaf.sizes().begin() + td.batch_dims(), leaf.sizes().end());
    at::Tensor v = rows.get(k);
    while (v.dim() > static_cast<int64_t>(target.size()) && v.size(0) == 1)
      v = v.squeeze(0);  // leading dims of 1 beyond the rows' are dropped, as torch does
    if (!at::is_expandable_to(v.sizes(), target))
      throw ShapeError(w + ": td[index] = rows: key " + in_quotes(k) + ": the value's shape " +
                       shape_string(rows.get(k).sizes()) +
                       " does not broadcast to the selected rows' " + shape_string(target));
    writes.push_back({k, v.to(leaf.scalar_type()), at::Tensor()});
  }
  int64_t selected = 1;
  for (const int64_t b : sel.batch) selected *= b;
  if (writes.empty() || selected == 0) return;  // nothing is written, nothing changes
  if (!impl.persistent()) return write_in_memory(td, sel, w, writes);
  detail::all_or_nothing(td, [&] {
    for (auto& x : writes) {
      const Compression c = td.compression_of(x.key);
      at::Tensor leaf = td.get(x.key);        // a view of the mapping, or decompressed
      if (!c.enabled()) leaf = leaf.clone();  // never the mapping's bytes
      put(sel, w, x.key, leaf, x.value);
      td.set(x.key, leaf, c);
    }
  });
}

}  // namespace

void TensorDict::set_rows(int64_t i, const TensorDict& rows) {
  if (batch_dims() == 0)
    throw ShapeError(where(*impl_) + ": td[index] = rows on a dict with no batch dims");
  const int64_t n = batch_size()[0];
  const int64_t j = i < 0 ? i + n : i;
  if (j < 0 || j >= n)
    throw IndexError(where(*impl_) + ": index " + std::to_string(i) +
                     " out of range for batch dim 0 of size " + std::to_string(n));
  Selection sel{{batch_size().begin() + 1, batch_size().end()},
                [j](at::Tensor& leaf, const at::Tensor& v) { leaf.select(0, j).copy_(v); },
                [j](const at::Tensor& leaf) { return leaf.select(0, j).clone(); }};
  write_rows(*this, sel, rows);
}

void TensorDict::set_rows(int64_t start, int64_t end, int64_t step, const TensorDict& rows) {
  if (batch_dims() == 0)
    throw ShapeError(where(*impl_) + ": td[index] = rows on a dict with no batch dims");
  if (step <= 0)
    throw ShapeError(where(*impl_) + ": slice step must be positive, got " + std::to_string(step));
  const int64_t n = batch_size()[0];
  auto clamp = [n](int64_t x) { return std::clamp(x < 0 ? x + n : x, int64_t{0}, n); };
  const int64_t s = clamp(start), e = std::max(clamp(end), s);
  Selection sel{batch_size(),
                [=](at::Tensor& leaf, const at::Tensor& v) { leaf.slice(0, s, e, step).copy_(v); },
                [=](const at::Tensor& leaf) { return leaf.slice(0, s, e, step).clone(); }};
  sel.batch[0] = (e - s + step - 1) / step;
  write_rows(*this, sel, rows);
}

void TensorDict::set_rows(const at::Tensor& index, const TensorDict& rows) {
  // A uint8 index is a mask, as torch reads it.
  const at::Tensor idx = index.scalar_type() == at::kByte ? index.to(at::kBool) : index;
  const std::vector<int64_t> batch = detail::batch_of_index(*this, idx);
  c10::List<c10::optional<at::Tensor>> indices;
  indices.push_back(idx.scalar_type() == at::kBool ? idx.cpu() : idx.to(at::kCPU, at::kLong));
  Selection sel{batch,
                [indices](at::Tensor& leaf, const at::Tensor& v) { leaf.index_put_(indices, v); },
                [indices](const at::Tensor& leaf) { return at::index(leaf, indices); }};
  write_rows(*this, sel, rows);
}

}  // namespace tdstore
