// tensordict operations: indexing along batch dims, selection, apply, stack and cat. Every
// result is an in-memory dict.
#include <ATen/TensorOperators.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "src/dtype_map.h"
#include "src/observer.h"
#include "src/run_watch.h"
#include "src/tensordict_impl.h"
#include "storage/compressed.h"

namespace tdstore {
namespace {

// Names as select/exclude take them: a trailing '/' names the prefix; empty names are refused.
std::vector<std::string> normalized(const TensorDict& td, const char* op,
                                    std::vector<std::string> names) {
  for (auto& n : names) {
    while (!n.empty() && n.back() == '/') n.pop_back();
    if (n.empty()) throw KeyError(where(td) + ": " + op + ": empty key name");
  }
  return names;
}

// Copies key `k` of `from` into `to`, ragged keys as ragged (their values and offsets through fn).
void copy_key(const TensorDict& from, TensorDict& to, const std::string& k,
              const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (from.is_ragged(k)) {
    auto r = from.get_ragged(k);
    to.set_ragged(k, fn(r.values), fn(r.offsets));
  } else {
    to.set(k, fn(from.get(k)));
  }
}

at::Tensor same(const at::Tensor& t) { return t; }

// Key k of td when it is dense and stored compressed: rows are then read from their blocks,
// their numbers read into C++. Not under a recording (get() tells the dict's observer; a
// watched or traced run sees the indexing operator, not a read into C++).
std::shared_ptr<const detail::PackedPart> packed_key(const TensorDict& td, const std::string& k) {
  const TensorDict::Impl& impl = detail::Access::impl(td);
  if (!impl.persistent() || detail::observer_for(&impl) || detail::RunWatch::watched_or_traced())
    return nullptr;
  return impl.packed(detail::Access::prefix(td) + k);
}

// Rows `rows` (int64, any shape, each in [0, the key's rows)) of a packed key, shaped as rows
// then the key's row dims: only the blocks holding them decompressed, each once.
at::Tensor packed_rows(const detail::PackedPart& p, const at::Tensor& rows) {
  const at::Tensor flat = rows.reshape({-1}).to(at::kCPU, at::kLong).contiguous();
  const int64_t* r = flat.data_ptr<int64_t>();
  std::vector<int64_t> out(rows.sizes().begin(), rows.sizes().end());
  out.insert(out.end(), p.shape.begin() + 1, p.shape.end());
  const auto dtype = at::TensorOptions().dtype(to_scalar_type(p.dtype));
  const int64_t m = flat.numel();
  if (m > 0 && r[m - 1] - r[0] == m - 1 &&
      std::adjacent_find(r, r + m, [](int64_t a, int64_t b) { return b != a + 1; }) == r + m) {
    // Consecutive rows (a slice of step 1): decompressed straight into the result.
    at::Tensor t = at::empty(out, dtype);
    detail::advise_huge_pages(t);
    storage::read_rows(p.object, p.index, static_cast<uint64_t>(r[0]), static_cast<uint64_t>(m),
                       t.data_ptr(), p.where);
    return t;
  }
  std::vector<uint64_t> wanted(r, r + flat.numel());
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  const auto runs = storage::block_runs(p.index, wanted);
  std::vector<int64_t> shape = p.shape;
  shape[0] = 0;
  for (const auto& run : runs) shape[0] += static_cast<int64_t>(run.second);
  at::Tensor compact = at::empty(shape, dtype);
  const uint64_t row_bytes = p.index.layout.row_bytes;
  std::vector<uint64_t> firsts, places;  // each run's first row, and where it lies in compact
  uint64_t at = 0;
  for (const auto& [first, count] : runs) {
    storage::read_rows(p.object, p.index, first, count,
                       static_cast<uint8_t*>(compact.data_ptr()) + at * row_bytes, p.where);
    firsts.push_back(first), places.push_back(at);
    at += count;
  }
  at::Tensor place = at::empty({flat.numel()}, at::kLong);
  int64_t* to = place.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    const auto run = static_cast<size_t>(
        std::upper_bound(firsts.begin(), firsts.end(), static_cast<uint64_t>(r[i])) -
        firsts.begin() - 1);
    to[i] = static_cast<int64_t>(places[run] + static_cast<uint64_t>(r[i]) - firsts[run]);
  }
  return compact.index_select(0, place).reshape(out);
}

bool selected(const std::string& key, const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (key == n ||
        (key.size() > n.size() && key.compare(0, n.size(), n) == 0 && key[n.size()] == '/'))
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

// Rows `rows` (a 1-d int64 tensor of rows in range) of a ragged key, ragged again: each row's
// values in order, offsets rebuilt from the rows' lengths.
TensorDict::Ragged ragged_rows(const TensorDict::Ragged& r, const at::Tensor& rows) {
  const at::Tensor starts = r.offsets.index_select(0, rows);
  const at::Tensor lengths = r.offsets.index_select(0, rows + 1) - starts;
  at::Tensor offsets = at::zeros({rows.numel() + 1}, at::kLong);
  offsets.slice(0, 1).copy_(lengths.cumsum(0));
  const int64_t total = offsets[rows.numel()].item<int64_t>();
  const at::Tensor from =
      at::repeat_interleave(starts - offsets.slice(0, 0, rows.numel()), lengths, /*dim=*/0, total) +
      at::arange(total, at::kLong);
  return {r.values.index_select(0, from), offsets};
}

// Rows of every leaf of td (batch dim 0), into a dict of the given batch size: dense keys
// through fn, ragged keys as ragged (they keep their rows' true lengths) by row_numbers(), the
// rows selected as an int64 tensor of rows in range (called only when a key is ragged or
// compressed). by_rows: fn(t) is t's rows row_numbers() (dim 0 of t indexed by it), so a
// compressed key's rows are read from their blocks alone.
TensorDict select_rows(const TensorDict& td, std::vector<int64_t> batch,
                       const std::function<at::Tensor()>& row_numbers,
                       const std::function<at::Tensor(const at::Tensor&)>& fn, bool by_rows) {
  TensorDict out(std::move(batch));
  at::Tensor rows;
  for (const auto& k : td.keys()) {
    if (!td.is_ragged(k)) {
      if (auto packed = by_rows ? packed_key(td, k) : nullptr) {
        if (!rows.defined()) rows = row_numbers();
        out.set(k, packed_rows(*packed, rows));
      } else {
        out.set(k, fn(td.get(k)));
      }
      continue;
    }
    if (!rows.defined()) rows = row_numbers();
    if (rows.dim() != 1)
      throw ShapeError(where(td) + ": key " + in_quotes(k) + " is ragged: index its rows with a " +
                       "1-d index or mask, not a " + std::to_string(rows.dim()) + "-d one");
    auto r = ragged_rows(td.get_ragged(k), rows);
    out.set_ragged(k, r.values, r.offsets);
  }
  return out;
}

}  // namespace

TensorDict TensorDict::clone() const {
  TensorDict out(batch_size());
  for (const auto& k : keys())
    copy_key(*this, out, k, [](const at::Tensor& t) { return t.clone(); });
  for (const auto& name : attr_names()) out.set_attr(name, *attr(name));
  return out;
}

TensorDict TensorDict::index(int64_t i) const {
  if (batch_dims() == 0)
    throw ShapeError(where(*this) + ": cannot index a dict with no batch dims");
  int64_t n = batch_size()[0];
  int64_t j = i < 0 ? i + n : i;
  if (j < 0 || j >= n)
    throw IndexError(where(*this) + ": index " + std::to_string(i) +
                     " out of range for batch dim 0 of size " + std::to_string(n));
  TensorDict out(std::vector<int64_t>(batch_size().begin() + 1, batch_size().end()));
  for (const auto& k : keys()) {
    if (!is_ragged(k)) {
      auto packed = packed_key(*this, k);  // compressed: row j's block alone
      out.set(k, packed ? packed_rows(*packed, at::arange(j, j + 1, at::kLong).reshape({}))
                        : get(k).select(0, j));
      continue;
    }
    auto r = get_ragged(k);  // row j as it is: its own length, no padding
    out.set(k, r.values.slice(0, r.offsets[j].item<int64_t>(), r.offsets[j + 1].item<int64_t>()));
  }
  return out;
}

TensorDict TensorDict::slice(int64_t start, int64_t end, int64_t step) const {
  if (batch_dims() == 0)
    throw ShapeError(where(*this) + ": cannot slice a dict with no batch dims");
  if (step <= 0)
    throw ShapeError(where(*this) + ": slice step must be positive, got " + std::to_string(step));
  int64_t n = batch_size()[0];
  auto clamp = [n](int64_t x) { return std::clamp(x < 0 ? x + n : x, int64_t{0}, n); };
  int64_t s = clamp(start), e = std::max(clamp(end), clamp(start));
  std::vector<int64_t> batch = batch_size();
  batch[0] = (e - s + step - 1) / step;
  return select_rows(
      *this, batch, [&] { return at::arange(s, e, step, at::kLong); },
      [&](const at::Tensor& t) { return t.slice(0, s, e, step); }, true);
}

std::vector<int64_t> detail::batch_of_index(const TensorDict& td, const at::Tensor& idx) {
  const auto& b = td.batch_size();
  if (td.batch_dims() == 0)
    throw ShapeError(where(td) + ": cannot index a dict with no batch dims");
  std::vector<int64_t> batch;
  if (idx.scalar_type() == at::kBool) {
    if (idx.dim() == 0 || idx.dim() > td.batch_dims() ||
        !std::equal(idx.sizes().begin(), idx.sizes().end(), b.begin()))
      throw ShapeError(where(td) + ": mask of shape " + shape_string(idx.sizes()) +
                       " does not match the leading batch dims " + shape_string(b));
    batch.push_back(idx.sum().item<int64_t>());
    batch.insert(batch.end(), b.begin() + idx.dim(), b.end());
  } else if (at::isIntegralType(idx.scalar_type(), false)) {
    if (idx.numel() > 0) {
      detail::RunWatch::Unwatched bounds;  // decides only whether this throws
      int64_t lo = idx.min().item<int64_t>(), hi = idx.max().item<int64_t>();
      if (lo < -b[0] || hi >= b[0])
        throw IndexError(where(td) + ": index tensor holds " +
                         std::to_string(lo < -b[0] ? lo : hi) +
                         ", out of range for batch dim 0 of size " + std::to_string(b[0]));
    }
    batch.assign(idx.sizes().begin(), idx.sizes().end());
    batch.insert(batch.end(), b.begin() + 1, b.end());
  } else {
    throw IndexError(where(td) + ": index tensors must be integral or bool, got " +
                     std::string(c10::toString(idx.scalar_type())));
  }
  return batch;
}

TensorDict TensorDict::index(const at::Tensor& index) const {
  // A uint8 index is a mask, as torch reads it.
  const at::Tensor idx = index.scalar_type() == at::kByte ? index.to(at::kBool) : index;
  const auto& b = batch_size();
  const std::vector<int64_t> batch = detail::batch_of_index(*this, idx);
  c10::List<c10::optional<at::Tensor>> indices;
  indices.push_back(idx.scalar_type() == at::kBool ? idx : idx.to(at::kLong));
  auto row_numbers = [&] {
    if (idx.scalar_type() == at::kBool) return idx.nonzero().reshape({-1});
    at::Tensor rows = idx.to(at::kLong);
    return at::where(rows < 0, rows + b[0], rows);
  };
  // A mask over more than dim 0 selects across batch dims, not rows of dim 0.
  const bool by_rows = idx.scalar_type() != at::kBool || idx.dim() == 1;
  return select_rows(
      *this, batch, row_numbers, [&](const at::Tensor& t) { return at::index(t, indices); },
      by_rows);
}

TensorDict TensorDict::select(const std::vector<std::string>& keys_or_prefixes) const {
  const auto names = normalized(*this, "select", keys_or_prefixes);
  for (const auto& n : names)
    if (!contains(n) && !has_prefix(n))
      throw KeyError(where(*this) + ": select: key " + in_quotes(n) + " not found");
  TensorDict out(batch_size());
  for (const auto& k : keys())
    if (selected(k, names)) copy_key(*this, out, k, same);
  return out;
}

TensorDict TensorDict::exclude(const std::vector<std::string>& keys_or_prefixes) const {
  const auto names = normalized(*this, "exclude", keys_or_prefixes);
  TensorDict out(batch_size());
  for (const auto& k : keys())
    if (!selected(k, names)) copy_key(*this, out, k, same);
  return out;
}

TensorDict TensorDict::apply(const std::function<at::Tensor(const at::Tensor&)>& fn,
                             std::optional<std::vector<int64_t>> new_batch_size) const {
  return map_leaves(*this, new_batch_size.value_or(batch_size()), fn);
}

void detail::all_or_nothing(TensorDict& td, const std::function<void()>& write) {
  auto& impl = detail::Access::impl(td);
  if (!impl.persistent()) {
    auto tensors = impl.tensors;
    auto stamps = impl.stamps;
    try {
      write();
    } catch (...) {
      impl.tensors = std::move(tensors);
      impl.stamps = std::move(stamps);
      throw;
    }
    return;
  }
  try {
    storage::WriteGroup group(*impl.store);
    write();
    group.done();
  } catch (...) {
    storage::MutexLock lock(&impl.mu);
    impl.views.clear();  // views of values the undone group staged
    throw;
  }
}

void TensorDict::update(const TensorDict& other) {
  detail::all_or_nothing(*this, [&] {
    for (const auto& k : other.keys()) copy_key(other, *this, k, same);
  });
}

void TensorDict::set(std::string_view key, const TensorDict& value) {
  const std::string k(key);
  TensorDict leaves(batch_size());  // value's leaves, checked against this dict's batch size
  for (const auto& v : value.keys()) copy_key(value, leaves, v, same);
  detail::all_or_nothing(*this, [&] {
    if (contains(k)) erase(k);
    for (const auto& old : keys())
      if (old.size() > k.size() && old.compare(0, k.size(), k) == 0 && old[k.size()] == '/')
        erase(old);
    for (const auto& v : leaves.keys()) {
      const std::string full = k + "/" + v;
      if (leaves.is_ragged(v)) {
        auto r = leaves.get_ragged(v);
        set_ragged(full, r.values, r.offsets);
      } else {
        set(full, leaves.get(v));
      }
    }
  });
}

namespace {

TensorDict join(const std::vector<TensorDict>& dicts, int64_t dim, bool stack) {
  const std::string op = std::string("TensorDict::") + (stack ? "stack" : "cat");
  if (dicts.empty()) throw ArgumentError(op + ": no dicts to join (an empty list)");
  const auto& first = dicts.front();
  const std::vector<int64_t>& b0 = first.batch_size();
  const int64_t nb = first.batch_dims();
  const int64_t lim = stack ? nb + 1 : nb;
  if (dim < 0) dim += lim;
  if (dim < 0 || dim >= lim)
    throw ShapeError(fmt::format("{}: dim out of range for batch size {}", op, shape_string(b0)));
  // Same keys and compatible batch sizes everywhere, checked before anything is joined.
  const auto keys = first.keys();
  for (size_t i = 1; i < dicts.size(); ++i) {
    const auto& d = dicts[i];
    auto theirs = d.keys();
    if (theirs != keys) {
      std::vector<std::string> missing, extra;
      std::set_difference(keys.begin(), keys.end(), theirs.begin(), theirs.end(),
                          std::back_inserter(missing));
      std::set_difference(theirs.begin(), theirs.end(), keys.begin(), keys.end(),
                          std::back_inserter(extra));
      throw KeyError(fmt::format(
          "{}: dict {} holds different keys than dict 0: {}", op, i,
          missing.empty()
              ? "key " + in_quotes(extra.front()) + " is only in dict " + std::to_string(i)
              : "key " + in_quotes(missing.front()) + " is missing"));
    }
    const auto& b = d.batch_size();
    bool ok = b.size() == b0.size();
    for (size_t j = 0; ok && j < b.size(); ++j)
      ok = b[j] == b0[j] || (!stack && static_cast<int64_t>(j) == dim);
    if (!ok)
      throw ShapeError(fmt::format("{}: dict {} has batch size {}, dict 0 has {} ({})", op, i,
                                   shape_string(b), shape_string(b0),
                                   stack
                                       ? "stack needs equal batch sizes"
                                       : "cat needs them equal but in dim " + std::to_string(dim)));
  }
  std::vector<int64_t> batch = b0;
  if (stack) {
    batch.insert(batch.begin() + dim, static_cast<int64_t>(dicts.size()));
  } else {
    batch[dim] = 0;
    for (const auto& d : dicts) batch[dim] += d.batch_size()[dim];
  }
  TensorDict out(batch);
  for (const auto& k : keys) {
    const bool ragged = first.is_ragged(k);
    for (size_t i = 1; i < dicts.size(); ++i)
      if (dicts[i].is_ragged(k) != ragged)
        throw ShapeError(fmt::format("{}: key '{}' is ragged in dict {} but not in dict {}", op, k,
                                     ragged ? 0 : i, ragged ? i : 0));
    if (ragged) {  // rows joined: values concatenated, offsets shifted past the rows before
      if (stack)
        throw ShapeError(fmt::format("{}: ragged key '{}' cannot be stacked (cat it)", op, k));
      std::vector<at::Tensor> values, offsets;
      int64_t base = 0;
      for (size_t i = 0; i < dicts.size(); ++i) {
        auto r = dicts[i].get_ragged(k);
        values.push_back(r.values);
        offsets.push_back((i ? r.offsets.slice(0, 1) : r.offsets) + base);
        base += r.values.size(0);
      }
      try {
        out.set_ragged(k, at::cat(values, 0), at::cat(offsets, 0));
      } catch (const c10::Error& e) {
        throw ShapeError(fmt::format("{}: ragged key '{}': {}", op, k, e.what_without_backtrace()));
      }
      continue;
    }
    std::vector<at::Tensor> parts;
    for (const auto& d : dicts) parts.push_back(d.get(k));
    for (size_t i = 1; i < parts.size(); ++i) {
      const auto& a = parts[0].sizes();
      const auto& c = parts[i].sizes();
      bool ok = a.size() == c.size();
      for (size_t j = 0; ok && j < a.size(); ++j)
        ok = a[j] == c[j] || (!stack && static_cast<int64_t>(j) == dim);
      if (!ok)
        throw ShapeError(fmt::format("{}: key '{}' has shape {} in dict 0 and {} in dict {}", op, k,
                                     shape_string(a), shape_string(c), i));
    }
    try {
      out.set(k, stack ? at::stack(parts, dim) : at::cat(parts, dim));
    } catch (const c10::Error& e) {
      throw ShapeError(fmt::format("{}: key '{}': {}", op, k, e.what_without_backtrace()));
    }
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
