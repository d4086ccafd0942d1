// The rules of appending rows along batch dim 0, one owner for every caller
// (TensorDict::append, tdstore::import_arrays): which keys the rows must bring, what each must
// match, which derived keys the append drops, and the batch size it leaves.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tdstore/dtype.h"
#include "tdstore/options.h"

namespace tdstore {
class File;
}  // namespace tdstore

namespace tdstore::storage {

class Store;

// A key as the dict holds it or as the rows bring it. A ragged key is described by its values.
struct ColumnSpec {
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  bool ragged = false;
};

struct AppendPlan {
  bool creating = false;           // the dict holds no key and no row: the rows become the dict
  std::vector<int64_t> grown;      // the batch size after the append
  std::vector<std::string> stale;  // derived keys the rows do not bring; the append drops them
};

// Checks everything before anything is written, in this order: the batch sizes (same rank,
// equal dims after the first, at least one dim), the key sets (the dict's keys other than the
// derived ones the rows do not bring equal the rows' keys), then key by key, in key order:
// ragged on both sides or neither, the same dtype, shapes equal after dim 0. `current` holds the
// dict's keys (never a ragged key's offsets), `derived` its derived keys (storage/derived.h),
// sorted. Throws ShapeError, KeyError or DTypeError naming `where` and the key.
AppendPlan plan_append(const std::string& where, const std::vector<int64_t>& batch,
                       const std::map<std::string, ColumnSpec>& current,
                       const std::vector<std::string>& derived,
                       const std::vector<int64_t>& rows_batch,
                       const std::map<std::string, ColumnSpec>& rows);

// One tensor's share of the rows: a dense key, or a ragged key's values or offsets (flags
// kSlotRagged). `shape` is the rows' own shape; `capacity` reserves room for later appends.
// file/file_offset: where the same bytes lie in a file, when they do; a raw key then copies them
// from there (Payload), a compressed one reads data.
struct AppendPart {
  std::string key;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
  uint64_t capacity = 0;
  uint8_t flags = 0;
  File* file = nullptr;
  uint64_t file_offset = 0;
};

// Stages the plan on a writable store: drops the stale keys, sets the grown batch size, then
// puts each part (creating) or appends it to the stored tensor, whose dim 0 grows by the part's.
// The plan is made from the store's batch size (Store::batch_size(), which includes what is
// staged) and keys: ShapeError naming the key, before anything is staged, when a dense part
// would not end with plan.grown[0] rows. The caller commits, or rolls back or aborts its write
// group, whatever is thrown.
// Keys the plan creates are stored under `compression` (none: raw); appended rows take their
// key's own.
void apply_append(Store& store, const AppendPlan& plan, const std::vector<AppendPart>& parts,
                  const Compression& compression = {});

}  // namespace tdstore::storage
