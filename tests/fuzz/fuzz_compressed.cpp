// libFuzzer target: a compressed key's stored bytes (storage/compressed.h; FORMAT.md,
// "Compressed keys"). Input: u8 row bytes (0-255), u16 rows, then the stored bytes. Reading the
// index and decompressing every row must end in data or a CorruptionError, never a crash or an
// allocation the bytes cannot justify (ASan's allocation limit catches one); rows read back
// from blocks that check_blocks() found intact re-encode and read back the same. Seeds come
// from compress_rows() and append_rows() over small tensors (make_seeds).
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "storage/compressed.h"
#include "tdstore/errors.h"

using namespace tdstore::storage;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const RowLayout layout{uint64_t{data[1]} | uint64_t{data[2]} << 8, data[0]};
  const uint8_t* object = data + 3;
  const uint64_t stored = size - 3;
  try {
    BlockIndex idx = read_index(object, stored, layout, "fuzz");
    std::vector<uint8_t> rows(layout.rows * layout.row_bytes);
    read_rows(object, idx, 0, layout.rows, rows.data(), "fuzz");
    if (!check_blocks(object, idx).empty()) __builtin_trap();  // read_rows passed every block
    // Any row range reads what the whole read gave.
    if (layout.rows > 1) {
      std::vector<uint8_t> part((layout.rows - 1) * layout.row_bytes);
      read_rows(object, idx, 1, layout.rows - 1, part.data(), "fuzz");
      if (!part.empty() && std::memcmp(part.data(), rows.data() + layout.row_bytes, part.size()))
        __builtin_trap();
    }
    // Re-encoded under the index's own settings, the rows read back the same.
    tdstore::Compression c = tdstore::Compression::zstd(3, 4096);
    std::string again = compress_rows({rows.data(), {}}, layout, c).join();
    BlockIndex idx2 =
        read_index(reinterpret_cast<const uint8_t*>(again.data()), again.size(), layout, "again");
    std::vector<uint8_t> back(rows.size());
    read_rows(reinterpret_cast<const uint8_t*>(again.data()), idx2, 0, layout.rows, back.data(),
              "again");
    if (back != rows) __builtin_trap();
  } catch (const tdstore::CorruptionError&) {
  }
  return 0;
}
