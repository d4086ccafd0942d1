// IDX files, raw or gzip (zlib's gzread reads both).
#include <ATen/ops/empty.h>
#include <zlib.h>

#include <cstring>

#include "tdstore/errors.h"
#include "tdstore/io.h"

namespace tdstore {

at::Tensor read_idx(const std::filesystem::path& file) {
  gzFile f = gzopen(file.c_str(), "rb");
  if (!f) throw IOError(file.string() + ": cannot open: " + std::strerror(errno));
  auto fail = [&](const std::string& what) -> at::Tensor {
    gzclose(f);
    throw FormatError(file.string() + ": not an IDX file: " + what);
  };
  auto read = [&](void* dst, size_t n) { return gzread(f, dst, static_cast<unsigned>(n)) == static_cast<int>(n); };
  uint8_t magic[4];
  if (!read(magic, 4)) return fail("shorter than its 4-byte magic");
  if (magic[0] != 0 || magic[1] != 0) return fail("magic does not start with two zero bytes");
  at::ScalarType type;
  size_t item;
  switch (magic[2]) {
    case 0x08: type = at::kByte, item = 1; break;
    case 0x09: type = at::kChar, item = 1; break;
    case 0x0B: type = at::kShort, item = 2; break;
    case 0x0C: type = at::kInt, item = 4; break;
    case 0x0D: type = at::kFloat, item = 4; break;
    case 0x0E: type = at::kDouble, item = 8; break;
    default: return fail("unknown type code " + std::to_string(magic[2]));
  }
  int ndim = magic[3];
  if (ndim == 0 || ndim > 16) return fail("rank " + std::to_string(ndim) + " outside 1..16");
  std::vector<int64_t> shape;
  uint64_t count = 1;
  for (int d = 0; d < ndim; ++d) {
    uint8_t be[4];
    if (!read(be, 4)) return fail("truncated in its dimensions");
    uint32_t v = (uint32_t(be[0]) << 24) | (uint32_t(be[1]) << 16) | (uint32_t(be[2]) << 8) | be[3];
    shape.push_back(v);
    count *= v;
    if (count > (uint64_t{1} << 40)) return fail("dimensions too large");
  }
  at::Tensor t = at::empty(shape, type);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  uint64_t total = count * item;
  for (uint64_t off = 0; off < total;) {
    unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(total - off, 1u << 30));
    int got = gzread(f, p + off, chunk);
    if (got <= 0) return fail("data truncated at byte " + std::to_string(off) + " of " + std::to_string(total));
    off += static_cast<uint64_t>(got);
  }
  gzclose(f);
  if (item > 1)  // big-endian to host
    for (uint64_t i = 0; i < count; ++i) std::reverse(p + i * item, p + (i + 1) * item);
  return t;
}

}  // namespace tdstore
