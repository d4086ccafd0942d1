// TensorDict core: storage-backed and in-memory leaves behind one handle. Every member a
// function can call reports to the observer watching the dict (src/observer.h).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <optional>

#include "src/dtype_map.h"
#include "src/observer.h"
#include "src/tensordict_impl.h"
#include "storage/compressed.h"
#include "tdstore/env.h"

namespace tdstore {
namespace {

using detail::Answer;
using detail::Query;

// The answer to q, through the observer when one watches the dict.
template <class T>
T observed(const TensorDict::Impl& impl, Query q, const std::string& key) {
  if (auto* o = detail::observer_for(&impl)) [[unlikely]]
    return std::get<T>(o->query(q, key, [&] { return detail::ask(impl, q, key); }));
  return std::get<T>(detail::ask(impl, q, key));
}

void unsupported(const TensorDict::Impl& impl, std::string_view what) {
  if (auto* o = detail::observer_for(&impl)) [[unlikely]]
    o->unsupported(what);
}

}  // namespace

std::string where(const TensorDict::Impl& impl) {
  return impl.persistent() ? impl.store->path().string() : std::string("in-memory TensorDict");
}

std::string shape_string(at::IntArrayRef shape) { return shape_text({shape.data(), shape.size()}); }

detail::Observer*& detail::current_observer() {
  static thread_local Observer* current = nullptr;
  return current;
}

TensorDict::TensorDict(std::vector<int64_t> batch_size) : impl_(std::make_shared<Impl>()) {
  for (int64_t d : batch_size)
    if (d < 0)
      throw ShapeError("in-memory TensorDict: negative batch dimension " + std::to_string(d));
  if (batch_size.size() > storage::kMaxBatchDims)
    throw ShapeError("in-memory TensorDict: at most 16 batch dims");
  impl_->batch_size = std::move(batch_size);
}

TensorDict::TensorDict(std::shared_ptr<Impl> impl, std::string prefix)
    : impl_(std::move(impl)), prefix_(std::move(prefix)) {}

TensorDict TensorDict::create(const std::filesystem::path& dir, std::vector<int64_t> batch_size,
                              StoreOptions options) {
  auto impl = std::make_shared<Impl>();
  if (options.compression && options.compression->enabled()) {
    storage::check_compression(*options.compression, dir.string());
    if (options.format_version < static_cast<int>(storage::kIndexedFormatVersion))
      throw ArgumentError(dir.string() + ": compression needs format_version 4 or later (format " +
                          std::to_string(options.format_version) + " has no compressed keys)");
  }
  impl->store = storage::Store::create(dir, batch_size, options);
  impl->batch_size = impl->store->batch_size();
  if (options.compression) {  // recorded with the first commit
    impl->compression = *options.compression;
    impl->store->put_attr(storage::kCompressionAttr, impl->compression.text());
  }
  return TensorDict(std::move(impl), "");
}

TensorDict TensorDict::open(const std::filesystem::path& dir, OpenMode mode, StoreOptions options) {
  auto impl = std::make_shared<Impl>();
  if (options.compression && options.compression->enabled())
    storage::check_compression(*options.compression, dir.string());
  impl->store = storage::Store::open(dir, mode, options);
  impl->batch_size = impl->store->batch_size();
  if (options.compression) {
    impl->compression = *options.compression;
  } else if (auto recorded = impl->store->get_attr(storage::kCompressionAttr)) {
    try {
      impl->compression = Compression::parse(*recorded);
    } catch (const ArgumentError&) {
      throw CorruptionError(dir.string() + ": the recorded default compression " +
                            in_quotes(*recorded) + " is not one this build reads");
    }
  }
  return TensorDict(std::move(impl), "");
}

bool TensorDict::is_persistent() const { return observed<bool>(*impl_, Query::IsPersistent, ""); }
bool TensorDict::is_writable() const { return observed<bool>(*impl_, Query::IsWritable, ""); }
std::filesystem::path TensorDict::path() const {
  return observed<std::string>(*impl_, Query::Path, "");
}
uint64_t TensorDict::generation() const {
  return static_cast<uint64_t>(observed<int64_t>(*impl_, Query::Generation, ""));
}
const std::vector<int64_t>& TensorDict::batch_size() const {
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    return o->batch_size([&]() -> const std::vector<int64_t>& { return impl_->batch_size; });
  return impl_->batch_size;
}

std::string TensorDict::full_key(std::string_view key) const {
  std::string k = prefix_;
  k += key;
  return k;
}

std::vector<std::string> TensorDict::keys() const {
  auto full = observed<std::vector<std::string>>(*impl_, Query::Keys, prefix_);
  for (auto& k : full) k.erase(0, prefix_.size());
  return full;
}

int64_t TensorDict::size() const { return observed<int64_t>(*impl_, Query::Count, prefix_); }

bool TensorDict::contains(std::string_view key) const {
  std::string k = full_key(key);
  return observed<bool>(*impl_, Query::Contains, k);
}

bool TensorDict::has_prefix(std::string_view prefix) const {
  std::string p = full_key(prefix);
  if (!p.empty() && p.back() != '/') p += '/';
  return observed<bool>(*impl_, Query::HasPrefix, p);
}

at::Tensor TensorDict::get(std::string_view key) const {
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]] {
    std::string k = full_key(key);
    return o->read(detail::ReadKind::Get, k, [&] { return impl_->get(k); });
  }
  if (prefix_.empty()) return impl_->get(key);
  return impl_->get(full_key(key));
}

