// TensorDict::append and reserve: growing batch dim 0.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include <algorithm>

#include "src/dtype_map.h"
#include "src/lazy_internal.h"
#include "src/observer.h"
#include "src/tensordict_impl.h"

namespace tdstore {
void TensorDict::reserve(int64_t rows) {
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    o->unsupported("reserve()");
  impl_->reserve_rows = std::max<int64_t>(rows, 0);
}

void TensorDict::append(const TensorDict& rows) {
  Impl& impl = *impl_;
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    o->unsupported("append()");
  const std::string w = where(impl);
  if (!prefix_.empty()) throw Error(w + ": append through a sub-dict handle; append to the root");
  const auto& batch = impl.batch_size;
  const auto& rb = rows.batch_size();
  if (batch.empty() || rb.size() != batch.size() ||
      !std::equal(batch.begin() + 1, batch.end(), rb.begin() + 1))
    throw ShapeError(w + ": cannot append rows of batch size " + shape_string(rb) +
                     " to batch size " + shape_string(batch) +
                     " (same rank, equal dims after the first, at least one batch dim)");
  const int64_t n = rb[0];
  auto mine = keys();
  auto theirs = rows.keys();
  bool creating = mine.empty() && batch[0] == 0;
  // Derived keys (lazy properties, row features) the rows do not hold are dropped: every
  // dependency grows, so none of them would stay valid.
  std::vector<std::string> stale;
  if (!creating) {
    for (const auto& k : detail::derived_keys(*this))
      if (!std::binary_search(theirs.begin(), theirs.end(), k)) stale.push_back(k);
    std::erase_if(mine, [&](const std::string& k) {
      return std::binary_search(stale.begin(), stale.end(), k);
    });
  }
  if (!creating && mine != theirs) {
    std::vector<std::string> missing, extra;
    std::set_difference(mine.begin(), mine.end(), theirs.begin(), theirs.end(),
                        std::back_inserter(missing));
    std::set_difference(theirs.begin(), theirs.end(), mine.begin(), mine.end(),
                        std::back_inserter(extra));
    throw KeyError(w + ": appended rows must hold the same keys: " +
                   (missing.empty() ? "" : "missing " + in_quotes(missing.front())) +
                   (missing.empty() || extra.empty() ? "" : ", ") +
                   (extra.empty() ? "" : "unexpected " + in_quotes(extra.front())));
  }
  // Validate everything before writing anything.
  std::vector<at::Tensor> values;
  for (const auto& k : theirs) {
    if (rows.is_ragged(k) || (!creating && is_ragged(k))) {
      if (!rows.is_ragged(k) || (!creating && !is_ragged(k)))
        throw ShapeError(w + ": key " + in_quotes(k) + " is ragged on one side only");
      if (!creating &&
          get_ragged(k).values.scalar_type() != rows.get_ragged(k).values.scalar_type())
        throw DTypeError(w + ": key " + in_quotes(k) + ": appending ragged rows of another dtype");
      values.push_back(at::Tensor());  // handled below
      continue;
    }
    at::Tensor v = rows.get(k);
    if (!creating) {
      at::Tensor cur = get(k);
      if (cur.scalar_type() != v.scalar_type())
        throw DTypeError(w + ": key " + in_quotes(k) + ": appending " +
                         std::string(c10::toString(v.scalar_type())) + " rows to " +
                         std::string(c10::toString(cur.scalar_type())));
      if (cur.dim() != v.dim() ||
          !std::equal(cur.sizes().begin() + 1, cur.sizes().end(), v.sizes().begin() + 1))
        throw ShapeError(w + ": key " + in_quotes(k) + ": rows of shape " +
                         shape_string(v.sizes()) + " do not extend shape " +
                         shape_string(cur.sizes()));
    } else if (!to_storage_dtype(v.scalar_type())) {
      throw DTypeError(w + ": key " + in_quotes(k) + ": dtype " +
                       std::string(c10::toString(v.scalar_type())) + " is not storable");
    }
    values.push_back(v);
  }
  std::vector<int64_t> grown = batch;
  grown[0] += n;

  auto ragged_rows = [&](const std::string& k) {  // rows' values and offsets shifted past ours
    auto r = rows.get_ragged(k);
    int64_t base = creating ? 0 : get_ragged(k).offsets[-1].item<int64_t>();
    return std::make_pair(r.values, r.offsets.slice(0, creating ? 0 : 1) + base);
  };
  if (!impl.persistent()) {
    // Every grown tensor is built first; the dict changes only once nothing can throw.
    std::vector<std::pair<std::string, at::Tensor>> grown_tensors;
    for (size_t i = 0; i < theirs.size(); ++i) {
      if (values[i].defined()) {
        grown_tensors.emplace_back(theirs[i],
                                   creating ? values[i] : at::cat({get(theirs[i]), values[i]}, 0));
        continue;
      }
      auto [v, off] = ragged_rows(theirs[i]);
      const std::string companion = storage::ragged_offsets_key(theirs[i]);
      grown_tensors.emplace_back(theirs[i],
                                 creating ? v : at::cat({impl.tensors.at(theirs[i]), v}, 0));
      grown_tensors.emplace_back(companion,
                                 creating ? off : at::cat({impl.tensors.at(companion), off}, 0));
    }
    for (const auto& k : stale) detail::drop_derived(*this, k);
    for (auto& [k, t] : grown_tensors) {
      impl.tensors[k] = std::move(t);
      if (k.find('\0') == std::string::npos) impl.stamps[k] = ++impl.next_stamp;
    }
    impl.batch_size = grown;
    return;
  }
  auto& store = *impl.store;
  {
    // Rows appended to every key, the batch size and the derived keys dropped: all or none,
    // whatever is thrown (a full arena or key directory, a failed write).
    storage::WriteGroup group(store);
    for (const auto& k : stale) detail::drop_derived(*this, k);
    store.set_batch_size(grown);
    for (size_t i = 0; i < theirs.size(); ++i) {
      if (!values[i].defined()) {
        auto [v, off] = ragged_rows(theirs[i]);
        at::Tensor vc = v.detach().cpu().contiguous();
        at::Tensor oc = off.detach().cpu().to(at::kLong).contiguous();
        const std::string companion = storage::ragged_offsets_key(theirs[i]);
        uint64_t vb = static_cast<uint64_t>(vc.numel()) * vc.element_size();
        uint64_t ob = static_cast<uint64_t>(oc.numel()) * 8;
        if (creating) {
          store.put(theirs[i], *to_storage_dtype(vc.scalar_type()), vc.sizes().vec(), vc.data_ptr(),
                    vb, 0, storage::kSlotRagged);
          store.put(companion, storage::DType::Int64, oc.sizes().vec(), oc.data_ptr(), ob, 0,
                    storage::kSlotRagged);
        } else {
          auto cur = get_ragged(theirs[i]);
          std::vector<int64_t> vshape = cur.values.sizes().vec();
          vshape[0] += vc.size(0);
          store.append(theirs[i], vshape, vc.data_ptr(), vb);
          store.append(companion, {cur.offsets.size(0) + oc.size(0)}, oc.data_ptr(), ob);
        }
        continue;
      }
      at::Tensor src = values[i].detach().cpu().resolve_conj().resolve_neg().contiguous();
      uint64_t nbytes = static_cast<uint64_t>(src.numel()) * src.element_size();
      uint64_t row_bytes = n > 0 ? nbytes / static_cast<uint64_t>(n) : 0;
      uint64_t hint = static_cast<uint64_t>(impl.reserve_rows) * row_bytes;
      if (creating) {
        store.put(theirs[i], *to_storage_dtype(src.scalar_type()),
                  std::vector<int64_t>(src.sizes().begin(), src.sizes().end()), src.data_ptr(),
                  nbytes, hint);
      } else {
        std::vector<int64_t> shape(src.sizes().begin(), src.sizes().end());
        shape[0] = grown[0];
        store.append(theirs[i], shape, src.data_ptr(), nbytes, hint);
      }
    }
    group.done();
  }
  impl.batch_size = grown;
  std::lock_guard lock(impl.mu);
  impl.views.clear();
}

}  // namespace tdstore
