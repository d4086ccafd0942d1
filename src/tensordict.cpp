// TensorDict core: storage-backed and in-memory leaves behind one handle.
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>

#include "src/dtype_map.h"
#include "src/observer.h"
#include "src/tensordict_impl.h"
#include "storage/format.h"

namespace tdstore {
namespace {

std::string quote(std::string_view key) {
  std::string out(1, '\'');
  out.append(key).push_back('\'');
  return out;
}

}  // namespace

std::string where(const TensorDict::Impl& impl) {
  return impl.persistent() ? impl.store->path().string() : std::string("in-memory TensorDict");
}

std::string shape_string(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::vector<std::string> split_key(std::string_view key) {
  std::vector<std::string> parts;
  for (size_t s = 0, e; s <= key.size(); s = e + 1) {
    e = key.find('/', s);
    if (e == std::string_view::npos) e = key.size();
    parts.emplace_back(key.substr(s, e - s));
  }
  return parts;
}

void check_key_path(std::string_view key, const std::string& where) {
  if (key.empty()) throw KeyError(where + ": empty key");
  if (key.find('\0') != std::string_view::npos)
    throw KeyError(where + ": key " + quote(key) + " contains a NUL byte");
  if (key.size() > storage::kMaxKeyBytes)
    throw KeyError(where + ": key " + quote(key.substr(0, 40)) + "... is " +
                   std::to_string(key.size()) + " bytes; at most " +
                   std::to_string(storage::kMaxKeyBytes) + " are stored");
  if (key.front() == '/' || key.back() == '/' || key.find("//") != std::string_view::npos)
    throw KeyError(where + ": key " + quote(key) + " has an empty path component");
}

detail::Observer*& detail::current_observer() {
  static thread_local Observer* current = nullptr;
  return current;
}

TensorDict::TensorDict(std::vector<int64_t> batch_size) : impl_(std::make_shared<Impl>()) {
  for (int64_t d : batch_size)
    if (d < 0) throw ShapeError("in-memory TensorDict: negative batch dimension " + std::to_string(d));
  if (batch_size.size() > storage::kMaxBatchDims)
    throw ShapeError("in-memory TensorDict: at most 16 batch dims");
  impl_->batch_size = std::move(batch_size);
}

TensorDict::TensorDict(std::shared_ptr<Impl> impl, std::string prefix)
    : impl_(std::move(impl)), prefix_(std::move(prefix)) {}

TensorDict TensorDict::create(const std::filesystem::path& dir, std::vector<int64_t> batch_size,
                              StoreOptions options) {
  auto impl = std::make_shared<Impl>();
  impl->store = storage::Store::create(dir, batch_size, options);
  impl->batch_size = impl->store->batch_size();
  return TensorDict(std::move(impl), "");
}

TensorDict TensorDict::open(const std::filesystem::path& dir, OpenMode mode,
                            StoreOptions options) {
  auto impl = std::make_shared<Impl>();
  impl->store = storage::Store::open(dir, mode, options);
  impl->batch_size = impl->store->batch_size();
  return TensorDict(std::move(impl), "");
}

bool TensorDict::is_persistent() const { return impl_->persistent(); }
bool TensorDict::is_writable() const { return !impl_->persistent() || impl_->store->writable(); }
std::filesystem::path TensorDict::path() const {
  return impl_->persistent() ? impl_->store->path() : std::filesystem::path();
}
uint64_t TensorDict::generation() const {
  return impl_->persistent() ? impl_->store->generation() : 0;
}
const std::vector<int64_t>& TensorDict::batch_size() const { return impl_->batch_size; }

std::string TensorDict::full_key(std::string_view key) const {
  std::string k = prefix_;
  k += key;
  return k;
}

std::vector<std::string> TensorDict::keys() const {
  if (auto* o = detail::observer_for(impl_.get())) o->key_set(prefix_);
  std::vector<std::string> out;
  if (impl_->persistent()) {
    impl_->store->for_each([&](std::string_view k, const storage::Entry&) {
      if (k.substr(0, prefix_.size()) == prefix_ && k.find('\0') == std::string_view::npos)
        out.emplace_back(k.substr(prefix_.size()));
    });
    std::sort(out.begin(), out.end());
  } else {
    for (auto it = impl_->tensors.lower_bound(prefix_);
         it != impl_->tensors.end() && it->first.compare(0, prefix_.size(), prefix_) == 0; ++it)
      if (it->first.find('\0') == std::string::npos) out.push_back(it->first.substr(prefix_.size()));
  }
  return out;
}

int64_t TensorDict::size() const {
  if (auto* o = detail::observer_for(impl_.get())) o->key_set(prefix_);
  return static_cast<int64_t>(keys().size());
}

static bool contains_full(const TensorDict::Impl& impl, const std::string& k) {
  if (!impl.persistent()) return impl.tensors.count(k) > 0;
  {
    std::lock_guard lock(impl.mu);
    if (impl.views.count(k)) return true;
  }
  return impl.store->find(k).has_value();
}

bool TensorDict::contains(std::string_view key) const {
  std::string k = full_key(key);
  bool present = contains_full(*impl_, k);
  if (auto* o = detail::observer_for(impl_.get())) o->probe(k, false, present);
  return present;
}

bool TensorDict::has_prefix(std::string_view prefix) const {
  std::string p = full_key(prefix);
  if (!p.empty() && p.back() != '/') p += '/';
  bool found = false;
  if (!impl_->persistent()) {
    auto it = impl_->tensors.lower_bound(p);
    found = it != impl_->tensors.end() && it->first.compare(0, p.size(), p) == 0;
  } else {
    impl_->store->for_each([&](std::string_view k, const storage::Entry&) {
      found = found || k.substr(0, p.size()) == p;
    });
  }
  if (auto* o = detail::observer_for(impl_.get())) o->probe(p, true, found);
  return found;
}

at::Tensor TensorDict::get(std::string_view key) const {
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]] {
    at::Tensor t = get_unobserved(key);
    o->read(full_key(key), t);
    return t;
  }
  return get_unobserved(key);
}

