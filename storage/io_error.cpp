#include "storage/io_error.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "tdstore/errors.h"

namespace tdstore {

void throw_io_error(const std::filesystem::path& path, std::string_view call) {
  int err = errno;
  throw IOError(path.string() + ": " + std::string(call) + " failed: " + std::strerror(err));
}

}  // namespace tdstore
