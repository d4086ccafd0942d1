// Reading and writing tensors in other formats: IDX (the MNIST family, raw or gzip), NumPy
// .npy, safetensors and tensordict memmap directories. Tensor wrappers of the torch-free readers
// and writers in tdstore/formats.h, with their checks and errors; a read tensor owns the buffer the
// reader filled (no copy).
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tdstore/export.h"

namespace tdstore {

// An IDX file (http://yann.lecun.com/exdb/mnist/ layout: magic 0 0 type ndim, big-endian u32
// dims, big-endian data), gzip-compressed or raw. Types: u8, i8, i16, i32, f32, f64.
TDSTORE_API at::Tensor read_idx(const std::filesystem::path& file);

// A .npy file, format version 1.0-3.0, C or Fortran order, little- or big-endian, of the dtypes
// tdstore stores (b1, u1, i1, i2, i4, i8, f2, f4, f8, c8, c16).
TDSTORE_API at::Tensor read_npy(const std::filesystem::path& file);
// Writes format 1.0 (2.0 when the header needs it), little-endian, C order.
TDSTORE_API void write_npy(const std::filesystem::path& file, const at::Tensor& tensor);

// safetensors: u64 header length, a JSON header {"name": {"dtype", "shape", "data_offsets"},
// "__metadata__": {...}}, then the bytes. Offsets are checked: in range, ordered, not
// overlapping, covering the data exactly.
TDSTORE_API std::map<std::string, at::Tensor> read_safetensors(
    const std::filesystem::path& file, std::map<std::string, std::string>* metadata = nullptr);
TDSTORE_API void write_safetensors(const std::filesystem::path& file,
                                   const std::map<std::string, at::Tensor>& tensors,
                                   const std::map<std::string, std::string>& metadata = {});

// A tensordict memmap directory (tdstore/formats.h, read_tensordict_arrays): its leaves as '/'
// keys, tensors over the read-only mapped files (no copy; never write into them), and the root
// dict's batch size. write_tensordict writes tensors as tensordict.TensorDict.memmap_ does.
TDSTORE_API std::map<std::string, at::Tensor> read_tensordict(
    const std::filesystem::path& dir, std::vector<int64_t>* batch_size = nullptr);
TDSTORE_API void write_tensordict(const std::filesystem::path& dir,
                                  const std::map<std::string, at::Tensor>& tensors,
                                  const std::vector<int64_t>& batch_size);

}  // namespace tdstore
