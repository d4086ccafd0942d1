// safetensors files (https://github.com/huggingface/safetensors, "Format").
#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/io_layout.h"
#include "storage/formats.h"
#include "tdstore/errors.h"
#include "tdstore/io.h"

namespace tdstore {
namespace {

using json = nlohmann::json;
constexpr uint64_t kMaxHeader = 100 << 20;  // as the reference implementation

const std::vector<std::pair<std::string, at::ScalarType>>& dtypes() {
  static const std::vector<std::pair<std::string, at::ScalarType>> t = {
      {"BOOL", at::kBool}, {"U8", at::kByte},  {"I8", at::kChar},      {"I16", at::kShort},
      {"I32", at::kInt},   {"I64", at::kLong}, {"F16", at::kHalf},     {"BF16", at::kBFloat16},
      {"F32", at::kFloat}, {"F64", at::kDouble}};
  return t;
}

}  // namespace

std::map<std::string, at::Tensor> read_safetensors(const std::filesystem::path& file,
                                                   std::map<std::string, std::string>* metadata) {
  const std::string name = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IOError(name + ": cannot open");
  const uint64_t size = std::filesystem::file_size(file);
  std::string head(std::min<uint64_t>(size, 8), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(storage::safetensors_header_size(head, size, name));
  in.seekg(0);
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, l] : storage::parse_safetensors(head, size, name, metadata)) {  // all checked
    at::Tensor t = detail::allocate(l, name);
    in.seekg(static_cast<std::streamoff>(l.offset));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(l.nbytes));
    if (!in) throw FormatError(name + ": not a safetensors file: tensor '" + key + "': truncated");
    out[key] = t;
  }
  return out;
}

void write_safetensors(const std::filesystem::path& file, const std::map<std::string, at::Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  uint64_t at = 0;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor t = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous();
    auto it = std::find_if(dtypes().begin(), dtypes().end(), [&](auto& p) { return p.second == t.scalar_type(); });
    if (it == dtypes().end())
      throw DTypeError(file.string() + ": tensor '" + name + "': dtype " + std::string(c10::toString(t.scalar_type())) +
                       " has no safetensors equivalent");
    uint64_t nbytes = static_cast<uint64_t>(t.numel() * t.element_size());
    header[name] = {{"dtype", it->first}, {"shape", t.sizes().vec()}, {"data_offsets", {at, at + nbytes}}};
    at += nbytes;
    data.push_back(t);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  uint64_t n = text.size();
  std::ofstream f(file, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(text.data(), static_cast<std::streamsize>(n));
  for (const auto& t : data) f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
  if (!f) throw IOError(file.string() + ": write failed");
}

}  // namespace tdstore
