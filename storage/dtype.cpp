#include "tdstore/dtype.h"

#include <array>

namespace tdstore {
namespace {

struct Info {
  std::string_view name;
  size_t size;
};

// Indexed by code; entry 0 is the invalid code.
constexpr std::array<Info, 13> kInfo = {{
    {"invalid", 0},
    {"bool", 1},
    {"uint8", 1},
    {"int8", 1},
    {"int16", 2},
    {"int32", 4},
    {"int64", 8},
    {"float16", 2},
    {"bfloat16", 2},
    {"float32", 4},
    {"float64", 8},
    {"complex64", 8},
    {"complex128", 16},
}};

}  // namespace

bool dtype_valid(uint8_t code) { return code >= 1 && code < kInfo.size(); }

size_t dtype_size(DType d) {
  auto c = static_cast<uint8_t>(d);
  return dtype_valid(c) ? kInfo[c].size : 0;
}

std::optional<uint64_t> shape_bytes(const int64_t* shape, size_t ndim, uint64_t item) {
  uint64_t n = item;
  for (size_t i = 0; i < ndim; ++i)
    if (shape[i] < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(shape[i]), &n))
      return std::nullopt;
  return n;
}

std::string_view dtype_name(DType d) {
  auto c = static_cast<uint8_t>(d);
  return kInfo[dtype_valid(c) ? c : 0].name;
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (uint8_t c = 1; c < kInfo.size(); ++c)
    if (kInfo[c].name == name) return static_cast<DType>(c);
  return std::nullopt;
}

}  // namespace tdstore
