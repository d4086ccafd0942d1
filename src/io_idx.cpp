// IDX files, raw or gzip (zlib's gzread reads both).
#include <ATen/ops/empty.h>
#include <zlib.h>

#include <cstring>

#include "src/io_layout.h"
#include "storage/formats.h"
#include "tdstore/errors.h"
#include "tdstore/io.h"

namespace tdstore {

at::Tensor read_idx(const std::filesystem::path& file) {
  const std::string name = file.string();
  gzFile f = gzopen(file.c_str(), "rb");
  if (!f) throw IOError(name + ": cannot open: " + std::strerror(errno));
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{f};
  auto read = [&](void* dst, size_t n) { return gzread(f, dst, static_cast<unsigned>(n)) == static_cast<int>(n); };
  std::string head(4, '\0');
  if (!read(head.data(), 4)) throw FormatError(name + ": not an IDX file: shorter than its 4-byte magic");
  head.resize(storage::idx_header_size(head, name));
  if (!read(head.data() + 4, head.size() - 4)) throw FormatError(name + ": not an IDX file: truncated in its dimensions");
  // A raw file's size bounds the data before anything is allocated; gzip is bounded as it is read.
  std::optional<uint64_t> size;
  if (gzdirect(f)) size = std::filesystem::file_size(file);
  const storage::ArrayLayout l = storage::parse_idx(head, size, name);
  at::Tensor t = detail::allocate(l, name);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (uint64_t off = 0; off < l.nbytes;) {
    unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(l.nbytes - off, 1u << 30));
    int got = gzread(f, p + off, chunk);
    if (got <= 0)
      throw FormatError(name + ": not an IDX file: data truncated at byte " + std::to_string(off) + " of " +
                        std::to_string(l.nbytes));
    off += static_cast<uint64_t>(got);
  }
  detail::to_host_order(t, l);
  return t;
}

}  // namespace tdstore
