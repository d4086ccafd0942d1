#include "storage/formats.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <tuple>
#include <type_traits>

#include "storage/json_numbers.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& file, const char* format, const std::string& what) {
  throw FormatError(file + ": not " + format + " file: " + what);
}

// product(shape) * item, or nullopt on a negative dimension or overflow.
std::optional<uint64_t> byte_count(const std::vector<int64_t>& shape, uint64_t item) {
  uint64_t n = item;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

// The data [offset, offset + nbytes) lies inside a file of file_size bytes.
bool fits(uint64_t offset, uint64_t nbytes, uint64_t file_size) {
  return offset <= file_size && file_size - offset >= nbytes;
}

struct NpyType {
  char kind;
  int size;
  DType dtype;
};
constexpr NpyType kNpyTypes[] = {
    {'b', 1, DType::Bool},      {'u', 1, DType::UInt8},      {'i', 1, DType::Int8},
    {'i', 2, DType::Int16},     {'i', 4, DType::Int32},      {'i', 8, DType::Int64},
    {'f', 2, DType::Float16},   {'f', 4, DType::Float32},    {'f', 8, DType::Float64},
    {'c', 8, DType::Complex64}, {'c', 16, DType::Complex128}};

// The text after `'key':` in a .npy header dict, spaces skipped; npos when absent.
size_t npy_value(std::string_view header, std::string_view key) {
  std::string quoted = "'" + std::string(key) + "'";
  size_t p = header.find(quoted);
  if (p == std::string_view::npos) return p;
  p += quoted.size();
  while (p < header.size() && header[p] == ' ') ++p;
  if (p >= header.size() || header[p] != ':') return std::string_view::npos;
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  return p < header.size() ? p : std::string_view::npos;
}

const std::map<std::string, DType, std::less<>> kTypes = {
    {"BOOL", DType::Bool},   {"U8", DType::UInt8},      {"I8", DType::Int8},
    {"I16", DType::Int16},   {"I32", DType::Int32},     {"I64", DType::Int64},
    {"F16", DType::Float16}, {"BF16", DType::BFloat16}, {"F32", DType::Float32},
    {"F64", DType::Float64}};

}  // namespace

std::optional<std::string> npy_descr(DType d) {
  for (const auto& k : kNpyTypes)
    if (k.dtype == d)
      return std::string(1, k.size == 1 ? '|' : '<') + k.kind + std::to_string(k.size);
  return std::nullopt;
}

std::optional<std::string> safetensors_dtype(DType d) {
  for (const auto& [code, dtype] : kTypes)
    if (dtype == d) return code;
  return std::nullopt;
}

uint64_t npy_header_size(std::string_view first, const std::string& file) {
  if (first.size() < 10 || std::memcmp(first.data(), "\x93NUMPY", 6) != 0)
    fail(file, "a .npy", "bad magic");
  const int major = static_cast<uint8_t>(first[6]);
  const auto* b = reinterpret_cast<const uint8_t*>(first.data());
  if (major == 1) return 10 + (b[8] | (b[9] << 8));
  if (major == 2 || major == 3) {
    if (first.size() < 12) fail(file, "a .npy", "truncated header length");
    uint64_t n = b[8] | (b[9] << 8) | (b[10] << 16) | (uint64_t(b[11]) << 24);
    if (n > (1u << 24))
      fail(file, "a .npy", "header length " + std::to_string(n) + " exceeds 16 MiB");
    return 12 + n;
  }
  fail(file, "a .npy", "format version " + std::to_string(major) + " unsupported");
}

