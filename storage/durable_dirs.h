// Directories that survive a power loss: a created directory's name is durable only once its
// parent is synced (docs/DESIGN.md, "Durability through power loss").
#pragma once

#include <filesystem>

#include "tdstore/env.h"

namespace tdstore::storage {

// Creates dir and its missing ancestors, syncing the parent of each one created (through env)
// before returning. Returns whether dir was created. Throws IOError naming the directory.
bool create_directories_durably(Env& env, const std::filesystem::path& dir);

}  // namespace tdstore::storage
