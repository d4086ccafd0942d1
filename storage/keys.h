// The rules of stored key paths (docs/FORMAT.md, "Keys"), in one place for every layer.
#pragma once

#include <string>
#include <string_view>

namespace tdstore::storage {

// Why `key` cannot be stored, or empty when it can. A key is 1 to 304 bytes without NUL,
// made of '/'-separated components that are neither empty nor "." or "..". `ragged`: the key
// also needs its companion "<key>\0offsets", which must fit the same 304 bytes.
std::string key_problem(std::string_view key, bool ragged = false);

// Throws KeyError "<where>: key '<key>' <problem>" unless key_problem(key, ragged) is empty.
void check_key(std::string_view key, std::string_view where, bool ragged = false);

// The companion key holding a ragged key's offsets. NUL never occurs in a user's key.
std::string ragged_offsets_key(std::string_view key);
inline constexpr std::string_view kRaggedSuffix{"\0offsets", 8};
// A ragged companion ("<key>\0offsets"): the user key it belongs to, else empty.
std::string_view ragged_owner(std::string_view stored_key);

}  // namespace tdstore::storage
