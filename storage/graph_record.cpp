#include "storage/graph_record.h"

#include <zstd.h>

#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

constexpr size_t kLengthBytes = 4;

[[noreturn]] void damaged(const std::string& where, const std::string& what) {
  throw CorruptionError("compiled graph record " + where + ": " + what);
}

}  // namespace

std::string encode_graph_record(const nlohmann::json& meta, std::string_view module) {
  if (!meta.is_object()) throw Error("compiled graph record: meta is not a JSON object");
  if (module.size() > kMaxGraphModuleBytes)
    throw Error("compiled graph record: module archive of " + std::to_string(module.size()) +
                " bytes exceeds the limit of " + std::to_string(kMaxGraphModuleBytes));
  std::string text = meta.dump();
  if (text.size() > UINT32_MAX) throw Error("compiled graph record: guard JSON exceeds 4 GiB");
  uint32_t n = static_cast<uint32_t>(text.size());
  std::string out;
  out.reserve(kLengthBytes + text.size() + ZSTD_compressBound(module.size()));
  for (size_t i = 0; i < kLengthBytes; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += text;
  size_t at = out.size();
  out.resize(at + ZSTD_compressBound(module.size()));
  size_t z = ZSTD_compress(out.data() + at, out.size() - at, module.data(), module.size(), 3);
  if (ZSTD_isError(z))
    throw Error(std::string("compiled graph record: zstd: ") + ZSTD_getErrorName(z));
  out.resize(at + z);
  return out;
}

GraphRecord decode_graph_record(std::string_view value, const std::string& where) {
  if (value.size() < kLengthBytes) damaged(where, "truncated before the meta length");
  uint64_t n = 0;
  for (size_t i = 0; i < kLengthBytes; ++i)
    n |= uint64_t{static_cast<unsigned char>(value[i])} << (8 * i);
  if (value.size() - kLengthBytes < n)
    damaged(where, "meta length " + std::to_string(n) + " overruns the record of " +
                       std::to_string(value.size()) + " bytes");
  GraphRecord r;
  r.meta =
      nlohmann::json::parse(value.substr(kLengthBytes, n), nullptr, /*allow_exceptions=*/false);
  if (r.meta.is_discarded()) damaged(where, "meta is not valid JSON");
  if (!r.meta.is_object()) damaged(where, "meta is not a JSON object");
  std::string_view frame = value.substr(kLengthBytes + n);
  size_t frame_size = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
  if (ZSTD_isError(frame_size)) damaged(where, "the module is not a whole zstd frame");
  if (frame_size != frame.size()) damaged(where, "bytes follow the zstd frame");
  unsigned long long size = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN)
    damaged(where, "the zstd frame does not state its size");
  if (size > kMaxGraphModuleBytes)
    damaged(where, "the zstd frame claims " + std::to_string(size) +
                       " bytes, more than the limit of " + std::to_string(kMaxGraphModuleBytes));
  // Each block of a frame has a 3-byte header and yields at most ZSTD_BLOCKSIZE_MAX bytes.
  if (size > (frame.size() / 3 + 1) * uint64_t{ZSTD_BLOCKSIZE_MAX})
    damaged(where, "the zstd frame claims " + std::to_string(size) + " bytes, more than its " +
                       std::to_string(frame.size()) + " bytes can hold");
  r.module.resize(size);
  size_t got = ZSTD_decompress(r.module.data(), r.module.size(), frame.data(), frame.size());
  if (ZSTD_isError(got) || got != size) damaged(where, "the zstd frame is corrupt");
  return r;
}

}  // namespace tdstore::storage
