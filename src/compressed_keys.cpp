// A TensorDict's compressed keys (docs/DESIGN.md, "Compressed keys"): the compression a handle
// applies and a key is stored with, and a key's stored bytes as row readers hold them
// (detail::PackedPart). get() decompresses in src/tensordict.cpp; row reads in
// src/tensordict_ops.cpp; the Loader in src/loader_gather.cpp.
#include <ATen/core/Tensor.h>

#include "src/observer.h"
#include "src/tensordict_impl.h"
#include "storage/compressed.h"
#include "tdstore/env.h"

namespace tdstore {

std::shared_ptr<const detail::PackedPart> TensorDict::Impl::packed(std::string_view full) const {
  if (!store) return nullptr;
  if (auto it = lazy.find(full); it != lazy.end() && it->second.result.defined())
    return nullptr;  // a read-only store's property recomputed in memory: get() gives it
  auto e = store->find(full);
  if (!e || !e->compressed() || (e->flags & storage::kSlotRagged)) return nullptr;
  auto view = store->view(*e);
  auto part = std::make_shared<detail::PackedPart>();
  part->object = static_cast<const uint8_t*>(view.data);
  part->where = where(*this) + ": key " + in_quotes(full);
  part->index = storage::read_index(
      part->object, e->nbytes,
      *storage::row_layout(e->shape, dtype_size(e->dtype)),  // a compressed key has one
      part->where);
  part->pin = std::move(view.pin);
  part->shape = e->shape;
  part->dtype = e->dtype;
  part->generation = e->generation;
  return part;
}

void detail::advise_huge_pages(const at::Tensor& t) {
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (bytes >= (size_t{2} << 20)) Env::posix()->advise(t.data_ptr(), bytes, Env::Advice::HugePages);
}

Compression TensorDict::compression() const { return impl_->compression; }

Compression TensorDict::compression_of(std::string_view key) const {
  if (auto* o = detail::observer_for(impl_.get())) [[unlikely]]
    o->unsupported("compression_of()");  // not a modelled read: the call runs eagerly
  const std::string full = full_key(key);
  if (!impl_->is_leaf(full)) throw KeyError(impl_->missing_key(full));
  if (!impl_->persistent()) return Compression::none();
  const auto e = impl_->store->find(full);
  if (!e || !e->compressed()) return Compression::none();
  const std::string at = where(*impl_) + ": key " + in_quotes(full);
  const auto view = impl_->store->view(*e);
  const auto index = storage::read_index(static_cast<const uint8_t*>(view.data), e->nbytes,
                                         *storage::row_layout(e->shape, dtype_size(e->dtype)), at);
  return Compression::zstd(index.level, static_cast<int64_t>(index.block_bytes));
}

}  // namespace tdstore
