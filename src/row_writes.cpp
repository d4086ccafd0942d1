// Writing rows: td[i] = row, td[a:b] = rows, td[mask] = rows (TensorDict::set_rows).
#include <ATen/ExpandUtils.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/core/List.h>
#include <ATen/ops/index_put.h>

#include "src/observer.h"
#include "src/tensordict_impl.h"

namespace tdstore {
namespace {

// One way of selecting rows: the batch shape it selects, and how a value is put there.
struct Selection {
  std::vector<int64_t> batch;                                      // the selected rows' batch dims
  std::function<void(at::Tensor& leaf, const at::Tensor& v)> put;  // v cast and broadcastable
};

// sel.put(leaf, v) with v copied first when it shares memory with leaf (td[a] = td[b]), and
// torch's refusals as an ArgumentError naming the key.
void put(const Selection& sel, const std::string& w, const std::string& k, at::Tensor& leaf,
         at::Tensor v) {
  if (at::get_overlap_status(leaf, v) != at::MemOverlapStatus::No) v = v.clone();
  try {
    sel.put(leaf, v);
  } catch (const c10::Error& e) {
    throw ArgumentError(w + ": td[index] = rows: key " + in_quotes(k) + ": " +
                        e.what_without_backtrace());
  }
}

// rows written into the rows `sel` selects: every check first, then every write.
void write_rows(TensorDict& td, const Selection& sel, const TensorDict& rows) {
  auto& impl = detail::Access::impl(td);
  if (auto* o = detail::observer_for(&impl)) [[unlikely]]
    o->unsupported("set_rows()");  // not a modelled write: the call runs eagerly
  const std::string w = where(impl);
  if (td.is_persistent() && !td.is_writable())
    throw ReadOnlyError(w + ": td[index] = rows on a store opened read-only (mode 'r+' writes)");
  struct Write {
    std::string key;
    at::Tensor value;
  };
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
    const at::Tensor v = rows.get(k);
    if (!at::is_expandable_to(v.sizes(), target))
      throw ShapeError(w + ": td[index] = rows: key " + in_quotes(k) + ": the value's shape " +
                       shape_string(v.sizes()) + " does not broadcast to the selected rows' " +
                       shape_string(target));
    writes.push_back({k, v.to(leaf.scalar_type())});
  }
  if (writes.empty()) return;
  if (!impl.persistent()) {
    for (auto& [k, v] : writes) {
      at::Tensor leaf = td.get(k);
      // Memory the dict does not own (a store's mapping, from_blob, numpy) is never written.
      if (!leaf.has_storage() || !leaf.storage().resizable() ||
          at::has_internal_overlap(leaf) != at::MemOverlap::No)
        leaf = leaf.clone();
      put(sel, w, k, leaf, v);
      impl.insert_unchecked(detail::Access::prefix(td) + k, leaf);  // a new stamp: changed
    }
    return;
  }
  detail::all_or_nothing(td, [&] {
    for (auto& [k, v] : writes) {
      const Compression c = td.compression_of(k);
      at::Tensor leaf = td.get(k);            // a view of the mapping, or decompressed
      if (!c.enabled()) leaf = leaf.clone();  // never the mapping's bytes
      put(sel, w, k, leaf, v);
      td.set(k, leaf, c);
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
                [j](at::Tensor& leaf, const at::Tensor& v) { leaf.select(0, j).copy_(v); }};
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
                [=](at::Tensor& leaf, const at::Tensor& v) { leaf.slice(0, s, e, step).copy_(v); }};
  sel.batch[0] = (e - s + step - 1) / step;
  write_rows(*this, sel, rows);
}

void TensorDict::set_rows(const at::Tensor& idx, const TensorDict& rows) {
  const std::vector<int64_t> batch = detail::batch_of_index(*this, idx);
  c10::List<c10::optional<at::Tensor>> indices;
  indices.push_back(idx.scalar_type() == at::kBool ? idx.cpu() : idx.to(at::kCPU, at::kLong));
  Selection sel{batch,
                [indices](at::Tensor& leaf, const at::Tensor& v) { leaf.index_put_(indices, v); }};
  write_rows(*this, sel, rows);
}

}  // namespace tdstore