ArrayLayout parse_npy(std::string_view head, uint64_t file_size, const std::string& file) {
  const uint64_t size = npy_header_size(head, file);
  if (head.size() < size) fail(file, "a .npy", "truncated header");
  const std::string_view header =
      head.substr(static_cast<uint8_t>(head[6]) == 1 ? 10 : 12,
                  size - (static_cast<uint8_t>(head[6]) == 1 ? 10 : 12));
  ArrayLayout l;
  size_t p = npy_value(header, "descr");
  if (p == std::string_view::npos || header.size() - p < 4 || header[p] != '\'')
    fail(file, "a .npy", "no 'descr'");
  const char order = header[p + 1], kind = header[p + 2];
  size_t q = p + 3;
  int item = 0;
  while (q < header.size() && header[q] >= '0' && header[q] <= '9' && item < 1000)
    item = item * 10 + (header[q++] - '0');
  if (q >= header.size() || header[q] != '\'' ||
      (order != '<' && order != '>' && order != '|' && order != '='))
    fail(file, "a .npy", "malformed 'descr'");
  const NpyType* type = nullptr;
  for (const auto& k : kNpyTypes)
    if (k.kind == kind && k.size == item) type = &k;
  if (!type)
    fail(file, "a .npy", "dtype '" + std::string(1, kind) + std::to_string(item) + "' unsupported");
  l.dtype = type->dtype;
  l.big_endian = order == '>' && item > 1;
  p = npy_value(header, "fortran_order");
  l.fortran = p != std::string_view::npos && header.substr(p, 4) == "True";
  p = npy_value(header, "shape");
  if (p == std::string_view::npos || header[p] != '(') fail(file, "a .npy", "no 'shape'");
  size_t close = header.find(')', p);
  if (close == std::string_view::npos) fail(file, "a .npy", "unterminated 'shape'");
  for (size_t i = p + 1; i < close;) {
    char c = header[i];
    if (c == ' ' || c == ',' || c == 'L') {
      ++i;
      continue;
    }
    if (c < '0' || c > '9') fail(file, "a .npy", "'shape' holds '" + std::string(1, c) + "'");
    int64_t d = 0;
    for (; i < close && header[i] >= '0' && header[i] <= '9'; ++i)
      if (__builtin_mul_overflow(d, 10, &d) || __builtin_add_overflow(d, header[i] - '0', &d))
        fail(file, "a .npy", "a 'shape' dimension overflows int64");
    l.shape.push_back(d);
    if (l.shape.size() > 64) fail(file, "a .npy", "more than 64 dimensions");
  }
  if (l.fortran) std::reverse(l.shape.begin(), l.shape.end());
  auto n = byte_count(l.shape, static_cast<uint64_t>(item));
  if (!n) fail(file, "a .npy", "shape's byte count overflows");
  l.offset = size;
  l.nbytes = *n;
  if (!fits(l.offset, l.nbytes, file_size))
    fail(file, "a .npy",
         "data truncated: " + std::to_string(l.nbytes) + " bytes expected at offset " +
             std::to_string(l.offset) + ", the file has " + std::to_string(file_size));
  return l;
}

uint64_t idx_header_size(std::string_view first, const std::string& file) {
  if (first.size() < 4) fail(file, "an IDX", "shorter than its 4-byte magic");
  if (first[0] != 0 || first[1] != 0)
    fail(file, "an IDX", "magic does not start with two zero bytes");
  const int ndim = static_cast<uint8_t>(first[3]);
  if (ndim == 0 || ndim > 16)
    fail(file, "an IDX", "rank " + std::to_string(ndim) + " outside 1..16");
  return 4 + 4 * static_cast<uint64_t>(ndim);
}

ArrayLayout parse_idx(std::string_view head, std::optional<uint64_t> file_size,
                      const std::string& file) {
  const uint64_t size = idx_header_size(head, file);
  if (head.size() < size) fail(file, "an IDX", "truncated in its dimensions");
  ArrayLayout l;
  uint64_t item = 0;
  switch (static_cast<uint8_t>(head[2])) {
    case 0x08:
      l.dtype = DType::UInt8, item = 1;
      break;
    case 0x09:
      l.dtype = DType::Int8, item = 1;
      break;
    case 0x0B:
      l.dtype = DType::Int16, item = 2;
      break;
    case 0x0C:
      l.dtype = DType::Int32, item = 4;
      break;
    case 0x0D:
      l.dtype = DType::Float32, item = 4;
      break;
    case 0x0E:
      l.dtype = DType::Float64, item = 8;
      break;
    default:
      fail(file, "an IDX", "unknown type code " + std::to_string(static_cast<uint8_t>(head[2])));
  }
  const auto* b = reinterpret_cast<const uint8_t*>(head.data());
  for (uint64_t o = 4; o < size; o += 4)
    l.shape.push_back((int64_t{b[o]} << 24) | (int64_t{b[o + 1]} << 16) | (int64_t{b[o + 2]} << 8) |
                      b[o + 3]);
  auto n = byte_count(l.shape, item);
  if (!n || *n > (uint64_t{1} << 40)) fail(file, "an IDX", "dimensions too large");
  l.big_endian = item > 1;
  l.offset = size;
  l.nbytes = *n;
  if (file_size && !fits(l.offset, l.nbytes, *file_size))
    fail(file, "an IDX",
         "data truncated: " + std::to_string(l.nbytes) + " bytes expected, the file has " +
             std::to_string(*file_size - std::min(*file_size, l.offset)));
  return l;
}

