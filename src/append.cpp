// TensorDict::append and reserve: growing batch dim 0.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>

#include <algorithm>
#include <map>

#include "src/dtype_map.h"
#include "src/lazy_internal.h"
#include "src/observer.h"
#include "src/tensordict_impl.h"
#include "storage/append_plan.h"

namespace tdstore {
void TensorDict::reserve(int64_t rows) {
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    o->unsupported("reserve()");
  impl_->reserve_rows = std::max<int64_t>(rows, 0);
}

namespace {

// A key as plan_append sees it: a dense tensor, or a ragged key's values.
storage::ColumnSpec column_spec(const TensorDict& td, const std::string& k, const std::string& w) {
  const bool ragged = td.is_ragged(k);
  const at::Tensor t = ragged ? td.get_ragged(k).values : td.get(k);
  auto dtype = to_storage_dtype(t.scalar_type());
  if (!dtype)
    throw DTypeError(w + ": key " + in_quotes(k) + ": dtype " +
                     std::string(c10::toString(t.scalar_type())) + " is not storable");
  return {*dtype, t.sizes().vec(), ragged};
}

std::map<std::string, storage::ColumnSpec> column_specs(const TensorDict& td,
                                                        const std::string& w) {
  std::map<std::string, storage::ColumnSpec> out;
  for (const auto& k : td.keys()) out.emplace(k, column_spec(td, k, w));
  return out;
}

}  // namespace

void TensorDict::append(const TensorDict& rows) {
  Impl& impl = *impl_;
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    o->unsupported("append()");
  const std::string w = where(impl);
  if (!prefix_.empty())
    throw ArgumentError(w + ": append through a sub-dict handle; append to the root");
  // Everything is validated (storage/append_plan.h) before anything is written.
  const auto theirs = column_specs(rows, w);
  const auto plan = storage::plan_append(w, impl.batch_size, column_specs(*this, w),
                                         detail::derived_keys(*this), rows.batch_size(), theirs);
  const int64_t n = rows.batch_size()[0];

  auto ragged_rows = [&](const std::string& k) {  // rows' values and offsets shifted past ours
    auto r = rows.get_ragged(k);
    int64_t base = plan.creating ? 0 : get_ragged(k).offsets[-1].item<int64_t>();
    return std::make_pair(r.values, r.offsets.slice(0, plan.creating ? 0 : 1) + base);
  };
  if (!impl.persistent()) {
    // Every grown tensor is built first; the dict changes only once nothing can throw.
    std::vector<std::pair<std::string, at::Tensor>> grown_tensors;
    for (const auto& [k, spec] : theirs) {
      if (!spec.ragged) {
        at::Tensor v = rows.get(k);
        grown_tensors.emplace_back(k, plan.creating ? v : at::cat({get(k), v}, 0));
        continue;
      }
      auto [v, off] = ragged_rows(k);
      const std::string companion = storage::ragged_offsets_key(k);
      grown_tensors.emplace_back(k, plan.creating ? v : at::cat({impl.tensors.at(k), v}, 0));
      grown_tensors.emplace_back(
          companion, plan.creating ? off : at::cat({impl.tensors.at(companion), off}, 0));
    }
    for (const auto& k : plan.stale) detail::drop_derived(*this, k);
    for (auto& [k, t] : grown_tensors) impl.tensors[k] = std::move(t);
    for (const auto& [k, t] : grown_tensors)  // each key's tensors (and offsets) in place first
      if (k.find('\0') == std::string::npos) impl.renew_stamp(k);
    impl.batch_size = plan.grown;
    return;
  }
  // The contiguous CPU bytes of every part, kept alive until the parts are staged.
  std::vector<at::Tensor> held;
  std::vector<storage::AppendPart> parts;
  auto add_part = [&](const std::string& k, at::Tensor t, uint64_t capacity, uint8_t flags) {
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    parts.push_back({k, *to_storage_dtype(t.scalar_type()), t.sizes().vec(), t.data_ptr(), nbytes,
                     capacity, flags});
    held.push_back(std::move(t));
  };
  for (const auto& [k, spec] : theirs) {
    if (spec.ragged) {
      auto [v, off] = ragged_rows(k);
      add_part(k, v.detach().cpu().contiguous(), 0, storage::kSlotRagged);
      add_part(storage::ragged_offsets_key(k), off.detach().cpu().to(at::kLong).contiguous(), 0,
               storage::kSlotRagged);
      continue;
    }
    at::Tensor src = rows.get(k).detach().cpu().resolve_conj().resolve_neg().contiguous();
    const uint64_t nbytes = static_cast<uint64_t>(src.numel()) * src.element_size();
    const uint64_t row_bytes = n > 0 ? nbytes / static_cast<uint64_t>(n) : 0;
    add_part(k, std::move(src), static_cast<uint64_t>(impl.reserve_rows) * row_bytes, 0);
  }
  auto& store = *impl.store;
  {
    // Rows appended to every key, the batch size and the derived keys dropped: all or none,
    // whatever is thrown (a full arena or key directory, a failed write).
    storage::WriteGroup group(store);
    for (const auto& k : plan.stale) detail::drop_derived(*this, k);
    storage::AppendPlan staged = plan;
    staged.stale.clear();  // dropped above, with this handle's own derived state
    storage::apply_append(store, staged, parts, impl.compression);
    group.done();
  }
  impl.batch_size = plan.grown;
  storage::MutexLock lock(&impl.mu);
  impl.views.clear();
}

}  // namespace tdstore