// ---------------------------------------------------------------------------- Impl

std::vector<std::string> TensorDict::Impl::keys_under(std::string_view prefix) const {
  std::vector<std::string> out;
  if (persistent()) {
    storage::MutexLock lock(&mu);
    const auto& index = store->key_index();
    for (auto it = index.lower_bound(prefix);
         it != index.end() && std::string_view(*it).substr(0, prefix.size()) == prefix; ++it)
      if (it->find('\0') == std::string::npos) out.push_back(*it);
  } else {
    for (auto it = tensors.lower_bound(prefix);
         it != tensors.end() && std::string_view(it->first).substr(0, prefix.size()) == prefix;
         ++it)
      if (it->first.find('\0') == std::string::npos) out.push_back(it->first);
  }
  return out;
}

int64_t TensorDict::Impl::count_under(std::string_view prefix) const {
  if (persistent() && prefix.empty()) {  // O(1) once the store's key index exists
    storage::MutexLock lock(&mu);
    return static_cast<int64_t>(store->key_count());
  }
  return static_cast<int64_t>(keys_under(prefix).size());
}

bool TensorDict::Impl::contains(std::string_view full) const {
  if (!persistent()) return tensors.count(full) > 0;
  storage::MutexLock lock(&mu);
  if (views.count(full)) return true;
  return store->find(full).has_value();
}

bool TensorDict::Impl::has_prefix(std::string_view prefix) const {
  if (!persistent()) {
    auto it = tensors.lower_bound(prefix);
    return it != tensors.end() && std::string_view(it->first).substr(0, prefix.size()) == prefix;
  }
  storage::MutexLock lock(&mu);
  return store->has_prefix(prefix);
}

at::Tensor TensorDict::Impl::get(std::string_view full) const {
  if (persistent() && !lazy.empty()) {  // a read-only store's property recomputed in memory
    if (auto it = lazy.find(full); it != lazy.end() && it->second.result.defined())
      return it->second.result;
  }
  bool ragged = false;
  at::Tensor t = stored(full, &ragged);
  if (!ragged) return t;
  return pad_ragged(t, stored(storage::ragged_offsets_key(full))).first;
}

at::Tensor TensorDict::Impl::stored(std::string_view full, bool* ragged) const {
  if (!persistent()) {
    auto it = tensors.find(full);
    if (it == tensors.end()) throw KeyError(missing_key(full));
    if (ragged) *ragged = tensors.count(storage::ragged_offsets_key(full)) > 0;
    return it->second;
  }
  std::optional<at::Tensor> found = [&]() -> std::optional<at::Tensor> {
    storage::MutexLock lock(&mu);
    if (auto it = views.find(full); it != views.end()) {
      if (ragged) *ragged = it->second.ragged;
      return it->second.tensor;
    }
    auto e = store->find(full);
    if (!e) return std::nullopt;
    bool is_ragged = (e->flags & storage::kSlotRagged) && full.find('\0') == std::string_view::npos;
    if (ragged) *ragged = is_ragged;
    if (e->compressed()) {            // a new tensor each time, decompressed; nothing kept here
      store->check_stored(full, *e);  // its raw size is one its stored bytes can hold
      at::Tensor t = at::empty(e->shape, at::TensorOptions().dtype(to_scalar_type(e->dtype)));
      detail::advise_huge_pages(t);  // written whole: a fault per 2 MiB
      store->read_rows(full, *e, 0, t.dim() ? static_cast<uint64_t>(t.size(0)) : 1, t.data_ptr());
      return t;
    }
    auto view = store->view(*e);
    at::Tensor t = at::from_blob(
        const_cast<void*>(view.data), e->shape, [pin = std::move(view.pin)](void*) {},
        at::TensorOptions().dtype(to_scalar_type(e->dtype)));
    views.emplace(std::string(full), View{t, is_ragged});
    return t;
  }();
  if (!found) throw KeyError(missing_key(full));  // the key index is read without mu held
  return *std::move(found);
}

