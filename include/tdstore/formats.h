// Arrays in other file formats, read and written without libtorch: IDX (the MNIST family, raw
// or gzip), NumPy .npy (single files and directories of them), safetensors and tensordict
// memmap directories. Readers check every header field and size against the
// file before allocating and throw FormatError naming the file and the field (Error when a
// valid array cannot be allocated, IOError when the file cannot be read); writers produce
// files numpy and other safetensors readers accept. tdstore/io.h wraps these for tensors.
//
// Thread safety: the functions share no state; calls on different files may run at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tdstore/dtype.h"
#include "tdstore/export.h"

namespace tdstore {

// An array in host byte order and C (row-major) order: nbytes = product(shape) x
// dtype_size(dtype) bytes at data, kept alive by owner (which may be null when the caller
// keeps the bytes alive itself, as for writing).
struct Array {
  DType dtype = DType::UInt8;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
  std::shared_ptr<const void> owner;
  // Where the same bytes lie in a file, when they do (a tensordict leaf, a .npy mapped in C and
  // host byte order, map_file_array): an import copies them from there file to file in the
  // kernel instead of through memory. Empty when they are in memory only.
  std::filesystem::path file;
  uint64_t file_offset = 0;

  TDSTORE_API int64_t numel() const;
};

// An IDX file (magic 0 0 type ndim, big-endian u32 dims, big-endian data), gzip-compressed or
// raw. Types: u8, i8, i16, i32, f32, f64.
TDSTORE_API Array read_idx_array(const std::filesystem::path& file);

// The raw bytes of file at offset (C order, host byte order) as an array of dtype and shape,
// mapped read-only (no copy; the owner keeps the mapping), with file and file_offset set.
// FormatError naming the file when it holds fewer bytes than the shape needs.
TDSTORE_API Array map_file_array(const std::filesystem::path& file, uint64_t offset, DType dtype,
                                 const std::vector<int64_t>& shape);

// A .npy file, format version 1.0-3.0, C or Fortran order (returned in C order), little- or
// big-endian, of the dtypes tdstore stores except bfloat16 (b1, u1, i1, i2, i4, i8, f2, f4,
// f8, c8, c16).
TDSTORE_API Array read_npy_array(const std::filesystem::path& file);
// The same array, mapped read-only in place (Array::file set: an import copies it file to file)
// when the file holds it in C order and host byte order; read into memory as read_npy_array
// otherwise. What `tdstore import KEY=FILE.npy` and read_npy_directory take, so that a .npy
// larger than memory imports.
TDSTORE_API Array map_npy_array(const std::filesystem::path& file);
// Writes format 1.0 (2.0 when the header needs it), little-endian, C order. DTypeError for
// bfloat16, which .npy has no code for.
TDSTORE_API void write_npy_array(const std::filesystem::path& file, const Array& array);

// safetensors: u64 header length, a JSON header {"name": {"dtype", "shape", "data_offsets"},
// "__metadata__": {...}}, then the bytes. Offsets are checked: in range, ordered, neither
// overlapping nor leaving holes, covering the data exactly. Complex dtypes have no
// safetensors code (DTypeError when writing them).
TDSTORE_API std::map<std::string, Array> read_safetensors_arrays(
    const std::filesystem::path& file, std::map<std::string, std::string>* metadata = nullptr);
TDSTORE_API void write_safetensors_arrays(const std::filesystem::path& file,
                                          const std::map<std::string, Array>& arrays,
                                          const std::map<std::string, std::string>& metadata = {});

// A tensordict memmap directory (what `tensordict.TensorDict.memmap_(prefix)` writes, versions
// 0.3 on: a meta.json per dict, a raw `<key>.memmap` file per leaf, a directory per sub-dict;
// storage/tensordict_memmap.h lists the layouts read). Sub-dicts become '/' keys. Every
// meta.json field is checked (dtype, shapes beginning with the batch size, each file's size
// exactly the shape's bytes, no entry naming a path outside the directory): FormatError naming
// the file, the entry and the field. Leaves are sorted by key.
struct TensorDictLeaf {
  std::string key;             // "a/b/c" for leaf c of sub-dict a/b
  std::filesystem::path file;  // empty for a tensor without elements (tensordict writes none)
  DType dtype = DType::UInt8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
};
struct TensorDictLayout {
  std::vector<int64_t> batch_size;  // the root dict's
  std::vector<TensorDictLeaf> leaves;
};
TDSTORE_API TensorDictLayout read_tensordict_layout(const std::filesystem::path& dir);
// The leaves mapped read-only (no copy; the owners keep the mappings).
TDSTORE_API std::map<std::string, Array> read_tensordict_arrays(
    const std::filesystem::path& dir, std::vector<int64_t>* batch_size = nullptr);
// Writes the arrays as tensordict 0.5 on writes them (robust file names, sub-dicts listed), every
// dict with batch_size, which each array's shape must begin with (ShapeError otherwise).
// tensordict.TensorDict.load_memmap(dir) reads it back.
TDSTORE_API void write_tensordict_arrays(const std::filesystem::path& dir,
                                         const std::map<std::string, Array>& arrays,
                                         const std::vector<int64_t>& batch_size);

// Every .npy file under dir, recursively, keyed by its path without ".npy" ("a/b.npy" is key
// "a/b"). C-order little-endian files are mapped, others converted in memory. FormatError when
// there is none.
TDSTORE_API std::map<std::string, Array> read_npy_directory(const std::filesystem::path& dir);

}  // namespace tdstore
