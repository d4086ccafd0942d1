#include "storage/tensordict_memmap.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "storage/json_numbers.h"
#include "storage/messages.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw FormatError(file + ": not a tensordict meta.json: " + what);
}

constexpr struct {
  const char* name;
  DType dtype;
} kDTypes[] = {{"torch.bool", DType::Bool},           {"torch.uint8", DType::UInt8},
               {"torch.int8", DType::Int8},           {"torch.int16", DType::Int16},
               {"torch.int32", DType::Int32},         {"torch.int64", DType::Int64},
               {"torch.float16", DType::Float16},     {"torch.bfloat16", DType::BFloat16},
               {"torch.float32", DType::Float32},     {"torch.float64", DType::Float64},
               {"torch.complex64", DType::Complex64}, {"torch.complex128", DType::Complex128}};

std::vector<int64_t> dims(const json& j, const std::string& file, const std::string& what) {
  std::vector<int64_t> out;
  try {
    out = json_ints<int64_t>(j);
  } catch (const std::invalid_argument& e) {
    fail(file, what + " is not an array of integers (" + e.what() + ")");
  }
  if (out.size() > 64) fail(file, what + " has more than 64 dimensions");
  for (int64_t d : out)
    if (d < 0) fail(file, what + " has a negative dimension " + std::to_string(d));
  return out;
}

// A key tdstore can store as one path component.
void check_component(const std::string& key, const std::string& file) {
  if (key.empty() || key == "." || key == ".." || key.find('/') != std::string::npos ||
      key.find('\0') != std::string::npos)
    fail(file, "entry " + in_quotes(key) +
                   ": a key tdstore cannot store as a path component (empty, '.', '..', or "
                   "holding '/' or NUL)");
}

}  // namespace

std::string tensordict_dtype_name(DType d) {
  for (const auto& t : kDTypes)
    if (t.dtype == d) return t.name;
  throw DTypeError("tensordict has no dtype for " + std::string(dtype_name(d)));
}

std::optional<DType> tensordict_dtype(std::string_view name) {
  for (const auto& t : kDTypes)
    if (name == t.name) return t.dtype;
  return std::nullopt;
}

std::string tensordict_file_key(std::string_view key) {
  if (key.empty()) return "%";
  if (key == "." || key == "..") {
    std::string out;
    for (size_t i = 0; i < key.size(); ++i) out += "%2E";
    return out;
  }
  std::string out;
  for (char c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 32 || u == 127 || std::string_view("/<>:\"|?*\\ %").find(c) != std::string_view::npos) {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

TensorDictMeta parse_tensordict_meta(std::string_view text, const std::string& file) {
  json meta;
  try {
    meta = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(file, "not JSON: a syntax error at byte " + std::to_string(e.byte));
  } catch (const json::exception&) {
    fail(file, "not JSON");
  }
  if (!meta.is_object()) fail(file, "not a JSON object");
  TensorDictMeta out;
  try {
    if (!meta.contains("_type") || !meta["_type"].is_string())
      fail(file, "field '_type' missing or not a string");
    const std::string type = meta["_type"].get<std::string>();
    const std::string_view suffix = ".TensorDict'>";
    if (type.size() < suffix.size() ||
        type.compare(type.size() - suffix.size(), suffix.size(), suffix) != 0)
      fail(file, "field '_type' is " + in_quotes(type.substr(0, 80)) +
                     ", not a TensorDict (tensorclasses and non-tensor data are not imported)");
    if (!meta.contains("shape")) fail(file, "field 'shape' (the batch size) missing");
    out.batch_size = dims(meta["shape"], file, "field 'shape' (the batch size)");
    for (const auto& [key, entry] : meta.items()) {
      if (!entry.is_object()) continue;  // "shape", "device", "_type" and other metadata
      check_component(key, file);
      const std::string what = "entry " + in_quotes(key);
      if (entry.contains("type")) {
        out.children.push_back(key);
        continue;
      }
      if (entry.contains("is_nested") &&
          (!entry["is_nested"].is_boolean() || entry["is_nested"].get<bool>()))
        fail(file, what + ": field 'is_nested': nested (jagged) tensors are not imported");
      if (!entry.contains("dtype") || !entry["dtype"].is_string())
        fail(file, what + ": field 'dtype' missing or not a string");
      const std::string dt = entry["dtype"].get<std::string>();
      auto dtype = tensordict_dtype(dt);
      if (!dtype)
        fail(file,
             what + ": field 'dtype' " + in_quotes(dt.substr(0, 40)) +
                 " is not one tdstore stores (torch.bool, torch.uint8, ... torch.complex128)");
      if (!entry.contains("shape")) fail(file, what + ": field 'shape' missing");
      TensorDictLeafMeta leaf{key, *dtype, dims(entry["shape"], file, what + ": field 'shape'"), 0};
      if (leaf.shape.size() < out.batch_size.size() ||
          !std::equal(out.batch_size.begin(), out.batch_size.end(), leaf.shape.begin()))
        fail(file, what + ": field 'shape' does not begin with the batch size");
      auto n = shape_bytes(leaf.shape.data(), leaf.shape.size(), dtype_size(leaf.dtype));
      if (!n) fail(file, what + ": field 'shape' overflows 64-bit byte counts");
      leaf.nbytes = *n;
      out.leaves.push_back(std::move(leaf));
    }
  } catch (const json::exception&) {
    fail(file, "an entry is not of the expected JSON types");
  }
  std::sort(out.leaves.begin(), out.leaves.end(),
            [](const auto& a, const auto& b) { return a.key < b.key; });
  std::sort(out.children.begin(), out.children.end());
  return out;
}

std::string tensordict_meta_json(const std::vector<int64_t>& batch_size,
                                 const std::vector<TensorDictLeafMeta>& leaves,
                                 const std::vector<std::string>& children) {
  // What tensordict/_td_memmap.py writes: `_update_metadata` per entry, then `_save_metadata`'s
  // "shape", "device" (str(None) for a dict without a device) and "_type".
  json meta = json::object();
  for (const auto& l : leaves)
    meta[l.key] = {{"device", "cpu"},
                   {"shape", l.shape},
                   {"dtype", tensordict_dtype_name(l.dtype)},
                   {"is_nested", false}};
  for (const auto& c : children) meta[c] = {{"type", "TensorDict"}};
  meta["shape"] = batch_size;
  meta["device"] = "None";
  meta["_type"] = "<class 'tensordict._td.TensorDict'>";
  try {
    return meta.dump();
  } catch (const json::exception&) {
    throw FormatError("a key is not valid UTF-8, which tensordict's meta.json (JSON) requires");
  }
}

}  // namespace tdstore::storage
