// A dense key stored compressed (docs/FORMAT.md, "Compressed keys") as its readers hold it: the
// stored bytes inside a store's mapping and their block index, so that rows are decompressed
// from only the blocks holding them. Internal to src/; no libtorch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "storage/compressed.h"
#include "tdstore/dtype.h"

namespace tdstore::detail {

// Immutable once made (TensorDict::Impl::packed): any thread may read rows through it. pin
// keeps the bytes mapped and unchanged (Store::View) while the part lives, whatever the store
// commits meanwhile.
struct PackedPart {
  const uint8_t* object = nullptr;
  storage::BlockIndex index;   // checked against the key's shape (storage::read_index)
  std::string where;           // the store and key, for errors
  std::vector<int64_t> shape;  // the key's shape and dtype, as stored
  DType dtype{};
  // The commit that wrote the bytes (Store::Entry::generation): 0 while staged on the writer,
  // whose rollback() may let later staged writes change them.
  uint64_t generation = 0;
  std::shared_ptr<const void> pin;
};

}  // namespace tdstore::detail
