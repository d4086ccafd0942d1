// The arena's address range: reserved once, the file mapped over all of it. Pages past end of
// file are never touched (every view lies inside committed or staged extents), so the file
// can grow underneath without remapping and views stay valid while the Mapping lives.
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "storage/store.h"
#include "tdstore/errors.h"

namespace tdstore::storage {

Mapping::Mapping(int fd, uint64_t reserve, const std::filesystem::path& path) : size_(reserve) {
  // MAP_PRIVATE: in-place writes to a view are copy-on-write and never reach the file.
  // MAP_NORESERVE: no commit charge for the (mostly untouched) range.
  void* p = ::mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) {
    throw IOError(path.string() + ": mmap of " + std::to_string(reserve) +
                  " bytes (arena_reserve) failed: " + std::strerror(errno) +
                  "; open with a smaller StoreOptions::arena_reserve");
  }
  base_ = static_cast<uint8_t*>(p);
}

Mapping::Mapping(const uint8_t* bytes, uint64_t size)
    : base_(const_cast<uint8_t*>(bytes)), size_(size), owned_(false) {}

Mapping::~Mapping() {
  if (owned_) ::munmap(base_, size_);
}

}  // namespace tdstore::storage
