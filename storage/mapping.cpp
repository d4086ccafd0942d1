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

// The mapping maps the arena file from offset 0, and a pointer into it is only ever one of its
// own: views keep the mapping they point into alive, so its range is never reused meanwhile.
std::optional<Store::FileBytes> Store::arena_bytes(const void* p, size_t n) const {
  if (!mapping_ || !arena_file_) return std::nullopt;
  const auto* b = static_cast<const uint8_t*>(p);
  const uint8_t* base = mapping_->base();
  if (b < base || n > mapping_->size() || static_cast<uint64_t>(b - base) > mapping_->size() - n)
    return std::nullopt;
  return FileBytes{arena_file_, static_cast<uint64_t>(b - base)};
}

}  // namespace tdstore::storage
