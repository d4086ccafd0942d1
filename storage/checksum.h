// Content and structure checksums: XXH3-64 with seed 0 everywhere (docs/FORMAT.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tdstore::storage {

uint64_t xxh3(const void* data, size_t n);
inline uint64_t xxh3(std::string_view s) { return xxh3(s.data(), s.size()); }

// Incremental XXH3-64, for content hashed in pieces (non-contiguous tensors, streams).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  void* state_;
};

}  // namespace tdstore::storage
