// tdstore's dtype registry, without libtorch. The numeric codes are part of the on-disk format
// (docs/FORMAT.md, "dtype codes"): a code never changes meaning; retired codes stay reserved.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "tdstore/export.h"

namespace tdstore {

enum class DType : uint8_t {
  Bool = 1,
  UInt8 = 2,
  Int8 = 3,
  Int16 = 4,
  Int32 = 5,
  Int64 = 6,
  Float16 = 7,
  BFloat16 = 8,
  Float32 = 9,
  Float64 = 10,
  Complex64 = 11,
  Complex128 = 12,
};

// Bytes per element; 0 for a code outside the registry.
TDSTORE_API size_t dtype_size(DType d);
// "float32", "uint8", ...; "invalid" for a code outside the registry.
TDSTORE_API std::string_view dtype_name(DType d);
// The code for a registry name, if any.
TDSTORE_API std::optional<DType> dtype_from_name(std::string_view name);
TDSTORE_API bool dtype_valid(uint8_t code);
// Bytes of a tensor of `shape` with `item`-byte elements: item * shape[0] * shape[1] * ...,
// multiplied in that order; nullopt when a dimension is negative or a partial product
// overflows 64 bits (also when a later dimension is 0: [2^62, 0] of float32 is refused). The
// one rule by which shapes are stored and read.
TDSTORE_API std::optional<uint64_t> shape_bytes(const int64_t* shape, size_t ndim, uint64_t item);

}  // namespace tdstore