int64_t TensorDict::Impl::version_of(std::string_view k) const {
  int64_t v = 0;
  for (auto key : {std::string(k), storage::ragged_offsets_key(k)})
    if (auto it = tensors.find(key);
        it != tensors.end() && it->second.defined() && !it->second.is_inference())
      v += it->second._version();
  return v;
}

std::optional<uint64_t> TensorDict::Impl::stamp(std::string_view k) const {
  storage::MutexLock lock(&mu);
  auto it = stamps.find(k);
  if (it == stamps.end()) return std::nullopt;
  if (it->second.version != version_of(k)) renew_stamp(it->first);  // written in place since
  return it->second.value;
}

bool TensorDict::Impl::is_leaf(std::string_view full) const {
  return persistent() ? contains(full) : tensors.count(full) > 0;
}

namespace detail {
void for_each_set_question(const std::string& key,
                           FunctionRef<void(Query, const std::string&)> ask) {
  ask(Query::IsWritable, "");
  ask(Query::BatchSize, "");
  for (size_t p = key.find('/'); p != std::string::npos; p = key.find('/', p + 1))
    ask(Query::Contains, key.substr(0, p));
  ask(Query::HasPrefix, key + "/");
}
}  // namespace detail

void TensorDict::Impl::check_set(const std::string& k,
                                 std::optional<c10::IntArrayRef> shape) const {
  detail::for_each_set_question(k, [&](Query q, const std::string& arg) {
    switch (q) {
      case Query::IsWritable:
        if (persistent() && !store->writable())
          throw ReadOnlyError(where(*this) + ": set " + in_quotes(k) +
                              " on a store opened ReadOnly; open it with OpenMode::ReadWrite");
        return;
      case Query::BatchSize:
        if (shape && (shape->size() < batch_size.size() ||
                      !std::equal(batch_size.begin(), batch_size.end(), shape->begin())))
          throw ShapeError(where(*this) + ": key " + in_quotes(k) + ": shape " +
                           shape_string(*shape) + " does not start with batch size " +
                           shape_string(batch_size));
        return;
      case Query::Contains:
        if (is_leaf(arg))
          throw KeyError(where(*this) + ": key " + in_quotes(k) + ": its ancestor " +
                         in_quotes(arg) + " is a leaf");
        return;
      case Query::HasPrefix:
        if (has_prefix(arg))
          throw KeyError(where(*this) + ": key " + in_quotes(k) + " is a prefix of other keys (" +
                         in_quotes(keys_under(arg).front()) + "); erase them first");
        return;
      default:
        return;
    }
  });
}

// ---------------------------------------------------------------------------- writes

void TensorDict::set(std::string_view key, const at::Tensor& value) {
  set(key, value, impl_->compression);
}

