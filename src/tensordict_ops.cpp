// tensordict operations: indexing along batch dims, selection, apply, stack and cat. Every
// result is an in-memory dict.
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/index.h>
#include <ATen/ops/stack.h>

#include <algorithm>

#include "src/tensordict_impl.h"

namespace tdstore {
namespace {

std::string where(const TensorDict& td) { return tdstore::where(detail::Access::impl(td)); }

bool selected(const std::string& key, const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (key == n || (key.size() > n.size() && key.compare(0, n.size(), n) == 0 && key[n.size()] == '/'))
      return true;
  return false;
}

// Applies fn to every leaf of td into a new in-memory dict of the given batch size.
TensorDict map_leaves(const TensorDict& td, std::vector<int64_t> batch,
                      const std::function<at::Tensor(const at::Tensor&)>& fn) {
  TensorDict out(std::move(batch));
  for (const auto& k : td.keys()) out.set(k, fn(td.get(k)));
  return out;
}

}  // namespace

TensorDict TensorDict::clone() const {
  TensorDict out = map_leaves(*this, batch_size(), [](const at::Tensor& t) { return t.clone(); });
  for (const auto& name : attr_names()) out.set_attr(name, *attr(name));
  return out;
}

TensorDict TensorDict::index(int64_t i) const {
  if (batch_dims() == 0) throw ShapeError(where(*this) + ": cannot index a dict with no batch dims");
  int64_t n = batch_size()[0];
  int64_t j = i < 0 ? i + n : i;
  if (j < 0 || j >= n)
    throw ShapeError(where(*this) + ": index " + std::to_string(i) + " out of range for batch dim 0 of size " +
                     std::to_string(n));
  std::vector<int64_t> batch(batch_size().begin() + 1, batch_size().end());
  return map_leaves(*this, batch, [j](const at::Tensor& t) { return t.select(0, j); });
}

TensorDict TensorDict::slice(int64_t start, int64_t end, int64_t step) const {
  if (batch_dims() == 0) throw ShapeError(where(*this) + ": cannot slice a dict with no batch dims");
  if (step <= 0) throw ShapeError(where(*this) + ": slice step must be positive, got " + std::to_string(step));
  int64_t n = batch_size()[0];
  auto clamp = [n](int64_t x) { return std::clamp(x < 0 ? x + n : x, int64_t{0}, n); };
  int64_t s = clamp(start), e = std::max(clamp(end), clamp(start));
  std::vector<int64_t> batch = batch_size();
  batch[0] = (e - s + step - 1) / step;
  return map_leaves(*this, batch, [&](const at::Tensor& t) { return t.slice(0, s, e, step); });
}

TensorDict TensorDict::index(const at::Tensor& idx) const {
  const auto& b = batch_size();
  if (batch_dims() == 0) throw ShapeError(where(*this) + ": cannot index a dict with no batch dims");
  std::vector<int64_t> batch;
  if (idx.scalar_type() == at::kBool) {
    if (idx.dim() == 0 || idx.dim() > batch_dims() ||
        !std::equal(idx.sizes().begin(), idx.sizes().end(), b.begin()))
      throw ShapeError(where(*this) + ": mask of shape " + shape_string(idx.sizes()) +
                       " does not match the leading batch dims " + shape_string(b));
    batch.push_back(idx.sum().item<int64_t>());
    batch.insert(batch.end(), b.begin() + idx.dim(), b.end());
  } else if (at::isIntegralType(idx.scalar_type(), false)) {
    if (idx.numel() > 0) {
      int64_t lo = idx.min().item<int64_t>(), hi = idx.max().item<int64_t>();
      if (lo < -b[0] || hi >= b[0])
        throw ShapeError(where(*this) + ": index tensor holds " + std::to_string(lo < -b[0] ? lo : hi) +
                         ", out of range for batch dim 0 of size " + std::to_string(b[0]));
    }
    batch.assign(idx.sizes().begin(), idx.sizes().end());
    batch.insert(batch.end(), b.begin() + 1, b.end());
  } else {
    throw ShapeError(where(*this) + ": index tensors must be integral or bool, got " +
                     std::string(c10::toString(idx.scalar_type())));
  }
  c10::List<c10::optional<at::Tensor>> indices;
  indices.push_back(idx.scalar_type() == at::kBool ? idx : idx.to(at::kLong));
  return map_leaves(*this, batch, [&](const at::Tensor& t) { return at::index(t, indices); });
}

TensorDict TensorDict::select(const std::vector<std::string>& names) const {
  TensorDict out(batch_size());
  for (const auto& k : keys())
    if (selected(k, names)) out.set(k, get(k));
  for (const auto& n : names)
    if (!contains(n) && !has_prefix(n))
      throw KeyError(where(*this) + ": select: key " + n + " not found");
  return out;
}

TensorDict TensorDict::exclude(const std::vector<std::string>& names) const {
  TensorDict out(batch_size());
  for (const auto& k : keys())
    if (!selected(k, names)) out.set(k, get(k));
  return out;
}

TensorDict TensorDict::apply(const std::function<at::Tensor(const at::Tensor&)>& fn,
                             std::optional<std::vector<int64_t>> new_batch_size) const {
  return map_leaves(*this, new_batch_size.value_or(batch_size()), fn);
}

void TensorDict::update(const TensorDict& other) {
  for (const auto& k : other.keys()) set(k, other.get(k));
}

namespace {

TensorDict join(const std::vector<TensorDict>& dicts, int64_t dim, bool stack) {
  if (dicts.empty()) throw Error("TensorDict::" + std::string(stack ? "stack" : "cat") + ": no dicts");
  const auto& first = dicts.front();
  int64_t nb = first.batch_dims();
  int64_t lim = stack ? nb + 1 : nb;
  if (dim < 0) dim += lim;
  if (dim < 0 || dim >= std::max<int64_t>(lim, stack ? 1 : 0) || (!stack && nb == 0))
    throw ShapeError("TensorDict::" + std::string(stack ? "stack" : "cat") + ": dim out of range for batch size " +
                     shape_string(first.batch_size()));
  auto keys = first.keys();
  std::vector<int64_t> batch = first.batch_size();
  if (stack) {
    batch.insert(batch.begin() + dim, static_cast<int64_t>(dicts.size()));
  } else {
    batch[dim] = 0;
    for (const auto& d : dicts) {
      if (d.batch_dims() != nb) throw ShapeError("TensorDict::cat: batch sizes " + shape_string(first.batch_size()) +
                                                 " and " + shape_string(d.batch_size()) + " differ in rank");
      batch[dim] += d.batch_size()[dim];
    }
  }
  TensorDict out(batch);
  for (const auto& k : keys) {
    std::vector<at::Tensor> parts;
    for (const auto& d : dicts) {
      if (d.keys() != keys) throw KeyError("TensorDict::" + std::string(stack ? "stack" : "cat") +
                                           ": dicts hold different keys (first has " +
                                           std::to_string(keys.size()) + ")");
      parts.push_back(d.get(k));
    }
    out.set(k, stack ? at::stack(parts, dim) : at::cat(parts, dim));
  }
  return out;
}

}  // namespace

TensorDict TensorDict::stack(const std::vector<TensorDict>& dicts, int64_t dim) {
  return join(dicts, dim, true);
}
TensorDict TensorDict::cat(const std::vector<TensorDict>& dicts, int64_t dim) {
  return join(dicts, dim, false);
}

}  // namespace tdstore
