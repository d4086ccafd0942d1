// The pieces of error messages, one spelling each: a key in single quotes, a shape in
// brackets, an OS error as its call and strerror text. Every message names its store (path)
// first; these helpers spell what follows.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace tdstore::storage {

// 'key'
std::string in_quotes(std::string_view key);
// [2, 3]; [] for a scalar's shape.
std::string shape_text(std::span<const int64_t> shape);

// Throws IOError("<path>: <what>: <strerror(err)><context>").
[[noreturn]] void throw_os_error(const std::filesystem::path& path, std::string_view what, int err,
                                 std::string_view context = {});
// throw_os_error(path, "<call> failed", errno).
[[noreturn]] void throw_io_error(const std::filesystem::path& path, std::string_view call);

}  // namespace tdstore::storage
