// The readers and writers of tdstore/formats.h: headers parsed by storage/formats.cpp, data
// read into buffers allocated only after the header's sizes were checked against the file.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>

#include "storage/formats.h"
#include "storage/messages.h"
#include "tdstore/errors.h"
#include "tdstore/formats.h"

namespace tdstore {
using storage::in_quotes;
namespace {

using storage::ArrayLayout;

// An uninitialized buffer for l's bytes; Error (naming the file) when it cannot be allocated.
std::shared_ptr<uint8_t[]> allocate(uint64_t nbytes, const std::string& file) {
  uint8_t* p =
      nbytes <= SIZE_MAX ? new (std::nothrow) uint8_t[std::max<uint64_t>(nbytes, 1)] : nullptr;
  if (!p) throw Error(file + ": cannot allocate " + std::to_string(nbytes) + " bytes for its data");
  return std::shared_ptr<uint8_t[]>(p);
}

Array make_array(const ArrayLayout& l, std::shared_ptr<uint8_t[]> bytes) {
  Array a;
  a.dtype = l.dtype;
  a.shape = l.shape;
  a.data = bytes.get();
  a.nbytes = l.nbytes;
  a.owner = std::move(bytes);
  return a;
}

// Big-endian elements to host order, in place (each half of a complex element separately).
void to_host_order(uint8_t* p, const ArrayLayout& l) {
  const size_t item = dtype_size(l.dtype);
  if (!l.big_endian || item < 2) return;
  const bool complex = l.dtype == DType::Complex64 || l.dtype == DType::Complex128;
  const size_t unit = complex ? item / 2 : item;
  for (uint64_t i = 0; i < l.nbytes; i += unit) std::reverse(p + i, p + i + unit);
}

// A Fortran-order array (bytes laid out in C order over l.shape, the reversed shape) in C
// order: the transpose, element by element.
Array to_c_order(const ArrayLayout& l, const uint8_t* src, const std::string& file) {
  const size_t item = dtype_size(l.dtype);
  const size_t k = l.shape.size();
  std::vector<int64_t> shape(l.shape.rbegin(), l.shape.rend());
  std::vector<uint64_t> dst_stride(k, 1);  // C-order strides over `shape`, in elements
  for (size_t b = k; b-- > 1;) dst_stride[b - 1] = dst_stride[b] * static_cast<uint64_t>(shape[b]);
  auto out = allocate(l.nbytes, file);
  const uint64_t n = item ? l.nbytes / item : 0;
  std::vector<int64_t> j(k, 0);  // index over l.shape, C order
  for (uint64_t e = 0; e < n; ++e) {
    uint64_t d = 0;
    for (size_t a = 0; a < k; ++a) d += static_cast<uint64_t>(j[a]) * dst_stride[k - 1 - a];
    std::memcpy(out.get() + d * item, src + e * item, item);
    for (size_t a = k; a-- > 0;) {
      if (++j[a] < l.shape[a]) break;
      j[a] = 0;
    }
  }
  ArrayLayout c = l;
  c.shape = shape;
  c.fortran = false;
  return make_array(c, std::move(out));
}

std::ifstream open_in(const std::filesystem::path& file, uint64_t* size) {
  std::ifstream in(file, std::ios::binary);
  std::error_code ec;
  *size = std::filesystem::file_size(file, ec);
  if (ec) throw IOError(file.string() + ": cannot open: " + ec.message());
  if (!in) storage::throw_os_error(file, "cannot open", errno);
  return in;
}

// The file's first bytes up to the header size `header_size(first bytes)` gives.
template <class HeaderSize>
std::string read_head(std::ifstream& in, uint64_t size, size_t first, HeaderSize header_size) {
  std::string head(std::min<uint64_t>(size, first), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(std::min<uint64_t>(size, header_size(head)));
  in.seekg(0);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  return head;
}

void write_all(const std::filesystem::path& file, const std::string& header,
               const std::vector<const Array*>& arrays) {
  std::ofstream f(file, std::ios::binary | std::ios::trunc);
  if (!f) storage::throw_os_error(file, "cannot create", errno);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const Array* a : arrays)
    f.write(static_cast<const char*>(a->data), static_cast<std::streamsize>(a->nbytes));
  f.flush();
  if (!f) storage::throw_io_error(file, "write");
}

void check_array(const Array& a, const std::string& what) {
  uint64_t n = dtype_size(a.dtype);
  for (int64_t d : a.shape)
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n))
      throw ShapeError(what + ": shape has a negative or overflowing dimension");
  if (n != a.nbytes)
    throw ShapeError(what + ": " + std::to_string(a.nbytes) + " bytes for a " +
                     std::string(dtype_name(a.dtype)) + " array of " + std::to_string(n) +
                     " bytes");
}

}  // namespace

int64_t Array::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Array read_npy_array(const std::filesystem::path& file) {
  const std::string name = file.string();
  uint64_t size = 0;
  std::ifstream in = open_in(file, &size);
  const std::string head = read_head(
      in, size, 12, [&](const std::string& h) { return storage::npy_header_size(h, name); });
  const ArrayLayout l = storage::parse_npy(head, size, name);  // checked against the file
  auto bytes = allocate(l.nbytes, name);
  in.seekg(static_cast<std::streamoff>(l.offset));
  if (!in.read(reinterpret_cast<char*>(bytes.get()), static_cast<std::streamsize>(l.nbytes)))
    throw FormatError(name + ": not a .npy file: data truncated");
  to_host_order(bytes.get(), l);
  return l.fortran ? to_c_order(l, bytes.get(), name) : make_array(l, std::move(bytes));
}