uint64_t safetensors_header_size(std::string_view first, uint64_t file_size,
                                 const std::string& file) {
  if (first.size() < 8) fail(file, "a safetensors", "shorter than its 8-byte header length");
  uint64_t n;
  std::memcpy(&n, first.data(), 8);
  constexpr uint64_t kMaxHeader = 100 << 20;  // as the reference implementation
  if (n > kMaxHeader || file_size < 8 || n > file_size - 8)
    fail(file, "a safetensors", "header length " + std::to_string(n) + " out of range");
  return 8 + n;
}

std::vector<NamedLayout> parse_safetensors(std::string_view head, uint64_t file_size,
                                           const std::string& file,
                                           std::map<std::string, std::string>* metadata) {
  const uint64_t size = safetensors_header_size(head, file_size, file);
  if (head.size() < size) fail(file, "a safetensors", "truncated header");
  json header;
  try {
    header = json::parse(head.substr(8, size - 8));
  } catch (const json::parse_error& e) {
    fail(file, "a safetensors",
         "header is not JSON: a syntax error at byte " + std::to_string(e.byte) + " of the header");
  } catch (const json::exception&) {
    fail(file, "a safetensors", "header is not JSON");
  }
  if (!header.is_object()) fail(file, "a safetensors", "header is not a JSON object");
  const uint64_t data_size = file_size - size;
  std::vector<NamedLayout> out;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> spans;
  for (auto& [name, info] : header.items()) {
    try {
      if (name == "__metadata__") {
        for (auto& [k, v] : info.items()) {
          if (!v.is_string())
            fail(file, "a safetensors", "__metadata__ value '" + k + "' is not a string");
          if (metadata) (*metadata)[k] = v.get<std::string>();
        }
        continue;
      }
      const std::string what = "tensor '" + name + "'";
      if (!info.is_object()) fail(file, "a safetensors", what + ": not a JSON object");
      const json& entry = info;  // a structured binding cannot be captured (clang 14)
      auto field = [&](const char* f) -> const json& {  // names the field, never a raw JSON error
        if (!entry.contains(f)) fail(file, "a safetensors", what + ": field '" + f + "' missing");
        return entry.at(f);
      };
      if (!field("dtype").is_string())
        fail(file, "a safetensors", what + ": field 'dtype' is not a string");
      const std::string dt = field("dtype").get<std::string>();
      auto it = kTypes.find(dt);
      if (it == kTypes.end())
        fail(file, "a safetensors", "tensor '" + name + "': dtype " + dt + " unsupported");
      NamedLayout t{name, {}};
      t.layout.dtype = it->second;
      auto ints = [&]<class T>(const char* f, T) {  // names the field of a bad element
        try {
          return json_ints<T>(field(f));
        } catch (const std::invalid_argument& e) {
          fail(file, "a safetensors", what + ": field '" + f + "': " + e.what());
        } catch (const json::exception&) {
          fail(file, "a safetensors", what + ": field '" + f + "' is not an array of integers");
        }
      };
      t.layout.shape = ints("shape", int64_t{});
      auto offs = ints("data_offsets", uint64_t{});
      for (int64_t d : t.layout.shape)
        if (d < 0)
          fail(file, "a safetensors",
               what + ": field 'shape' has a negative dimension " + std::to_string(d));
      if (t.layout.shape.size() > 64)
        fail(file, "a safetensors", "tensor '" + name + "': more than 64 dimensions");
      if (offs.size() != 2 || offs[0] > offs[1] || offs[1] > data_size)
        fail(file, "a safetensors", "tensor '" + name + "': data_offsets out of range");
      auto n = byte_count(t.layout.shape, dtype_size(t.layout.dtype));
      if (!n || *n != offs[1] - offs[0])
        fail(file, "a safetensors",
             "tensor '" + name + "': data_offsets span " + std::to_string(offs[1] - offs[0]) +
                 " bytes, its shape needs " +
                 (n ? std::to_string(*n) : std::string("more than 2^64")));
      t.layout.offset = size + offs[0];
      t.layout.nbytes = *n;
      spans.emplace_back(offs[0], offs[1], name);
      out.push_back(std::move(t));
    } catch (const json::exception&) {
      fail(file, "a safetensors",
           "tensor '" + name + "': not an object of the fields dtype, shape, data_offsets");
    } catch (const std::invalid_argument& e) {
      fail(file, "a safetensors", "tensor '" + name + "': " + e.what());
    }
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [b, e, name] : spans) {
    if (b != at)
      fail(file, "a safetensors",
           "tensor '" + name + "': data_offsets leave a hole or overlap at byte " +
               std::to_string(at));
    at = e;
  }
  if (at != data_size)
    fail(file, "a safetensors",
         "data_offsets do not cover the data (" + std::to_string(at) + " of " +
             std::to_string(data_size) + " bytes)");
  return out;
}

}  // namespace tdstore::storage
