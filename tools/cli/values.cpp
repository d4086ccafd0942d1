#include "values.h"

#include <bit>
#include <cstring>

namespace tdstore::cli {
namespace {

template <class T>
T load(const Array& a, uint64_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(a.data) + i * sizeof(T), sizeof(T));
  return v;
}

// IEEE 754 binary16 to binary32 (exact: every half is a float).
float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (mant << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalize
    exp = 113;
    while (!(mant & 0x400)) mant <<= 1, --exp;
    bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace

bool is_floating(DType d) {
  return d == DType::Float16 || d == DType::BFloat16 || d == DType::Float32 || d == DType::Float64;
}

bool is_complex(DType d) { return d == DType::Complex64 || d == DType::Complex128; }

bool is_integral(DType d) {
  return d == DType::UInt8 || d == DType::Int8 || d == DType::Int16 || d == DType::Int32 ||
         d == DType::Int64;
}

int64_t integer_at(const Array& a, uint64_t i) {
  switch (a.dtype) {
    case DType::Bool:
      return load<uint8_t>(a, i) != 0;
    case DType::UInt8:
      return load<uint8_t>(a, i);
    case DType::Int8:
      return load<int8_t>(a, i);
    case DType::Int16:
      return load<int16_t>(a, i);
    case DType::Int32:
      return load<int32_t>(a, i);
    case DType::Int64:
      return load<int64_t>(a, i);
    default:
      return static_cast<int64_t>(value_at(a, i));
  }
}

double value_at(const Array& a, uint64_t i) {
  switch (a.dtype) {
    case DType::Float16:
      return half_to_float(load<uint16_t>(a, i));
    case DType::BFloat16:
      return std::bit_cast<float>(static_cast<uint32_t>(load<uint16_t>(a, i)) << 16);
    case DType::Float32:
      return load<float>(a, i);
    case DType::Float64:
      return load<double>(a, i);
    case DType::Complex64:
    case DType::Complex128:
      return complex_at(a, i).real();
    default:
      return static_cast<double>(integer_at(a, i));
  }
}

std::complex<double> complex_at(const Array& a, uint64_t i) {
  if (a.dtype == DType::Complex64) {
    auto re = load<float>(a, 2 * i), im = load<float>(a, 2 * i + 1);
    return {re, im};
  }
  if (a.dtype == DType::Complex128) return {load<double>(a, 2 * i), load<double>(a, 2 * i + 1)};
  return {value_at(a, i), 0.0};
}

Array slice_rows(const Array& a, int64_t begin, int64_t end) {
  Array out = a;
  const uint64_t row = a.shape[0] ? a.nbytes / static_cast<uint64_t>(a.shape[0]) : 0;
  out.shape[0] = end - begin;
  out.data = static_cast<const uint8_t*>(a.data) + static_cast<uint64_t>(begin) * row;
  out.nbytes = static_cast<uint64_t>(end - begin) * row;
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace tdstore::cli