at::Tensor TensorDict::get_unobserved(std::string_view key) const {
  bool ragged = false;
  at::Tensor t;
  if (prefix_.empty()) {
    t = stored(key, &ragged);
  } else {
    std::string k = full_key(key);
    t = stored(k, &ragged);
  }
  if (!ragged) return t;
  return pad_ragged(t, stored(storage::ragged_offsets_key(full_key(key)))).first;
}

at::Tensor TensorDict::stored(std::string_view full, bool* ragged) const {
  Impl& impl = *impl_;
  if (!impl.persistent()) {
    auto it = impl.tensors.find(full);
    if (it == impl.tensors.end()) throw KeyError(where(impl) + ": key " + quote(full) + " not found");
    if (ragged) *ragged = impl.tensors.count(storage::ragged_offsets_key(full)) > 0;
    return it->second;
  }
  std::lock_guard lock(impl.mu);
  if (auto it = impl.views.find(full); it != impl.views.end()) {
    if (ragged) *ragged = it->second.ragged;
    return it->second.tensor;
  }
  auto e = impl.store->find(full);
  if (!e) throw KeyError(where(impl) + ": key " + quote(full) + " not found");
  void* data = const_cast<void*>(impl.store->data(*e));
  auto mapping = impl.store->mapping();
  at::Tensor t = at::from_blob(
      data, e->shape, [mapping](void*) {},
      at::TensorOptions().dtype(to_scalar_type(e->dtype)));
  bool is_ragged = (e->flags & storage::kSlotRagged) && full.find('\0') == std::string_view::npos;
  impl.views.emplace(std::string(full), Impl::View{t, is_ragged});
  if (ragged) *ragged = is_ragged;
  return t;
}

