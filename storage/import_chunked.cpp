// import_arrays_chunked (tdstore/admin.h): an import in row chunks, one commit each, resumed
// from the rows an interrupted one committed, and checked byte for byte against its source.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "storage/compressed.h"
#include "storage/format.h"
#include "storage/import_rows.h"
#include "storage/messages.h"
#include "storage/store.h"
#include "tdstore/admin.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"

namespace tdstore {
using storage::in_quotes;
namespace fs = std::filesystem;
namespace {

// Rows [begin, end) of a (C order, batch dim 0) array, in place.
Array rows_of(const Array& a, int64_t begin, int64_t end) {
  const uint64_t row = a.shape[0] ? a.nbytes / static_cast<uint64_t>(a.shape[0]) : 0;
  Array out = a;
  out.shape[0] = end - begin;
  out.data = static_cast<const uint8_t*>(a.data) + static_cast<uint64_t>(begin) * row;
  out.nbytes = static_cast<uint64_t>(end - begin) * row;
  out.file_offset = a.file_offset + static_cast<uint64_t>(begin) * row;
  return out;
}

// Whether the bytes at `stored` equal the array's: from its file when it has one, read with
// File::read_at a piece at a time (a file cut short meanwhile is an IOError naming it, not a
// SIGBUS through the mapping), else in memory.
bool same_bytes(const void* stored, const Array& a) {
  if (a.nbytes == 0) return true;
  if (a.file.empty()) return std::memcmp(stored, a.data, a.nbytes) == 0;
  const auto file = Env::posix()->open(a.file, Env::Access::ReadOnly);
  constexpr uint64_t kPiece = 1 << 20;
  std::vector<uint8_t> piece(std::min(a.nbytes, kPiece));
  for (uint64_t done = 0; done < a.nbytes; done += kPiece) {
    const uint64_t n = std::min(a.nbytes - done, kPiece);
    file->read_at(a.file_offset + done, piece.data(), n);
    if (file->size() < a.file_offset + done + n)
      throw IOError(a.file.string() + ": " + std::to_string(file->size()) +
                    " bytes, fewer than the " + std::to_string(a.file_offset + done) + " + " +
                    std::to_string(n) + " to compare (cut short meanwhile?)");
    if (std::memcmp(static_cast<const uint8_t*>(stored) + done, piece.data(), n) != 0) return false;
  }
  return true;
}

// The rows the store holds when it is an earlier import of these arrays cut short (same keys,
// dtypes and trailing dims, at most their rows, equal bytes); nullopt otherwise.
std::optional<int64_t> committed_prefix(const StoreReader& r,
                                        const std::map<std::string, Array>& arrays, int64_t rows) {
  const auto s = r.summary();
  if (s.batch_size.size() != 1 || s.batch_size[0] > rows) return std::nullopt;
  const int64_t have = s.batch_size[0];
  const auto entries = r.entries();
  if (have == 0 && entries.empty()) return 0;  // created by an import killed before its rows
  if (entries.size() != arrays.size()) return std::nullopt;
  for (const auto& e : entries) {
    auto it = arrays.find(e.key);
    if (it == arrays.end() || e.ragged || e.lazy || e.dtype != it->second.dtype ||
        e.shape.size() != it->second.shape.size() ||
        !std::equal(e.shape.begin() + 1, e.shape.end(), it->second.shape.begin() + 1))
      return std::nullopt;
  }
  for (const auto& e : entries) {
    const Array stored = r.read(e.key), source = rows_of(arrays.at(e.key), 0, have);
    if (stored.nbytes != source.nbytes || !same_bytes(stored.data, source)) return std::nullopt;
  }
  return have;
}

// Maps in the pages of a (possibly file-mapped) array before it is copied.
void prefault(const void* data, uint64_t nbytes) {
  if (nbytes == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(data) + nbytes;
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);  // a hint only
}

}  // namespace

ChunkedImportResult import_arrays_chunked(const fs::path& dir,
                                          const std::map<std::string, Array>& arrays,
                                          const ImportOptions& options) {
  const std::string w = dir.string();
  const int64_t rows = storage::shared_rows(w, arrays);  // checked before anything is written
  uint64_t row_bytes = 0;
  for (const auto& [k, a] : arrays) row_bytes += rows ? a.nbytes / static_cast<uint64_t>(rows) : 0;
  ChunkedImportResult result;
  std::error_code ec;
  const bool exists = fs::exists(dir / storage::kDirectoryFile, ec);
  int64_t begin = 0, before = 0;  // rows of this source committed already; rows of the store
  bool chunked = true;
  if (exists) {
    const auto s = StoreReader::open(dir).summary();
    before = s.batch_size.empty() ? 0 : s.batch_size[0];
  }
  if (exists && !options.append) {
    auto prefix = committed_prefix(StoreReader::open(dir), arrays, rows);
    if (prefix)
      begin = result.resumed_from = *prefix;
    else if (options.refuse_other)
      throw IOError(w +
                    ": holds other data than these arrays (or another import of them): import "
                    "into a new store, or append the rows");
    else
      chunked = false;  // another store: the arrays replace its keys in one commit
  }
  if (!chunked || rows == 0) {
    static_cast<ImportResult&>(result) =
        import_arrays(dir, arrays, options.append, options.compression);
  } else {
    const int64_t step = std::max<int64_t>(
        1, static_cast<int64_t>(options.chunk_bytes / std::max<uint64_t>(row_bytes, 1)));
    if (options.progress) options.progress(begin, rows);
    storage::ImportChunks chunks;
    chunks.from = begin;
    chunks.rows = step;
    chunks.progress = options.progress;
    // The source's pages are faulted in by one call per part, not one page at a time by the copy.
    chunks.before_copy = prefault;
    if (begin < rows) {
      // A store this import creates begins empty ([0]) and every chunk appends, into keys laid
      // out for all the rows at once.
      const ImportResult r = storage::import_rows(dir, arrays, true, options.compression,
                                                  before + (rows - begin), chunks);
      result.keys = r.keys;
      result.total_rows = r.total_rows;
      result.generation = r.generation;
    }
    result.rows = rows - begin;
    if (begin == rows) {  // complete already: nothing written
      const auto s = StoreReader::open(dir).summary();
      result.total_rows = s.batch_size.empty() ? 0 : s.batch_size[0];
      result.generation = s.generation;
      result.keys = 0;
    }
  }
  // Exactness: the committed rows are the source's, byte for byte. A raw key copied from the
  // array's file was compared with it as it was copied (storage::Payload), and its rows of an
  // earlier import by committed_prefix; a raw key from memory is compared here. A compressed
  // key's frames were each decompressed and compared with their rows as they were made
  // (storage::compress_rows), and their checksums taken: its stored frames are checked against
  // those here, none decompressed again.
  const auto store = storage::Store::open(dir, OpenMode::ReadOnly, {});
  const int64_t total = store->batch_size().at(0);
  for (const auto& [k, a] : arrays) {
    const std::string where = w + ": import: key " + in_quotes(k);
    const auto e = store->find(k);
    if (!e) throw CorruptionError(where + " is not in the store after the import");
    if (e->compressed()) {
      const auto* object = static_cast<const uint8_t*>(store->view(*e).data);
      const auto idx = storage::read_index(
          object, e->nbytes, *storage::row_layout(e->shape, dtype_size(e->dtype)), where);
      if (std::string bad = storage::check_frames(object, idx); !bad.empty())
        throw CorruptionError(where + ": " + bad + " after the copy");
      result.verified_bytes += a.nbytes;
      continue;
    }
    if (!a.file.empty()) {
      result.verified_bytes += a.nbytes;
      continue;
    }
    const auto* stored = static_cast<const uint8_t*>(store->view(*e).data);
    const uint64_t row = rows ? a.nbytes / static_cast<uint64_t>(rows) : 0;
    const uint64_t skip = static_cast<uint64_t>(total - rows) * row;  // appended after earlier rows
    if (e->nbytes < skip + a.nbytes ||
        (a.nbytes && std::memcmp(stored + skip, a.data, a.nbytes) != 0))
      throw CorruptionError(where + " does not read back equal to its source after the copy");
    result.verified_bytes += a.nbytes;
  }
  return result;
}

}  // namespace tdstore
