// libFuzzer targets for the import formats (storage/formats.h), one binary per format selected
// by FORMAT_NPY / FORMAT_SAFETENSORS / FORMAT_IDX / FORMAT_TENSORDICT: the input is a whole
// file. Parsing must end in a layout inside the file or a FormatError; a tensordict meta.json
// (storage/tensordict_memmap.h) in leaves whose byte counts match their shapes.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "storage/formats.h"
#include "storage/tensordict_memmap.h"
#include "tdstore/errors.h"

using namespace tdstore::storage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view file(reinterpret_cast<const char*>(data), size);
  try {
#if defined(FORMAT_NPY)
    ArrayLayout l = parse_npy(file, size, "fuzz.npy");
#elif defined(FORMAT_SAFETENSORS)
    std::map<std::string, std::string> meta;
    for (const auto& [name, l] : parse_safetensors(file, size, "fuzz.safetensors", &meta))
      if (l.offset > size || size - l.offset < l.nbytes) __builtin_trap();
    ArrayLayout l;
#elif defined(FORMAT_TENSORDICT)
    const auto meta = parse_tensordict_meta(file, "meta.json");
    for (const auto& leaf : meta.leaves) {
      auto n = tdstore::shape_bytes(leaf.shape.data(), leaf.shape.size(), dtype_size(leaf.dtype));
      if (!n || *n != leaf.nbytes || leaf.key.empty() || leaf.key.find('/') != std::string::npos)
        __builtin_trap();
    }
    ArrayLayout l;
#else
    ArrayLayout l = parse_idx(file, size, "fuzz.idx");
#endif
    if (l.offset > size || size - l.offset < l.nbytes) __builtin_trap();  // the contract
  } catch (const tdstore::FormatError&) {
  }
  return 0;
}
