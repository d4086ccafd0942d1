// The arena's address range: reserved once, the file mapped over all of it. Pages past end of
// file are never touched (every view lies inside committed or staged extents), so the file
// can grow underneath without remapping and views stay valid while the Mapping lives.
#include <string>

#include "storage/store.h"
#include "tdstore/errors.h"

namespace tdstore::storage {

// PrivateReserve: in-place writes to a view are copy-on-write and never reach the file, and the
// (mostly untouched) range takes no commit charge.
Mapping::Mapping(Env& env, File& arena, uint64_t reserve) : size_(reserve) {
  try {
    region_ = env.map(arena, reserve, Env::MapMode::PrivateReserve);
  } catch (const IOError& e) {
    throw IOError(std::string(e.what()) +
                  " (arena_reserve); open with a smaller StoreOptions::arena_reserve");
  }
  base_ = region_->data();
}

Mapping::Mapping(const uint8_t* bytes, uint64_t size) : base_(bytes), size_(size) {}

}  // namespace tdstore::storage
