// tensordict's memmap directories (`tensordict.TensorDict.memmap_(prefix)`): one meta.json per
// (sub-)dict and one raw `<key>.memmap` file per leaf, C order, host byte order, no header; a
// sub-dict is a directory of its own. This file parses and writes meta.json from bytes, without
// touching the file system; storage/array_dirs.cpp walks the directories (tdstore/formats.h).
//
// Layouts read (tensordict's source, tensordict/_td.py `_memmap_`/`_load_memmap`, and
// tensordict/_td_memmap.py `_save_metadata`/`_update_metadata`):
//   v0.3-v0.4: {"shape": [batch], "device": ..., "_type": "<class '...TensorDict'>",
//               "<leaf>": {"device", "shape", "dtype": "torch.float32"}}; sub-dicts are
//               the subdirectories holding a meta.json (not listed in the parent's).
//   v0.5 on:   leaves also carry "is_nested"; sub-dicts are listed as "<key>": {"type":
//               "TensorDict"}. Since the robust key encoding, file and directory names are the
//               key with unsafe characters written %XX (the raw key is still read).
// tensordict < 0.3 wrote meta.pt (a pickle): refused. Nested (jagged) tensors, tensorclasses
// and non-tensor data are refused with FormatError naming the file and the entry.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "storage/dtype.h"

namespace tdstore::storage {

struct TensorDictLeafMeta {
  std::string key;  // as in the dict (one path component)
  DType dtype = DType::UInt8;
  std::vector<int64_t> shape;  // begins with the dict's batch size
  uint64_t nbytes = 0;         // product(shape) * dtype size, checked not to overflow
};

struct TensorDictMeta {
  std::vector<int64_t> batch_size;         // "shape"
  std::vector<TensorDictLeafMeta> leaves;  // in key order
  std::vector<std::string> children;       // sub-dicts listed with {"type": ...} (v0.5 on)
};

// Parses one meta.json; FormatError naming `file`, the entry and the field for anything but
// a TensorDict of plain tensors of the dtypes tdstore stores.
TensorDictMeta parse_tensordict_meta(std::string_view text, const std::string& file);

// tensordict's dtype names ("torch.float32") of tdstore's dtypes, and back.
std::string tensordict_dtype_name(DType d);
std::optional<DType> tensordict_dtype(std::string_view name);

// A key as tensordict names its file or directory (the robust encoding: '/', '%', control
// characters, space and <>:"|?*\ written %XX; "" as "%"; "." and ".." as %2E...).
std::string tensordict_file_key(std::string_view key);

// meta.json of a dict of the given batch size, leaves and sub-dicts, as tensordict writes it.
std::string tensordict_meta_json(const std::vector<int64_t>& batch_size,
                                 const std::vector<TensorDictLeafMeta>& leaves,
                                 const std::vector<std::string>& children);

}  // namespace tdstore::storage
