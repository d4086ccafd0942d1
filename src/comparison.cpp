// tensordict's leafwise conversions and comparisons: to, device, eq, ne, all, any.
#include <ATen/ExpandUtils.h>
#include <ATen/ops/all.h>
#include <ATen/ops/any.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/ne.h>

#include "src/dtype_map.h"
#include "src/tensordict_impl.h"

namespace tdstore {
namespace {

// Every leaf through fn (a ragged key's values; its offsets as they are).
TensorDict converted(const TensorDict& td, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  TensorDict out(td.batch_size());
  for (const auto& k : td.keys()) {
    if (td.is_ragged(k)) {
      auto r = td.get_ragged(k);
      out.set_ragged(k, fn(r.values), r.offsets);
    } else {
      out.set(k, fn(td.get(k)));
    }
  }
  return out;
}

using Compare = at::Tensor (*)(const at::Tensor&, const at::Tensor&);

TensorDict compared(const TensorDict& td, const TensorDict& other, Compare op) {
  for (const auto& k : other.keys())
    if (!td.contains(k))
      throw KeyError(where(td) + ": comparing dicts: key " + in_quotes(k) +
                     " is in the other dict only");
  TensorDict out(td.batch_size());
  for (const auto& k : td.keys()) {
    if (!other.contains(k))
      throw KeyError(where(td) + ": comparing dicts: key " + in_quotes(k) +
                     " is not in the other dict");
    const at::Tensor a = td.get(k), b = other.get(k);
    if (!at::is_expandable_to(b.sizes(), a.sizes()))
      throw ShapeError(where(td) + ": comparing dicts: key " + in_quotes(k) + " of shape " +
                       shape_string(a.sizes()) + " against " + shape_string(b.sizes()));
    out.set(k, op(a, b));
  }
  return out;
}

TensorDict compared(const TensorDict& td, const at::Tensor& other, Compare op) {
  TensorDict out(td.batch_size());
  for (const auto& k : td.keys()) {
    const at::Tensor a = td.get(k);
    if (!at::is_expandable_to(other.sizes(), a.sizes()))
      throw ShapeError(where(td) + ": comparing key " + in_quotes(k) + " of shape " +
                       shape_string(a.sizes()) + " with a tensor of shape " +
                       shape_string(other.sizes()));
    out.set(k, op(a, other));
  }
  return out;
}

// The elements a leaf holds: a ragged key's values, without padding.
at::Tensor elements(const TensorDict& td, const std::string& k) {
  return td.is_ragged(k) ? td.get_ragged(k).values : td.get(k);
}

at::Tensor eq_op(const at::Tensor& a, const at::Tensor& b) { return at::eq(a, b); }
at::Tensor ne_op(const at::Tensor& a, const at::Tensor& b) { return at::ne(a, b); }

}  // namespace

TensorDict TensorDict::to(at::ScalarType dtype) const {
  if (!to_storage_dtype(dtype))
    throw DTypeError(where(*this) + ": to(" + std::string(c10::toString(dtype)) +
                     "): not a dtype a TensorDict holds (bool, uint8, int8, int16, int32, int64, "
                     "float16, bfloat16, float32, float64, complex64, complex128)");
  return converted(*this, [dtype](const at::Tensor& t) { return t.to(dtype); });
}

TensorDict TensorDict::to(at::Device device) const {
  if (device.is_cpu()) device = at::Device(at::kCPU);  // cpu:0 is the cpu
  if (this->device() == device) return *this;
  try {
    return converted(*this, [device](const at::Tensor& t) { return t.to(device); });
  } catch (const c10::Error& e) {
    throw ArgumentError(where(*this) + ": to(" + device.str() + "): " + e.what_without_backtrace());
  }
}

std::optional<at::Device> TensorDict::device() const {
  if (is_persistent()) return at::Device(at::kCPU);
  std::optional<at::Device> out;
  for (const auto& k : keys()) {
    const at::Device d = elements(*this, k).device();
    if (out && *out != d) return std::nullopt;
    out = d;
  }
  return out;
}

TensorDict TensorDict::eq(const TensorDict& other) const { return compared(*this, other, eq_op); }
TensorDict TensorDict::ne(const TensorDict& other) const { return compared(*this, other, ne_op); }
TensorDict TensorDict::eq(const at::Tensor& other) const { return compared(*this, other, eq_op); }
TensorDict TensorDict::ne(const at::Tensor& other) const { return compared(*this, other, ne_op); }

bool TensorDict::all() const {
  for (const auto& k : keys())
    if (!at::all(elements(*this, k)).item<bool>()) return false;
  return true;
}

bool TensorDict::any() const {
  for (const auto& k : keys())
    if (at::any(elements(*this, k)).item<bool>()) return true;
  return false;
}

}  // namespace tdstore
