// Administration of stores without libtorch: what the `tdstore` tool does to a store as a
// whole. Part of the storage engine (torch-free); errors are tdstore::Error subclasses naming
// the path.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>

namespace tdstore {

struct CompactOptions {
  // Rebuild the key directory with this capacity (at least the live keys); unset: keep it.
  std::optional<int64_t> key_capacity;
  // Called as tensor bytes are copied: (bytes copied so far, total). Optional.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct CompactResult {
  int64_t keys = 0;                  // live keys copied (ragged offsets count as keys)
  uint64_t arena_bytes_before = 0;   // arena bytes in use before
  uint64_t arena_bytes_after = 0;
  uint64_t generation = 0;           // the compacted store's generation (the old one + 1)
};

// Rewrites the store without holes (and with a new key capacity when asked), every record
// field carried through (flags such as ragged, the spare capacity of appended keys), with its
// attributes, lazy-property provenance and compiled graphs, and swaps it in atomically
// (renameat2(RENAME_EXCHANGE)): a crash at any instant leaves the old store or the new one,
// complete. LockError while another writer holds the store; Error when key_capacity is below
// the live keys or out of range. Handles opened before keep reading the old files; readers
// move to the new store on refresh().
CompactResult compact(const std::filesystem::path& dir, const CompactOptions& options = {});

}  // namespace tdstore