void TensorDict::set(std::string_view key, const at::Tensor& value,
                     const Compression& compression) {
  Impl& impl = *impl_;
  std::string k = full_key(key);
  storage::check_key(k, where(impl));
  if (!value.defined())
    throw ArgumentError(where(impl) + ": key " + in_quotes(k) + ": undefined tensor");
  if (value.is_nested())
    throw DTypeError(where(impl) + ": key " + in_quotes(k) +
                     ": nested tensors are not stored; store the rows as a ragged key "
                     "(set_ragged)");
  if (value.layout() != at::kStrided || value.is_meta() || value.is_quantized())
    throw DTypeError(where(impl) + ": key " + in_quotes(k) +
                     ": only dense tensors with data are stored, not " +
                     (value.is_meta() ? std::string("meta tensors")
                                      : "layout " + std::string(c10::toString(value.layout()))));
  auto code = to_storage_dtype(value.scalar_type());
  if (!code)
    throw DTypeError(where(impl) + ": key " + in_quotes(k) + ": dtype " +
                     std::string(c10::toString(value.scalar_type())) +
                     " is not storable (bool, uint8, int8, int16, int32, int64, float16, "
                     "bfloat16, float32, float64, complex64, complex128 are)");
  auto real = [&] {
    auto shape = value.sizes();
    impl.check_set(k, shape);
    if (shape.size() > storage::kMaxDims)
      throw ShapeError(where(impl) + ": key " + in_quotes(k) + ": " + std::to_string(shape.size()) +
                       " dims; at most 16");
    if (!impl.persistent()) {
      impl.tensors[k] = value;
      impl.tensors.erase(storage::ragged_offsets_key(k));  // a dense value replaces a ragged one
      impl.renew_stamp(k);
      return;
    }
    at::Tensor src = value.detach();
    if (!src.device().is_cpu()) src = src.cpu();
    try {  // an expanded view materializes here: refuse what cannot be allocated, by size
      src = src.resolve_conj().resolve_neg().contiguous();
    } catch (const c10::Error&) {
      throw CapacityError(where(impl) + ": key " + in_quotes(k) + ": a " + shape_string(shape) +
                          " " + std::string(c10::toString(value.scalar_type())) +
                          " tensor is stored contiguous and its bytes cannot be allocated");
    }
    storage::WriteGroup group(*impl.store);
    const std::vector<int64_t> dims(shape.begin(), shape.end());
    const auto nbytes = static_cast<uint64_t>(src.numel()) * src.element_size();
    auto replaced = compression.enabled() ? impl.store->put_compressed(
                                                k, *code, dims, src.data_ptr(), nbytes, compression)
                                          : impl.store->put(k, *code, dims, src.data_ptr(), nbytes);
    const std::string companion = storage::ragged_offsets_key(k);
    if (replaced && (*replaced & storage::kSlotRagged))
      impl.store->erase(companion);  // a dense value replaces a ragged one
    group.done();
    storage::MutexLock lock(&impl.mu);
    impl.views.erase(k);
    impl.views.erase(companion);
  };
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    return o->set(k, value, real);
  real();
}

void TensorDict::erase(std::string_view key) {
  Impl& impl = *impl_;
  std::string k = full_key(key);
  storage::check_key(k, where(impl));  // the rules set() applies: no internal names
  auto real = [&] {
    if (impl.persistent() && !impl.store->writable())
      throw ReadOnlyError(where(impl) + ": erase " + in_quotes(k) +
                          " on a store opened ReadOnly; open it with OpenMode::ReadWrite");
    bool found;
    const std::string companion = storage::ragged_offsets_key(k);
    if (impl.persistent()) {
      storage::WriteGroup group(*impl.store);
      found = impl.store->erase(k);
      impl.store->erase(companion);  // a ragged key's offsets
      group.done();
      storage::MutexLock lock(&impl.mu);
      impl.views.erase(k);
      impl.views.erase(companion);
    } else {
      found = impl.tensors.erase(k) > 0;
      impl.tensors.erase(companion);
      impl.stamps.erase(k);
    }
    if (!found) throw KeyError(where(impl) + ": cannot erase key " + in_quotes(k) + ": not found");
  };
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    return o->erase(k, real);
  real();
}

void TensorDict::commit() {
  unsupported(*impl_, "commit()");
  if (impl_->persistent()) impl_->store->commit();
}

void TensorDict::rollback() {
  unsupported(*impl_, "rollback()");
  if (!impl_->persistent()) return;
  impl_->store->rollback();
  storage::MutexLock lock(&impl_->mu);
  impl_->views.clear();
  impl_->batch_size = impl_->store->batch_size();
}

bool TensorDict::refresh() {
  unsupported(*impl_, "refresh()");
  if (!impl_->persistent() || !impl_->store->refresh()) return false;
  storage::MutexLock lock(&impl_->mu);
  impl_->views.clear();
  impl_->batch_size = impl_->store->batch_size();
  std::erase_if(impl_->lazy, [](const auto& kv) { return kv.second.result.defined(); });
  return true;
}

std::vector<std::string> TensorDict::verify() const {
  unsupported(*impl_, "verify()");
  if (!impl_->persistent()) return {};
  std::vector<std::string> out;
  for (auto& k : impl_->store->verify())
    if (k.compare(0, prefix_.size(), prefix_) == 0) out.push_back(k.substr(prefix_.size()));
  return out;
}

void TensorDict::set_attr(std::string_view name, std::string value) {
  unsupported(*impl_, "set_attr()");
  if (impl_->persistent())
    impl_->store->put_attr(name, std::move(value));
  else
    impl_->attrs[std::string(name)] = std::move(value);
}

void TensorDict::erase_attr(std::string_view name) {
  unsupported(*impl_, "erase_attr()");
  if (impl_->persistent())
    impl_->store->put_attr(name, std::nullopt);
  else
    impl_->attrs.erase(std::string(name));
}

std::optional<std::string> TensorDict::attr(std::string_view name) const {
  return observed<std::optional<std::string>>(*impl_, Query::Attr, std::string(name));
}

