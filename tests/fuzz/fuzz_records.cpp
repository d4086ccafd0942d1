// libFuzzer target: the catalog records tdstore writes (storage/records.h,
// storage/graph_record.h, storage/graph_meta.h). Input: u8 kind (0 lazy provenance, 1 Loader
// position, 2 row-feature progress, 3 compiled-graph framing and meta), then the record. Parsing
// must end in a record or a CorruptionError; a parsed record written back parses to the same
// record.
#include <cstdint>
#include <string>
#include <string_view>

#include "storage/graph_meta.h"
#include "storage/graph_record.h"
#include "storage/records.h"
#include "tdstore/errors.h"

using namespace tdstore::storage;

template <class P, class W>
void round_trip(std::string_view text, P parse, W write) {
  try {
    auto once = write(parse(text, "fuzz"));
    if (write(parse(once, "fuzz")) != once) __builtin_trap();
  } catch (const tdstore::CorruptionError&) {
  }
}

void graph_round_trip(std::string_view value) {
  try {
    auto once = decode_graph_record(value, "fuzz");
    parse_graph_meta(once.meta);  // a GraphMeta or a CorruptionError, nothing else
    auto twice = decode_graph_record(encode_graph_record(once.meta, once.module), "fuzz");
    if (twice.meta != once.meta || twice.module != once.module) __builtin_trap();
  } catch (const tdstore::CorruptionError&) {
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      round_trip(text, parse_lazy_record, lazy_record_json);
      break;
    case 1:
      round_trip(text, parse_loader_record, loader_record_json);
      break;
    case 2:
      round_trip(text, parse_row_feature_record, row_feature_record_json);
      break;
    default:
      graph_round_trip(text);
      break;
  }
  return 0;
}