void TensorDict::set(std::string_view key, const at::Tensor& value) {
  Impl& impl = *impl_;
  std::string k = full_key(key);
  check_key_path(k, where(impl));
  if (!value.defined()) throw Error(where(impl) + ": key " + quote(k) + ": undefined tensor");
  auto code = to_storage_dtype(value.scalar_type());
  if (!code)
    throw DTypeError(where(impl) + ": key " + quote(k) + ": dtype " +
                     std::string(c10::toString(value.scalar_type())) +
                     " is not storable (bool, uint8, int8, int16, int32, int64, float16, "
                     "bfloat16, float32, float64, complex64, complex128 are)");
  const auto& batch = impl.batch_size;
  auto shape = value.sizes();
  if (shape.size() < batch.size() || !std::equal(batch.begin(), batch.end(), shape.begin()))
    throw ShapeError(where(impl) + ": key " + quote(k) + ": shape " + shape_string(shape) +
                     " does not start with batch size " + shape_string(batch));
  if (shape.size() > storage::kMaxDims)
    throw ShapeError(where(impl) + ": key " + quote(k) + ": " + std::to_string(shape.size()) +
                     " dims; at most 16");
  auto is_leaf = [&](std::string_view full) {
    return impl.persistent() ? impl.store->find(full).has_value() : impl.tensors.count(full) > 0;
  };
  for (size_t p = k.find('/'); p != std::string::npos; p = k.find('/', p + 1))
    if (is_leaf(std::string_view(k).substr(0, p)))
      throw KeyError(where(impl) + ": key " + quote(k) + ": its ancestor " +
                     quote(k.substr(0, p)) + " is a leaf");
  if (auto* o = detail::observer_for(impl_.get())) o->write(k, value, contains_full(impl, k));
  if (!impl.persistent()) {
    impl.tensors[k] = value;
    impl.tensors.erase(storage::ragged_offsets_key(k));  // a dense value replaces a ragged one
    impl.stamps[k] = ++impl.next_stamp;
    return;
  }
  at::Tensor src = value.detach();
  if (!src.device().is_cpu()) src = src.cpu();
  src = src.resolve_conj().resolve_neg().contiguous();
  impl.store->put(k, *code, std::vector<int64_t>(shape.begin(), shape.end()), src.data_ptr(),
                  static_cast<uint64_t>(src.numel()) * src.element_size());
  const std::string companion = storage::ragged_offsets_key(k);
  impl.store->erase(companion);  // a dense value replaces a ragged one
  std::lock_guard lock(impl.mu);
  impl.views.erase(k);
  impl.views.erase(companion);
}

void TensorDict::erase(std::string_view key) {
  Impl& impl = *impl_;
  std::string k = full_key(key);
  bool found;
  const std::string companion = storage::ragged_offsets_key(k);
  if (impl.persistent()) {
    found = impl.store->erase(k);
    impl.store->erase(companion);  // a ragged key's offsets
    std::lock_guard lock(impl.mu);
    impl.views.erase(k);
    impl.views.erase(companion);
  } else {
    found = impl.tensors.erase(k) > 0;
    impl.tensors.erase(companion);
    impl.stamps.erase(k);
  }
  if (!found) throw KeyError(where(impl) + ": cannot erase key " + quote(k) + ": not found");
  if (auto* o = detail::observer_for(impl_.get())) o->erased(k);
}

void TensorDict::commit() {
  if (impl_->persistent()) impl_->store->commit();
}

void TensorDict::rollback() {
  if (!impl_->persistent()) return;
  impl_->store->rollback();
  std::lock_guard lock(impl_->mu);
  impl_->views.clear();
  impl_->batch_size = impl_->store->batch_size();
}

bool TensorDict::refresh() {
  if (!impl_->persistent() || !impl_->store->refresh()) return false;
  std::lock_guard lock(impl_->mu);
  impl_->views.clear();
  impl_->batch_size = impl_->store->batch_size();
  return true;
}

std::vector<std::string> TensorDict::verify() const {
  if (!impl_->persistent()) return {};
  std::vector<std::string> out;
  for (auto& k : impl_->store->verify())
    if (k.compare(0, prefix_.size(), prefix_) == 0) out.push_back(k.substr(prefix_.size()));
  return out;
}

void TensorDict::set_attr(std::string_view name, std::string value) {
  if (impl_->persistent()) impl_->store->put_attr(name, std::move(value));
  else impl_->attrs[std::string(name)] = std::move(value);
}

void TensorDict::erase_attr(std::string_view name) {
  if (impl_->persistent()) impl_->store->put_attr(name, std::nullopt);
  else impl_->attrs.erase(std::string(name));
}

std::optional<std::string> TensorDict::attr(std::string_view name) const {
  if (impl_->persistent()) return impl_->store->get_attr(name);
  auto it = impl_->attrs.find(name);
  if (it == impl_->attrs.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> TensorDict::attr_names() const {
  if (impl_->persistent()) return impl_->store->attr_names();
  std::vector<std::string> out;
  for (const auto& [k, v] : impl_->attrs) out.push_back(k);
  return out;
}

TensorDict TensorDict::sub(std::string_view prefix) const {
  std::string p = full_key(prefix);
  while (!p.empty() && p.back() == '/') p.pop_back();
  check_key_path(p, where(*impl_));
  return TensorDict(impl_, p + "/");
}

}  // namespace tdstore
