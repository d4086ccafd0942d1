// NumPy .npy files (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html).
#include <ATen/ops/empty.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <fstream>
#include <regex>

#include "tdstore/errors.h"
#include "tdstore/io.h"

namespace tdstore {
namespace {

struct NpyType {
  char kind;
  int size;
  at::ScalarType type;
};
constexpr NpyType kTypes[] = {
    {'b', 1, at::kBool},  {'u', 1, at::kByte},   {'i', 1, at::kChar},  {'i', 2, at::kShort},
    {'i', 4, at::kInt},   {'i', 8, at::kLong},   {'f', 2, at::kHalf},  {'f', 4, at::kFloat},
    {'f', 8, at::kDouble}, {'c', 8, at::kComplexFloat}, {'c', 16, at::kComplexDouble}};

std::string descr_of(at::ScalarType t, const std::filesystem::path& file) {
  for (const auto& k : kTypes)
    if (k.type == t) return fmt::format("{}{}{}", k.size == 1 ? '|' : '<', k.kind, k.size);
  throw DTypeError(file.string() + ": dtype " + std::string(c10::toString(t)) + " has no .npy equivalent here");
}

}  // namespace

at::Tensor read_npy(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IOError(file.string() + ": cannot open");
  auto fail = [&](const std::string& what) -> at::Tensor { throw FormatError(file.string() + ": not a .npy file: " + what); };
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) return fail("bad magic");
  int major = static_cast<uint8_t>(magic[6]);
  uint32_t hlen = 0;
  if (major == 1) {
    uint8_t b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else if (major == 2 || major == 3) {
    uint8_t b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
  } else {
    return fail("format version " + std::to_string(major) + " unsupported");
  }
  if (!in || hlen > (1u << 24)) return fail("header length");
  std::string header(hlen, '\0');
  if (!in.read(header.data(), hlen)) return fail("truncated header");
  std::smatch m;
  if (!std::regex_search(header, m, std::regex(R"('descr'\s*:\s*'([<>|=])([a-z])(\d+)')")))
    return fail("no 'descr'");
  char order = m[1].str()[0], kind = m[2].str()[0];
  int size = std::stoi(m[3].str());
  const NpyType* type = nullptr;
  for (const auto& k : kTypes)
    if (k.kind == kind && k.size == size) type = &k;
  if (!type) return fail("dtype '" + m[2].str() + m[3].str() + "' unsupported");
  bool fortran = std::regex_search(header, std::regex(R"('fortran_order'\s*:\s*True)"));
  if (!std::regex_search(header, m, std::regex(R"('shape'\s*:\s*\(([^)]*)\))"))) return fail("no 'shape'");
  std::vector<int64_t> shape;
  std::string dims = m[1].str();
  static const std::regex number(R"(\d+)");
  for (std::sregex_iterator it(dims.begin(), dims.end(), number), end; it != end; ++it)
    shape.push_back(std::stoll(it->str()));
  std::vector<int64_t> stored = shape;
  if (fortran) std::reverse(stored.begin(), stored.end());
  at::Tensor t = at::empty(stored, type->type);
  uint64_t nbytes = static_cast<uint64_t>(t.numel()) * static_cast<uint64_t>(size);
  if (!in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(nbytes)))
    return fail("data truncated: " + std::to_string(nbytes) + " bytes expected");
  bool swap = order == '>' && size > 1;
  if (swap) {
    int unit = kind == 'c' ? size / 2 : size;  // complex: swap each part
    auto* p = static_cast<uint8_t*>(t.data_ptr());
    for (uint64_t i = 0; i < nbytes; i += static_cast<uint64_t>(unit)) std::reverse(p + i, p + i + unit);
  }
  if (fortran) {
    std::vector<int64_t> perm(stored.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(perm.size() - 1 - i);
    t = t.permute(perm).contiguous();
  }
  return t;
}

void write_npy(const std::filesystem::path& file, const at::Tensor& tensor) {
  at::Tensor t = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous();
  // Python's tuple repr: (), (n,), (a, b).
  std::string shape = fmt::format("{}", fmt::join(t.sizes(), ", "));
  if (t.dim() == 1) shape += ",";
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                 descr_of(t.scalar_type(), file), shape);
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
  for (int b = 0; b < (major == 1 ? 2 : 4); ++b) out.push_back(static_cast<char>((len >> (8 * b)) & 0xff));
  out += dict;
  std::ofstream f(file, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
  if (!f) throw IOError(file.string() + ": write failed");
}

}  // namespace tdstore
