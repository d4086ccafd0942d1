// Ragged keys: values plus int64 offsets (docs/FORMAT.md, "Ragged keys").
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <cstring>

#include "src/dtype_map.h"
#include "src/observer.h"
#include "src/tensordict_impl.h"

namespace tdstore {

std::pair<at::Tensor, at::Tensor> pad_ragged(const at::Tensor& values_in,
                                             const at::Tensor& offsets_in,
                                             const at::Tensor& idx_in) {
  at::Tensor values = values_in.contiguous(), offsets = offsets_in.contiguous();
  int64_t n = offsets.numel() - 1;
  at::Tensor idx = idx_in.defined() ? idx_in.to(at::kLong).contiguous() : at::arange(n, at::kLong);
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* ix = idx.data_ptr<int64_t>();
  at::Tensor lengths = at::zeros({idx.numel()}, at::kLong);
  int64_t* len = lengths.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int64_t i = 0; i < idx.numel(); ++i) {
    len[i] = off[ix[i] + 1] - off[ix[i]];
    longest = std::max(longest, len[i]);
  }
  std::vector<int64_t> shape{idx.numel(), longest};
  shape.insert(shape.end(), values.sizes().begin() + 1, values.sizes().end());
  at::Tensor padded = at::zeros(shape, values.scalar_type());
  const size_t item =
      values.size(0) ? static_cast<size_t>(values.numel() / values.size(0)) * values.element_size()
                     : 0;
  const auto* src = static_cast<const uint8_t*>(values.data_ptr());
  auto* dst = static_cast<uint8_t*>(padded.data_ptr());
  for (int64_t i = 0; i < idx.numel(); ++i)
    std::memcpy(dst + static_cast<size_t>(i * longest) * item,
                src + static_cast<size_t>(off[ix[i]]) * item, static_cast<size_t>(len[i]) * item);
  return {padded, lengths};
}

void TensorDict::set_ragged(std::string_view key, const at::Tensor& values_in,
                            const at::Tensor& offsets_in) {
  Impl& impl = *impl_;
  std::string k = full_key(key);
  std::string w = where(impl);
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    o->unsupported("set_ragged()");
  storage::check_key(k, w, /*ragged=*/true);
  if (batch_dims() != 1)
    throw ShapeError(w + ": ragged key " + in_quotes(k) + " needs a dict with one batch dim, not " +
                     shape_string(batch_size()));
  at::Tensor values = values_in.detach().cpu().contiguous();
  at::Tensor offsets = offsets_in.detach().cpu().to(at::kLong).contiguous();
  const int64_t n = batch_size()[0];
  if (offsets.dim() != 1 || offsets.numel() != n + 1)
    throw ShapeError(w + ": ragged key " + in_quotes(k) + ": offsets of shape " +
                     shape_string(offsets.sizes()) + ", expected [" + std::to_string(n + 1) +
                     "] (rows + 1)");
  if (values.dim() < 1)
    throw ShapeError(w + ": ragged key " + in_quotes(k) + ": values need at least one dim");
  const int64_t* off = offsets.data_ptr<int64_t>();
  bool ok = off[0] == 0 && off[n] == values.size(0);
  for (int64_t i = 0; ok && i < n; ++i) ok = off[i] <= off[i + 1];
  if (!ok)
    throw ShapeError(w + ": ragged key " + in_quotes(k) +
                     ": offsets must start at 0, never decrease and end at " +
                     std::to_string(values.size(0)) + " (the values' rows)");
  auto code = to_storage_dtype(values.scalar_type());
  if (!code)
    throw DTypeError(w + ": ragged key " + in_quotes(k) + ": dtype " +
                     std::string(c10::toString(values.scalar_type())) + " is not storable");
  const std::string companion = storage::ragged_offsets_key(k);
  impl.check_set(k, std::nullopt);
  if (!impl.persistent()) {
    impl.tensors[k] = values;
    impl.tensors[companion] = offsets;
    impl.renew_stamp(k);
    return;
  }
  storage::WriteGroup group(*impl.store);  // the values and their offsets, or neither
  const auto nbytes = static_cast<uint64_t>(values.numel()) * values.element_size();
  if (impl.compression.enabled())  // the values under the handle's compression; offsets raw
    impl.store->put_compressed(k, *code, values.sizes().vec(), values.data_ptr(), nbytes,
                               impl.compression, 0, storage::kSlotRagged);
  else
    impl.store->put(k, *code, values.sizes().vec(), values.data_ptr(), nbytes, 0,
                    storage::kSlotRagged);
  impl.store->put(companion, storage::DType::Int64, offsets.sizes().vec(), offsets.data_ptr(),
                  static_cast<uint64_t>(offsets.numel()) * 8, 0, storage::kSlotRagged);
  group.done();
  storage::MutexLock lock(&impl.mu);
  impl.views.erase(k);
  impl.views.erase(companion);
}

void TensorDict::set_ragged(std::string_view key, const std::vector<at::Tensor>& rows) {
  if (rows.empty())
    throw ShapeError(where(*impl_) + ": ragged key " + in_quotes(full_key(key)) + ": no rows");
  // Every row as the first: at least one dim, the same dims after the first, the same dtype
  // (never a promotion to another dtype, never libtorch's message naming no key).
  const at::Tensor& first = rows[0];
  for (size_t i = 0; i < rows.size(); ++i) {
    const at::Tensor& r = rows[i];
    if (!r.defined() || r.dim() == 0 || r.dim() != first.dim() ||
        !std::equal(r.sizes().begin() + 1, r.sizes().end(), first.sizes().begin() + 1))
      throw ShapeError(where(*impl_) + ": ragged key " + in_quotes(full_key(key)) + ": row " +
                       std::to_string(i) + " has shape " +
                       (r.defined() ? shape_string(r.sizes()) : std::string("(undefined)")) +
                       "; every row is [length, ...] with the dims after the first of row 0, " +
                       shape_string(first.sizes()));
    if (r.scalar_type() != first.scalar_type())
      throw DTypeError(where(*impl_) + ": ragged key " + in_quotes(full_key(key)) + ": row " +
                       std::to_string(i) + " is " + std::string(c10::toString(r.scalar_type())) +
                       ", row 0 " + std::string(c10::toString(first.scalar_type())) +
                       "; every row has one dtype");
  }
  at::Tensor offsets = at::zeros({static_cast<int64_t>(rows.size()) + 1}, at::kLong);
  int64_t* off = offsets.data_ptr<int64_t>();
  for (size_t i = 0; i < rows.size(); ++i) off[i + 1] = off[i] + rows[i].size(0);
  set_ragged(key, at::cat(rows, 0), offsets);
}

bool TensorDict::is_ragged(std::string_view key) const {
  std::string k = full_key(key);
  auto real = [&] { return detail::ask(*impl_, detail::Query::IsRagged, k); };
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    return std::get<bool>(o->query(detail::Query::IsRagged, k, real));
  return std::get<bool>(real());
}

TensorDict::Ragged TensorDict::get_ragged(std::string_view key) const {
  if (!is_ragged(key))
    throw KeyError(where(*impl_) + ": key " + in_quotes(full_key(key)) + " is not ragged");
  std::string k = full_key(key), companion = storage::ragged_offsets_key(k);
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    return {o->read(detail::ReadKind::Stored, k, [&] { return impl_->stored(k); }),
            o->read(detail::ReadKind::Stored, companion, [&] { return impl_->stored(companion); })};
  return {impl_->stored(k), impl_->stored(companion)};
}

}  // namespace tdstore
