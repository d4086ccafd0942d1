// import_arrays (tdstore/admin.h) with room reserved for rows to come: import_arrays_chunked
// appends its chunks into keys laid out once for the whole source, so no append moves a key.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "tdstore/admin.h"

namespace tdstore::storage {

// As import_arrays; keys it creates or moves reserve room for reserve_rows rows (0: none).
ImportResult import_rows(const std::filesystem::path& dir,
                         const std::map<std::string, Array>& arrays, bool append,
                         const std::optional<Compression>& compression, int64_t reserve_rows);

}  // namespace tdstore::storage
