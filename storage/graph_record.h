// The value of a compiled-graph cache record (docs/FORMAT.md, "graph/"), framed and unframed
// without libtorch: u32 little-endian meta length | meta (UTF-8 JSON object) | one zstd frame
// holding the module archive. storage/graph_meta.h parses the JSON.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tdstore::storage {

// A module archive larger than this is refused on both sides: a frame header claiming more is
// damage, never an allocation.
inline constexpr uint64_t kMaxGraphModuleBytes = uint64_t{1} << 30;

struct GraphRecord {
  nlohmann::json meta;  // always an object
  std::string module;   // the decompressed archive
};

// Throws Error when the archive exceeds kMaxGraphModuleBytes or meta is not an object.
std::string encode_graph_record(const nlohmann::json& meta, std::string_view module);
// Throws CorruptionError naming `where` and what is wrong (truncated, bad JSON, not an object,
// not a zstd frame, a frame larger than kMaxGraphModuleBytes, a corrupt frame, bytes after it).
GraphRecord decode_graph_record(std::string_view value, const std::string& where);

}  // namespace tdstore::storage
