#include "storage/durable_dirs.h"

#include <vector>

#include "tdstore/errors.h"

namespace tdstore::storage {

bool create_directories_durably(Env& env, const std::filesystem::path& dir_in) {
  namespace fs = std::filesystem;
  if (dir_in.empty()) return false;  // the parent of a bare relative name: the working directory
  const fs::path dir = fs::absolute(dir_in).lexically_normal();
  std::vector<fs::path> missing;  // innermost first
  std::error_code ec;
  for (fs::path p = dir; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.push_back(p);
    if (p == p.parent_path()) break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (!fs::create_directory(*it, ec) && ec)
      throw IOError(it->string() + ": cannot create directory: " + ec.message());
    env.sync_dir(it->parent_path());
  }
  return !missing.empty();
}

}  // namespace tdstore::storage
