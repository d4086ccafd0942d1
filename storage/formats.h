// Headers of the file formats tdstore imports (NumPy .npy, safetensors, IDX), parsed from
// bytes without libtorch. Every parser validates what it reads with arithmetic that cannot
// overflow and throws FormatError naming the file and the field; a layout it returns lies
// inside the file. storage/array_files.cpp reads and writes the data (tdstore/formats.h);
// tests/fuzz/ fuzzes these parsers.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "storage/dtype.h"

namespace tdstore::storage {

// Where one array's bytes lie in a file.
struct ArrayLayout {
  DType dtype = DType::UInt8;
  std::vector<int64_t> shape;  // as the bytes are laid out (Fortran order: reversed)
  bool fortran = false;        // .npy fortran_order: the array is the transpose of `shape`
  bool big_endian = false;     // multi-byte elements stored big-endian
  uint64_t offset = 0;         // of the first data byte in the file
  uint64_t nbytes = 0;         // product(shape) * element size
};

// The .npy descr ("<f4", "|u1") and the safetensors dtype ("F32") of a dtype; nullopt when
// the format has none.
std::optional<std::string> npy_descr(DType d);
std::optional<std::string> safetensors_dtype(DType d);

// .npy, format versions 1.0-3.0. npy_header_size: bytes of magic, version, length and header,
// from the file's first 12 bytes (or fewer when the file is shorter). parse_npy: `head` holds
// at least that many bytes; the data must fit in `file_size`.
uint64_t npy_header_size(std::string_view first, const std::string& file);
ArrayLayout parse_npy(std::string_view head, uint64_t file_size, const std::string& file);

// IDX (magic 0 0 type ndim, big-endian u32 dims, big-endian data). idx_header_size: bytes of
// magic and dims from the first 4 bytes. parse_idx: the data follows the header; when
// `file_size` is known (not gzip), it must hold it.
uint64_t idx_header_size(std::string_view first, const std::string& file);
ArrayLayout parse_idx(std::string_view head, std::optional<uint64_t> file_size,
                      const std::string& file);

// safetensors: u64 header length n, n bytes of JSON, then the data. safetensors_header_size
// from the first 8 bytes; parse_safetensors from at least that many. Offsets are checked: in
// range, ordered, neither overlapping nor leaving holes, covering the data exactly.
struct NamedLayout {
  std::string name;
  ArrayLayout layout;
};
uint64_t safetensors_header_size(std::string_view first, uint64_t file_size,
                                 const std::string& file);
std::vector<NamedLayout> parse_safetensors(std::string_view head, uint64_t file_size,
                                           const std::string& file,
                                           std::map<std::string, std::string>* metadata = nullptr);

}  // namespace tdstore::storage
