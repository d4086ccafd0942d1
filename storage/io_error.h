// Helpers that turn errno into a tdstore::IOError naming the path and the call.
#pragma once

#include <filesystem>
#include <string_view>

namespace tdstore {

// Throws IOError("<path>: <call> failed: <strerror(errno)>"). Reads errno.
[[noreturn]] void throw_io_error(const std::filesystem::path& path, std::string_view call);

}  // namespace tdstore
