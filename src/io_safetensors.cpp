// safetensors files (https://github.com/huggingface/safetensors, "Format").
#include <ATen/ops/empty.h>
#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

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
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IOError(file.string() + ": cannot open");
  auto fail = [&](const std::string& what) { throw FormatError(file.string() + ": not a safetensors file: " + what); };
  uint64_t n = 0;
  if (!in.read(reinterpret_cast<char*>(&n), 8)) fail("shorter than its 8-byte header length");
  uint64_t size = std::filesystem::file_size(file);
  if (n > kMaxHeader || n > size - 8) fail("header length " + std::to_string(n) + " out of range");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  json header;
  try {
    header = json::parse(text);
  } catch (const std::exception& e) {
    fail(std::string("header is not JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");
  const uint64_t data_size = size - 8 - n;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> spans;
  std::map<std::string, at::Tensor> out;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (metadata)
        for (auto& [k, v] : info.items()) (*metadata)[k] = v.get<std::string>();
      continue;
    }
    std::string dt = info.at("dtype").get<std::string>();
    auto it = std::find_if(dtypes().begin(), dtypes().end(), [&](auto& p) { return p.first == dt; });
    if (it == dtypes().end()) fail("tensor '" + name + "': dtype " + dt + " unsupported");
    auto shape = info.at("shape").get<std::vector<int64_t>>();
    auto offs = info.at("data_offsets").get<std::vector<uint64_t>>();
    if (offs.size() != 2 || offs[0] > offs[1] || offs[1] > data_size)
      fail("tensor '" + name + "': data_offsets out of range");
    at::Tensor t = at::empty(shape, it->second);
    if (static_cast<uint64_t>(t.numel() * t.element_size()) != offs[1] - offs[0])
      fail("tensor '" + name + "': data_offsets span " + std::to_string(offs[1] - offs[0]) +
           " bytes, its shape needs " + std::to_string(t.numel() * t.element_size()));
    in.seekg(static_cast<std::streamoff>(8 + n + offs[0]));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(offs[1] - offs[0]));
    if (!in) fail("tensor '" + name + "': truncated");
    spans.emplace_back(offs[0], offs[1], name);
    out[name] = t;
  }
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (const auto& [b, e, name] : spans) {
    if (b != at) fail("tensor '" + name + "': data_offsets leave a hole or overlap at byte " + std::to_string(at));
    at = e;
  }
  if (at != data_size) fail("data_offsets do not cover the data (" + std::to_string(at) + " of " + std::to_string(data_size) + " bytes)");
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
