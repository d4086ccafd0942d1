#include "storage/messages.h"

#include <cerrno>
#include <cstring>

#include "tdstore/errors.h"

namespace tdstore::storage {

std::string in_quotes(std::string_view key) {
  std::string out(1, '\'');
  out.append(key).push_back('\'');
  return out;
}

std::string shape_text(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

void throw_os_error(const std::filesystem::path& path, std::string_view what, int err,
                    std::string_view context) {
  throw IOError(path.string() + ": " + std::string(what) + ": " + std::strerror(err) +
                std::string(context));
}

void throw_io_error(const std::filesystem::path& path, std::string_view call) {
  throw_os_error(path, std::string(call) + " failed", errno);
}

}  // namespace tdstore::storage