std::vector<std::string> TensorDict::attr_names() const {
  return observed<std::vector<std::string>>(*impl_, Query::AttrNames, "");
}

TensorDict TensorDict::sub(std::string_view prefix) const {
  std::string p = full_key(prefix);
  while (!p.empty() && p.back() == '/') p.pop_back();
  storage::check_key(p, where(*impl_));
  return TensorDict(impl_.ptr(), p + "/");
}

// ---------------------------------------------------------------------------- errors

namespace detail {

Answer ask(const TensorDict::Impl& impl, Query q, const std::string& key) {
  switch (q) {
    case Query::Contains:
      return impl.contains(key);
    case Query::HasPrefix:
      return impl.has_prefix(key);
    case Query::Keys:
      return impl.keys_under(key);
    case Query::Count:
      return impl.count_under(key);
    case Query::BatchSize:
      return impl.batch_size;
    case Query::Attr: {
      if (impl.persistent()) return impl.store->get_attr(key);
      auto it = impl.attrs.find(key);
      return it == impl.attrs.end() ? std::optional<std::string>() : std::optional(it->second);
    }
    case Query::AttrNames: {
      if (impl.persistent()) return impl.store->attr_names();
      std::vector<std::string> out;
      for (const auto& [k, v] : impl.attrs) out.push_back(k);
      return out;
    }
    case Query::IsRagged: {
      std::string companion = storage::ragged_offsets_key(key);
      return impl.persistent() ? impl.contains(companion) : impl.tensors.count(companion) > 0;
    }
    case Query::IsPersistent:
      return impl.persistent();
    case Query::IsWritable:
      return !impl.persistent() || impl.store->writable();
    case Query::Path:
      return impl.persistent() ? impl.store->path().string() : std::string();
    case Query::Generation:
      return impl.persistent() ? static_cast<int64_t>(impl.store->generation()) : int64_t{0};
  }
  throw Error("unknown query");
}

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Key:
      return "KeyError";
    case ErrorKind::Shape:
      return "ShapeError";
    case ErrorKind::DType:
      return "DTypeError";
    case ErrorKind::Capacity:
      return "CapacityError";
    case ErrorKind::ReadOnly:
      return "ReadOnlyError";
    case ErrorKind::Other:
      return "Error";
  }
  return "Error";
}

std::optional<ErrorKind> error_kind_from_name(std::string_view name) {
  for (int k = 0; k <= static_cast<int>(ErrorKind::Other); ++k)
    if (name == error_kind_name(static_cast<ErrorKind>(k))) return static_cast<ErrorKind>(k);
  return std::nullopt;
}

ErrorKind error_kind(const Error& e) {
  if (dynamic_cast<const KeyError*>(&e)) return ErrorKind::Key;
  if (dynamic_cast<const ShapeError*>(&e)) return ErrorKind::Shape;
  if (dynamic_cast<const DTypeError*>(&e)) return ErrorKind::DType;
  if (dynamic_cast<const CapacityError*>(&e)) return ErrorKind::Capacity;
  if (dynamic_cast<const ReadOnlyError*>(&e)) return ErrorKind::ReadOnly;
  return ErrorKind::Other;
}

void throw_error(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::Key:
      throw KeyError(message);
    case ErrorKind::Shape:
      throw ShapeError(message);
    case ErrorKind::DType:
      throw DTypeError(message);
    case ErrorKind::Capacity:
      throw CapacityError(message);
    case ErrorKind::ReadOnly:
      throw ReadOnlyError(message);
    case ErrorKind::Other:
      break;
  }
  throw Error(message);
}

const char* query_name(Query q) {
  switch (q) {
    case Query::Contains:
      return "contains";
    case Query::HasPrefix:
      return "has_prefix";
    case Query::Keys:
      return "keys";
    case Query::Count:
      return "size";
    case Query::BatchSize:
      return "batch_size";
    case Query::Attr:
      return "attr";
    case Query::AttrNames:
      return "attr_names";
    case Query::IsRagged:
      return "is_ragged";
    case Query::IsPersistent:
      return "is_persistent";
    case Query::IsWritable:
      return "is_writable";
    case Query::Path:
      return "path";
    case Query::Generation:
      return "generation";
  }
  return "?";
}

std::optional<Query> query_from_name(std::string_view name) {
  for (int q = 0; q <= static_cast<int>(Query::Generation); ++q)
    if (name == query_name(static_cast<Query>(q))) return static_cast<Query>(q);
  return std::nullopt;
}

}  // namespace detail
}  // namespace tdstore
