// tdstore/io.h: the torch-free readers and writers of tdstore/formats.h, for tensors. Read
// tensors share the reader's buffer (no copy); written tensors are made contiguous first.
#include "tdstore/io.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>

#include "src/dtype_map.h"
#include "storage/messages.h"
#include "tdstore/errors.h"
#include "tdstore/formats.h"

namespace tdstore {
using storage::in_quotes;
namespace {

at::Tensor tensor_of(Array a) {
  auto owner = std::move(a.owner);
  return at::from_blob(
      const_cast<void*>(a.data), a.shape, [owner](void*) mutable { owner.reset(); },
      at::TensorOptions().dtype(to_scalar_type(a.dtype)));
}

// A view of t's bytes (t made contiguous on the CPU); the Array keeps that tensor alive.
Array array_of(const at::Tensor& tensor, const std::string& what) {
  at::Tensor t = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous();
  auto code = to_storage_dtype(t.scalar_type());
  if (!code)
    throw DTypeError(what + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                     " is not stored by tdstore");
  Array a;
  a.dtype = *code;
  a.shape = t.sizes().vec();
  a.data = t.data_ptr();
  a.nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
  a.owner = std::make_shared<at::Tensor>(std::move(t));
  return a;
}

}  // namespace

at::Tensor read_idx(const std::filesystem::path& file) { return tensor_of(read_idx_array(file)); }

at::Tensor read_npy(const std::filesystem::path& file) { return tensor_of(read_npy_array(file)); }

void write_npy(const std::filesystem::path& file, const at::Tensor& tensor) {
  write_npy_array(file, array_of(tensor, file.string()));
}

std::map<std::string, at::Tensor> read_safetensors(const std::filesystem::path& file,
                                                   std::map<std::string, std::string>* metadata) {
  std::map<std::string, at::Tensor> out;
  for (auto& [name, a] : read_safetensors_arrays(file, metadata))
    out.emplace(name, tensor_of(std::move(a)));
  return out;
}

void write_safetensors(const std::filesystem::path& file,
                       const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::map<std::string, Array> arrays;
  for (const auto& [name, t] : tensors)
    arrays.emplace(name, array_of(t, file.string() + ": tensor " + in_quotes(name)));
  write_safetensors_arrays(file, arrays, metadata);
}

std::map<std::string, at::Tensor> read_tensordict(const std::filesystem::path& dir,
                                                  std::vector<int64_t>* batch_size) {
  std::map<std::string, at::Tensor> out;
  for (auto& [key, a] : read_tensordict_arrays(dir, batch_size))
    out.emplace(key, tensor_of(std::move(a)));
  return out;
}

void write_tensordict(const std::filesystem::path& dir,
                      const std::map<std::string, at::Tensor>& tensors,
                      const std::vector<int64_t>& batch_size) {
  std::map<std::string, Array> arrays;
  for (const auto& [key, t] : tensors)
    arrays.emplace(key, array_of(t, dir.string() + ": key " + in_quotes(key)));
  write_tensordict_arrays(dir, arrays, batch_size);
}

}  // namespace tdstore
