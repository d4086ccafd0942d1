// libFuzzer target: a dataset manifest's JSON text (storage/dataset_manifest.h). Parsing must end
// in a Manifest, a FormatError or a CorruptionError; a manifest that parses and seals every shard
// with rows (what a publish writes; format 1 has no seals) writes back to text that parses to
// the same manifest.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "storage/dataset_manifest.h"
#include "tdstore/errors.h"

namespace {
bool same(const tdstore::storage::Manifest& a, const tdstore::storage::Manifest& b) {
  return a.row_shape == b.row_shape && a.shards == b.shards && a.keys == b.keys &&
         a.seals == b.seals;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tdstore::storage;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Manifest m;
  try {
    m = parse_manifest(text, "fuzz");
  } catch (const tdstore::FormatError&) {
    return 0;
  } catch (const tdstore::CorruptionError&) {
    return 0;
  }
  for (const auto& [shard, rows] : m.shards)
    if (rows > 0 && !m.seals.count(shard)) return 0;  // format 1: not what a publish writes
  if (!same(parse_manifest(manifest_json(m), "fuzz"), m)) std::abort();  // round trip
  return 0;
}
