// import_arrays (tdstore/admin.h) with room reserved for rows to come: import_arrays_chunked
// appends its chunks into keys laid out once for the whole source, so no append moves a key.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "tdstore/admin.h"

namespace tdstore::storage {

// With append: the arrays' rows from `from` on, `rows` at a time (0: all at once), each chunk
// committed before the next (progress(rows done, rows) after each commit); before_copy(data,
// bytes) is called on each part before it is copied.
struct ImportChunks {
  int64_t from = 0;
  int64_t rows = 0;
  std::function<void(int64_t, int64_t)> progress;
  std::function<void(const void*, uint64_t)> before_copy;
};

// The rows (dim 0) every array shares: ArgumentError when there is none, ShapeError naming
// the array that is 0-d or has other rows. The one rule of what an import takes.
int64_t shared_rows(const std::string& where, const std::map<std::string, Array>& arrays);

// As import_arrays; keys it creates or moves reserve room for reserve_rows rows (0: none).
ImportResult import_rows(const std::filesystem::path& dir,
                         const std::map<std::string, Array>& arrays, bool append,
                         const std::optional<Compression>& compression, int64_t reserve_rows,
                         const ImportChunks& chunks = {});

}  // namespace tdstore::storage
