// Reading and writing tensors in other formats: IDX (the MNIST family, raw or gzip), NumPy
// .npy, and safetensors. Readers parse headers without libtorch (storage/formats.h), check
// every size against the file before allocating, and throw FormatError naming the file and
// the field (Error when a valid array cannot be allocated); writers produce files numpy and
// other safetensors readers accept.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>

namespace tdstore {

// An IDX file (http://yann.lecun.com/exdb/mnist/ layout: magic 0 0 type ndim, big-endian u32
// dims, big-endian data), gzip-compressed or raw. Types: u8, i8, i16, i32, f32, f64.
at::Tensor read_idx(const std::filesystem::path& file);

// A .npy file, format version 1.0-3.0, C or Fortran order, little- or big-endian, of the dtypes
// tdstore stores (b1, u1, i1, i2, i4, i8, f2, f4, f8, c8, c16).
at::Tensor read_npy(const std::filesystem::path& file);
// Writes format 1.0 (2.0 when the header needs it), little-endian, C order.
void write_npy(const std::filesystem::path& file, const at::Tensor& tensor);

// safetensors: u64 header length, a JSON header {"name": {"dtype", "shape", "data_offsets"},
// "__metadata__": {...}}, then the bytes. Offsets are checked: in range, ordered, not
// overlapping, covering the data exactly.
std::map<std::string, at::Tensor> read_safetensors(const std::filesystem::path& file,
                                                   std::map<std::string, std::string>* metadata = nullptr);
void write_safetensors(const std::filesystem::path& file,
                       const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace tdstore
