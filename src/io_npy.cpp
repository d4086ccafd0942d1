// NumPy .npy files (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html).
#include <ATen/ops/empty.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <fstream>

#include "src/io_layout.h"
#include "storage/formats.h"
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
  const std::string name = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IOError(name + ": cannot open");
  const uint64_t size = std::filesystem::file_size(file);
  std::string head(std::min<uint64_t>(size, 12), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(std::min<uint64_t>(size, storage::npy_header_size(head, name)));
  in.seekg(0);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  const storage::ArrayLayout l = storage::parse_npy(head, size, name);  // checked against the file
  at::Tensor t = detail::allocate(l, name);
  in.seekg(static_cast<std::streamoff>(l.offset));
  if (!in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(l.nbytes)))
    throw FormatError(name + ": not a .npy file: data truncated");
  detail::to_host_order(t, l);
  if (l.fortran) {
    std::vector<int64_t> perm(l.shape.size());
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
