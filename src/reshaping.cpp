// tensordict's reshaping and renaming: split, chunk, unbind, set_batch_size, flatten_keys,
// unflatten_keys, rename_key.
#include <set>

#include "src/observer.h"
#include "src/tensordict_impl.h"

namespace tdstore {
namespace {

// dim as an index into the batch dims (negative counts from the end); IndexError otherwise.
int64_t batch_dim(const TensorDict& td, int64_t dim, const char* op) {
  const int64_t n = td.batch_dims();
  if (dim < -n || dim >= n)
    throw IndexError(where(td) + ": " + op + ": dim " + std::to_string(dim) +
                     " is not a batch dim of " + shape_string(td.batch_size()));
  return dim < 0 ? dim + n : dim;
}

// Every leaf through fn into a dict of batch size `batch`: a dim other than 0 cuts through
// ragged keys' rows, which is refused.
TensorDict along(const TensorDict& td, std::vector<int64_t> batch, const char* op,
                 const std::function<at::Tensor(const at::Tensor&)>& fn) {
  TensorDict out(std::move(batch));
  for (const auto& k : td.keys()) {
    if (td.is_ragged(k))
      throw ShapeError(where(td) + ": " + op + ": key " + in_quotes(k) +
                       " is ragged: it is cut along batch dim 0 only");
    out.set(k, fn(td.get(k)));
  }
  return out;
}

// Pieces of the given sizes along batch dim `d` (already normalized).
std::vector<TensorDict> pieces(const TensorDict& td, int64_t d, const std::vector<int64_t>& sizes) {
  std::vector<TensorDict> out;
  int64_t start = 0;
  for (const int64_t n : sizes) {
    if (d == 0) {
      out.push_back(td.slice(start, start + n));
    } else {
      std::vector<int64_t> batch = td.batch_size();
      batch[d] = n;
      out.push_back(
          along(td, batch, "split", [&](const at::Tensor& t) { return t.narrow(d, start, n); }));
    }
    start += n;
  }
  return out;
}

// Keys with `from` replaced by `to` throughout, into a new dict; KeyError when two collide.
TensorDict renamed_keys(const TensorDict& td, std::string_view from, std::string_view to,
                        const char* op) {
  if (from.empty() || to.empty())
    throw ArgumentError(where(td) + ": " + op + ": the separator is empty");
  TensorDict out(td.batch_size());
  std::set<std::string> seen;
  for (const auto& k : td.keys()) {
    std::string n;
    for (size_t i = 0; i < k.size();) {
      if (k.compare(i, from.size(), from) == 0) {
        n += to;
        i += from.size();
      } else {
        n += k[i++];
      }
    }
    if (!seen.insert(n).second)
      throw KeyError(where(td) + ": " + op + ": two keys become " + in_quotes(n) + " (one is " +
                     in_quotes(k) + ")");
    if (td.is_ragged(k)) {
      auto r = td.get_ragged(k);
      out.set_ragged(n, r.values, r.offsets);
    } else {
      out.set(n, td.get(k));
    }
  }
  return out;
}

}  // namespace

std::vector<TensorDict> TensorDict::split(int64_t size, int64_t dim) const {
  const int64_t d = batch_dim(*this, dim, "split");
  if (size <= 0)
    throw ArgumentError(where(*this) + ": split: the size of a piece must be positive, got " +
                        std::to_string(size));
  const int64_t n = batch_size()[d];
  std::vector<int64_t> sizes;
  for (int64_t s = 0; s < n; s += size) sizes.push_back(std::min(size, n - s));
  if (sizes.empty()) sizes.push_back(0);  // torch.split of an empty dim: one empty piece
  return pieces(*this, d, sizes);
}

std::vector<TensorDict> TensorDict::split(const std::vector<int64_t>& sizes, int64_t dim) const {
  const int64_t d = batch_dim(*this, dim, "split");
  int64_t total = 0;
  for (const int64_t s : sizes) {
    if (s < 0)
      throw ArgumentError(where(*this) + ": split: a size is negative: " + std::to_string(s));
    total += s;
  }
  if (total != batch_size()[d])
    throw ShapeError(where(*this) + ": split: the sizes sum to " + std::to_string(total) +
                     ", not to batch dim " + std::to_string(d) + "'s " +
                     std::to_string(batch_size()[d]));
  return pieces(*this, d, sizes);
}

std::vector<TensorDict> TensorDict::chunk(int64_t chunks, int64_t dim) const {
  const int64_t d = batch_dim(*this, dim, "chunk");
  if (chunks <= 0)
    throw ArgumentError(where(*this) + ": chunk: the number of chunks must be positive, got " +
                        std::to_string(chunks));
  const int64_t n = batch_size()[d];
  if (n == 0) return pieces(*this, d, std::vector<int64_t>(chunks, 0));  // as torch.chunk
  return split((n + chunks - 1) / chunks, d);
}

std::vector<TensorDict> TensorDict::unbind(int64_t dim) const {
  const int64_t d = batch_dim(*this, dim, "unbind");
  std::vector<TensorDict> out;
  std::vector<int64_t> batch = batch_size();
  batch.erase(batch.begin() + d);
  for (int64_t i = 0; i < batch_size()[d]; ++i)
    out.push_back(d == 0 ? index(i) : along(*this, batch, "unbind", [&](const at::Tensor& t) {
      return t.select(d, i);
    }));
  return out;
}

void TensorDict::set_batch_size(std::vector<int64_t> batch) {
  auto& impl = *impl_;
  if (auto* o = detail::observer_for(&impl)) [[unlikely]]
    o->unsupported("set_batch_size()");
  if (impl.persistent()) {
    if (batch == batch_size()) return;
    throw ArgumentError(where(*this) + ": a store's batch size is its rows (" +
                        shape_string(batch_size()) + ", not " + shape_string(batch) +
                        "): regroup an in-memory copy (clone() or select())");
  }
  for (const int64_t b : batch)
    if (b < 0) throw ShapeError(where(*this) + ": batch size " + shape_string(batch));
  const TensorDict root = detail::Access::root(*this);  // the batch size is the whole dict's
  for (const auto& k : root.keys()) {
    if (root.is_ragged(k)) {
      if (batch.size() != 1 || batch[0] != batch_size()[0])
        throw ShapeError(where(*this) + ": key " + in_quotes(k) +
                         " is ragged: its batch size is one dim of its rows, " +
                         shape_string(batch_size()) + ", not " + shape_string(batch));
      continue;
    }
    const at::Tensor t = root.get(k);
    if (t.dim() < static_cast<int64_t>(batch.size()) ||
        !std::equal(batch.begin(), batch.end(), t.sizes().begin()))
      throw ShapeError(where(*this) + ": key " + in_quotes(k) + " of shape " +
                       shape_string(t.sizes()) + " does not start with the batch size " +
                       shape_string(batch));
  }
  impl.batch_size = std::move(batch);
}

TensorDict TensorDict::flatten_keys(std::string_view sep) const {
  if (sep.find('/') != std::string_view::npos)
    throw ArgumentError(where(*this) + ": flatten_keys: the separator holds '/'");
  return renamed_keys(*this, "/", sep, "flatten_keys");
}

TensorDict TensorDict::unflatten_keys(std::string_view sep) const {
  return renamed_keys(*this, sep, "/", "unflatten_keys");
}

void TensorDict::rename_key(std::string_view from, std::string_view to) {
  const std::string f(from), t(to);
  if (!contains(f)) get(f);  // the KeyError naming the closest keys
  if (contains(t) || has_prefix(t + "/"))
    throw KeyError(where(*this) + ": rename_key: key " + in_quotes(t) +
                   " exists; erase it first to replace it");
  detail::all_or_nothing(*this, [&] {
    if (is_ragged(f)) {
      auto r = get_ragged(f);
      set_ragged(t, r.values, r.offsets);
    } else if (is_persistent()) {
      set(t, get(f), compression_of(f));  // the same compression
    } else {
      set(t, get(f));
    }
    erase(f);
  });
}

}  // namespace tdstore