Array read_idx_array(const std::filesystem::path& file) {
  const std::string name = file.string();
  gzFile f = gzopen(file.c_str(), "rb");
  if (!f) storage::throw_os_error(file, "cannot open", errno);
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{f};
  auto read = [&](void* dst, size_t n) {
    return gzread(f, dst, static_cast<unsigned>(n)) == static_cast<int>(n);
  };
  std::string head(4, '\0');
  if (!read(head.data(), 4))
    throw FormatError(name + ": not an IDX file: shorter than its 4-byte magic");
  head.resize(storage::idx_header_size(head, name));
  if (!read(head.data() + 4, head.size() - 4))
    throw FormatError(name + ": not an IDX file: truncated in its dimensions");
  // A raw file's size bounds the data before anything is allocated; gzip is bounded as it is read.
  std::optional<uint64_t> size;
  if (gzdirect(f)) size = std::filesystem::file_size(file);
  const ArrayLayout l = storage::parse_idx(head, size, name);
  std::shared_ptr<uint8_t[]> bytes;
  if (size) {
    bytes = allocate(l.nbytes, name);
  } else {
    // Compressed: grow as the data arrives, so a header claiming more than the stream holds
    // fails as truncated instead of allocating what it claims.
    bytes = allocate(std::min<uint64_t>(l.nbytes, 64 << 20), name);
  }
  uint64_t have = size ? l.nbytes : std::min<uint64_t>(l.nbytes, 64 << 20);
  for (uint64_t off = 0; off < l.nbytes;) {
    if (off == have) {
      uint64_t grown = std::min<uint64_t>(l.nbytes, have * 2);
      auto bigger = allocate(grown, name);
      std::memcpy(bigger.get(), bytes.get(), have);
      bytes = std::move(bigger), have = grown;
    }
    unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(have - off, 1u << 30));
    int got = gzread(f, bytes.get() + off, chunk);
    if (got <= 0)
      throw FormatError(name + ": not an IDX file: data truncated at byte " + std::to_string(off) +
                        " of " + std::to_string(l.nbytes));
    off += static_cast<uint64_t>(got);
  }
  to_host_order(bytes.get(), l);
  return make_array(l, std::move(bytes));
}

std::map<std::string, Array> read_safetensors_arrays(const std::filesystem::path& file,
                                                     std::map<std::string, std::string>* metadata) {
  const std::string name = file.string();
  uint64_t size = 0;
  std::ifstream in = open_in(file, &size);
  const std::string head = read_head(in, size, 8, [&](const std::string& h) {
    return storage::safetensors_header_size(h, size, name);
  });
  std::map<std::string, Array> out;
  for (const auto& [key, l] :
       storage::parse_safetensors(head, size, name, metadata)) {  // all checked
    auto bytes = allocate(l.nbytes, name);
    in.seekg(static_cast<std::streamoff>(l.offset));
    in.read(reinterpret_cast<char*>(bytes.get()), static_cast<std::streamsize>(l.nbytes));
    if (!in)
      throw FormatError(name + ": not a safetensors file: tensor " + in_quotes(key) +
                        ": truncated");
    out[key] = make_array(l, std::move(bytes));
  }
  return out;
}

void write_npy_array(const std::filesystem::path& file, const Array& a) {
  check_array(a, file.string());
  auto descr = storage::npy_descr(a.dtype);
  if (!descr)
    throw DTypeError(file.string() + ": dtype " + std::string(dtype_name(a.dtype)) +
                     " has no .npy equivalent");
  // Python's tuple repr: (), (n,), (a, b).
  std::string shape;
  for (size_t i = 0; i < a.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(a.shape[i]);
  if (a.shape.size() == 1) shape += ",";
  std::string dict =
      "{'descr': " + in_quotes(*descr) + ", 'fortran_order': False, 'shape': (" + shape + "), }";
  // Pad so that magic + length + header is a multiple of 64, ending in '\n'.
  size_t prefix = 10;
  int major = 1;
  if (dict.size() + 1 + prefix > 65535) major = 2, prefix = 12;
  size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  uint32_t len = static_cast<uint32_t>(dict.size());
  for (int b = 0; b < (major == 1 ? 2 : 4); ++b)
    out.push_back(static_cast<char>((len >> (8 * b)) & 0xff));
  write_all(file, out + dict, {&a});
}

void write_safetensors_arrays(const std::filesystem::path& file,
                              const std::map<std::string, Array>& arrays,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<const Array*> data;
  uint64_t at = 0;
  for (const auto& [name, a] : arrays) {
    check_array(a, file.string() + ": tensor " + in_quotes(name));
    auto code = storage::safetensors_dtype(a.dtype);
    if (!code)
      throw DTypeError(file.string() + ": tensor " + in_quotes(name) + ": dtype " +
                       std::string(dtype_name(a.dtype)) + " has no safetensors equivalent");
    header[name] = {{"dtype", *code}, {"shape", a.shape}, {"data_offsets", {at, at + a.nbytes}}};
    at += a.nbytes;
    data.push_back(&a);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    throw FormatError(
        file.string() +
        ": a tensor name or metadata value is not valid UTF-8, which safetensors requires");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  uint64_t n = text.size();
  write_all(file, std::string(reinterpret_cast<const char*>(&n), 8) + text, data);
}

}  // namespace tdstore
