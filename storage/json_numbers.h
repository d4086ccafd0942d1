// Integers from JSON read off disk. nlohmann's get<int64_t>() converts a float by a cast, which
// is undefined out of range, and wraps an unsigned value above INT64_MAX; these take only JSON
// integers in range and throw std::invalid_argument otherwise (callers turn it into an error
// naming the record and the field).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace tdstore::storage {

inline int64_t json_int(const nlohmann::json& j) {
  if (!j.is_number_integer() || (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX)))
    throw std::invalid_argument("not an integer in range: " + j.dump().substr(0, 40));
  return j.get<int64_t>();
}

inline uint64_t json_uint(const nlohmann::json& j) {
  if (!j.is_number_unsigned())
    throw std::invalid_argument("not a non-negative integer: " + j.dump().substr(0, 40));
  return j.get<uint64_t>();
}

// An array of integers of T (int64_t or uint64_t).
template <class T>
std::vector<T> json_ints(const nlohmann::json& j) {
  static_assert(std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>);
  if (!j.is_array()) throw std::invalid_argument("not an array: " + j.dump().substr(0, 40));
  std::vector<T> out;
  out.reserve(j.size());
  for (const auto& v : j)
    out.push_back(std::is_same_v<T, int64_t> ? T(json_int(v)) : T(json_uint(v)));
  return out;
}

}  // namespace tdstore::storage
