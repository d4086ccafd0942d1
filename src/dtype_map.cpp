#include "src/dtype_map.h"

namespace tdstore {

using storage::DType;

std::optional<DType> to_storage_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Bool:
      return DType::Bool;
    case c10::ScalarType::Byte:
      return DType::UInt8;
    case c10::ScalarType::Char:
      return DType::Int8;
    case c10::ScalarType::Short:
      return DType::Int16;
    case c10::ScalarType::Int:
      return DType::Int32;
    case c10::ScalarType::Long:
      return DType::Int64;
    case c10::ScalarType::Half:
      return DType::Float16;
    case c10::ScalarType::BFloat16:
      return DType::BFloat16;
    case c10::ScalarType::Float:
      return DType::Float32;
    case c10::ScalarType::Double:
      return DType::Float64;
    case c10::ScalarType::ComplexFloat:
      return DType::Complex64;
    case c10::ScalarType::ComplexDouble:
      return DType::Complex128;
    default:
      return std::nullopt;
  }
}

c10::ScalarType to_scalar_type(DType d) {
  switch (d) {
    case DType::Bool:
      return c10::ScalarType::Bool;
    case DType::UInt8:
      return c10::ScalarType::Byte;
    case DType::Int8:
      return c10::ScalarType::Char;
    case DType::Int16:
      return c10::ScalarType::Short;
    case DType::Int32:
      return c10::ScalarType::Int;
    case DType::Int64:
      return c10::ScalarType::Long;
    case DType::Float16:
      return c10::ScalarType::Half;
    case DType::BFloat16:
      return c10::ScalarType::BFloat16;
    case DType::Float32:
      return c10::ScalarType::Float;
    case DType::Float64:
      return c10::ScalarType::Double;
    case DType::Complex64:
      return c10::ScalarType::ComplexFloat;
    case DType::Complex128:
      return c10::ScalarType::ComplexDouble;
  }
  return c10::ScalarType::Undefined;
}

}  // namespace tdstore
