// IDX, .npy and safetensors: round trips, the published layouts, numpy as an outside reader
// and writer, and malformed files.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tdstore/tdstore.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

using json = nlohmann::json;
using testing::TempDir;

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

bool have_numpy() { return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

// Runs a Python snippet with numpy; returns its stdout.
std::string python(const std::string& code, const TempDir& t) {
  std::ofstream(t / "snippet.py") << code;
  std::string cmd =
      "/usr/bin/python3 " + (t / "snippet.py").string() + " > " + (t / "py.out").string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::string out = slurp(t / "py.out");
  EXPECT_EQ(rc, 0) << out;
  return out;
}

std::vector<at::Tensor> samples() {
  at::Tensor base = at::arange(-6, 6, at::kDouble).reshape({3, 4}) * 1.5;
  return {base.to(at::kBool),
          base.abs().to(at::kByte),
          base.to(at::kChar),
          base.to(at::kShort),
          base.to(at::kInt),
          base.to(at::kLong),
          base.to(at::kHalf),
          base.to(at::kFloat),
          base,
          base.to(at::kComplexFloat),
          base.to(at::kComplexDouble),
          at::arange(5, at::kFloat),
          at::scalar_tensor(2.5, at::kDouble),
          at::arange(0, at::kInt).reshape({0, 3})};
}

TEST(Io, IdxRawAndGzip) {
  TempDir t;
  // An int32 [2, 3] IDX file: magic 0 0 0x0C 2, dims big-endian, data big-endian.
  std::string bytes = std::string("\0\0\x0C\x02", 4) + std::string("\0\0\0\x02\0\0\0\x03", 8);
  for (int v = -3; v < 3; ++v) {
    uint32_t u = static_cast<uint32_t>(v);
    for (int b = 3; b >= 0; --b) bytes.push_back(static_cast<char>((u >> (8 * b)) & 0xff));
  }
  std::ofstream(t / "a.idx", std::ios::binary) << bytes;
  gzFile gz = gzopen((t / "a.idx.gz").c_str(), "wb");
  gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(gz);
  at::Tensor expect = at::arange(-3, 3, at::kInt).reshape({2, 3});
  EXPECT_TRUE(at::equal(read_idx(t / "a.idx"), expect));
  EXPECT_TRUE(at::equal(read_idx(t / "a.idx.gz"), expect));
  std::ofstream(t / "bad.idx", std::ios::binary) << std::string("\1\2\3\4", 4);
  EXPECT_THROW(read_idx(t / "bad.idx"), FormatError);
  std::ofstream(t / "short.idx", std::ios::binary) << bytes.substr(0, bytes.size() - 3);
  EXPECT_THROW(read_idx(t / "short.idx"), FormatError);
}

TEST(Io, FashionMnistFiles) {
  std::filesystem::path dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir / "t10k-labels-idx1-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  at::Tensor images = read_idx(dir / "t10k-images-idx3-ubyte.gz");
  at::Tensor labels = read_idx(dir / "t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(images.sizes(), (std::vector<int64_t>{10000, 28, 28}));
  EXPECT_EQ(images.scalar_type(), at::kByte);
  EXPECT_EQ(labels.sizes(), std::vector<int64_t>{10000});
  EXPECT_EQ(labels.max().item<int64_t>(), 9);
  EXPECT_EQ(labels.bincount().min().item<int64_t>(), 1000) << "1,000 test images per class";
}

TEST(Io, NpyRoundTripAndNumpy) {
  TempDir t;
  auto all = samples();
  for (size_t i = 0; i < all.size(); ++i) {
    auto f = t / ("s" + std::to_string(i) + ".npy");
    write_npy(f, all[i]);
    at::Tensor back = read_npy(f);
    EXPECT_EQ(back.scalar_type(), all[i].scalar_type()) << i;
    EXPECT_EQ(back.sizes(), all[i].sizes()) << i;
    EXPECT_TRUE(at::equal(back, all[i])) << i;
    std::string head = slurp(f).substr(0, 10);
    EXPECT_EQ(head.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
    EXPECT_EQ(slurp(f).find('\n') % 64, 63u) << "header padded to 64 bytes";
  }
  write_npy(t / "strided.npy", at::arange(12, at::kFloat).reshape({3, 4}).t());
  EXPECT_TRUE(
      at::equal(read_npy(t / "strided.npy"), at::arange(12, at::kFloat).reshape({3, 4}).t()));
  if (!have_numpy()) GTEST_SKIP() << "python3-numpy not installed: outside reader not checked";
  std::string out =
      python(R"(
import numpy, glob
for f in sorted(glob.glob(')" +
                 t.path().string() + R"(/s*.npy')):
    a = numpy.load(f)
    print(f.split('/')[-1], a.dtype, a.shape, complex(a.sum()).real)
a = numpy.arange(24, dtype='>i4').reshape(2, 3, 4)
numpy.save(')" + t.path().string() +
                 R"(/big_endian.npy', a)
numpy.save(')" + t.path().string() +
                 R"(/fortran.npy', numpy.asfortranarray(numpy.arange(6.0).reshape(2, 3)))
)",
             t);
  EXPECT_NE(out.find("s7.npy float32 (3, 4) -9.0"), std::string::npos) << out;
  EXPECT_NE(out.find("s0.npy bool (3, 4)"), std::string::npos) << out;
  EXPECT_NE(out.find("s10.npy complex128 (3, 4)"), std::string::npos) << out;
  EXPECT_NE(out.find("s12.npy float64 () 2.5"), std::string::npos) << out;
  EXPECT_NE(out.find("s13.npy int32 (0, 3) 0.0"), std::string::npos) << out;
  EXPECT_TRUE(
      at::equal(read_npy(t / "big_endian.npy"), at::arange(24, at::kInt).reshape({2, 3, 4})));
  EXPECT_TRUE(at::equal(read_npy(t / "fortran.npy"), at::arange(6, at::kDouble).reshape({2, 3})));
  // map_npy_array: the same values; a C-order little-endian file in place (an import copies it
  // file to file and never holds it in memory), the others converted in memory.
  for (const char* name : {"s7.npy", "big_endian.npy", "fortran.npy"}) {
    const Array mapped = map_npy_array(t / name), read = read_npy_array(t / name);
    EXPECT_EQ(mapped.shape, read.shape) << name;
    ASSERT_EQ(mapped.nbytes, read.nbytes) << name;
    EXPECT_EQ(std::memcmp(mapped.data, read.data, read.nbytes), 0) << name;
    EXPECT_EQ(mapped.file, std::string(name) == "s7.npy" ? t / name : std::filesystem::path())
        << name;
  }
}

TEST(Io, SafetensorsLayoutAndOutsideReader) {
  TempDir t;
  std::map<std::string, at::Tensor> in = {
      {"a/weight", at::randn({3, 5})},
      {"b", at::arange(7, at::kLong)},
      {"flags", at::arange(4, at::kInt).remainder(2).to(at::kBool)},
      {"half", at::arange(6, at::kFloat).to(at::kBFloat16)}};
  auto f = t / "x.safetensors";
  write_safetensors(f, in, {{"source", "test"}});
  // The published layout: u64 little-endian header size, JSON header, then the data; offsets
  // relative to the data start, contiguous, covering it exactly.
  std::string bytes = slurp(f);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  json header = json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["source"], "test");
  EXPECT_EQ(header["a/weight"]["dtype"], "F32");
  EXPECT_EQ(header["half"]["dtype"], "BF16");
  EXPECT_EQ(header["b"]["shape"], json::array({7}));
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (auto& [k, v] : header.items())
    if (k != "__metadata__") spans.emplace_back(v["data_offsets"][0], v["data_offsets"][1]);
  std::sort(spans.begin(), spans.end());
  uint64_t at = 0;
  for (auto [b, e] : spans) {
    EXPECT_EQ(b, at);
    at = e;
  }
  EXPECT_EQ(at, bytes.size() - 8 - n);
  std::map<std::string, std::string> meta;
  auto back = read_safetensors(f, &meta);
  EXPECT_EQ(meta["source"], "test");
  for (const auto& [k, v] : in) EXPECT_TRUE(at::equal(back.at(k), v)) << k;
  EXPECT_THROW(
      write_safetensors(t / "c.safetensors", {{"c", at::randn({2}).to(at::kComplexFloat)}}),
      DTypeError);
  // Overlapping offsets are rejected.
  json evil = {{"x", {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {0, 4}}}},
               {"y", {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {2, 6}}}}};
  std::string h = evil.dump();
  uint64_t hn = h.size();
  std::string file(reinterpret_cast<const char*>(&hn), 8);
  file += h + std::string(6, 'z');
  std::ofstream(t / "evil.safetensors", std::ios::binary) << file;
  EXPECT_THROW(read_safetensors(t / "evil.safetensors"), FormatError);
  if (!have_numpy()) GTEST_SKIP() << "python3-numpy not installed: outside reader not checked";
  std::string out = python(R"(
import json, struct, numpy
raw = open(')" + f.string() + R"(', 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
h = json.loads(raw[8:8 + n])
data = raw[8 + n:]
b = h['b']
a = numpy.frombuffer(data[b['data_offsets'][0]:b['data_offsets'][1]], dtype='<i8').reshape(b['shape'])
print('b', a.tolist())
)",
                           t);
  EXPECT_NE(out.find("b [0, 1, 2, 3, 4, 5, 6]"), std::string::npos) << out;
}

void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f << bytes;
}

std::string npy_with(const std::string& dict) {
  std::string header = dict;
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header;
}

// Crafted headers are FormatErrors naming the file, before anything is allocated: never a
// libtorch allocation error, a std::out_of_range or a raw JSON exception.
TEST(Io, CraftedHeadersAreFormatErrors) {
  TempDir t;
  auto expect_format_error = [&](const std::filesystem::path& p, auto read, const std::string& what,
                                 const char* expect = nullptr) {
    try {
      read(p);
      ADD_FAILURE() << what << ": no error";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos)
          << "a raw JSON error: " << e.what();
      if (expect) {
        EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": " << e.what();
    }
  };
  auto npy = [](const std::filesystem::path& p) { return read_npy(p); };
  write_file(t / "huge.npy",
             npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"));
  expect_format_error(t / "huge.npy", npy, "a shape the file does not hold");
  write_file(
      t / "overflow.npy",
      npy_with("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"));
  expect_format_error(t / "overflow.npy", npy, "a dimension past int64");
  write_file(
      t / "product.npy",
      npy_with("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"));
  expect_format_error(t / "product.npy", npy, "a byte count past 2^64");
  auto st = [](const std::filesystem::path& p) { return read_safetensors(p); };
  auto safetensors = [](const std::string& header) {
    uint64_t n = header.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + header;
  };
  write_file(t / "meta.safetensors", safetensors(R"({"__metadata__": {"a": 1}})"));
  expect_format_error(t / "meta.safetensors", st, "a non-string metadata value");
  write_file(t / "neg.safetensors",
             safetensors(R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})"));
  expect_format_error(t / "neg.safetensors", st, "a negative dimension",
                      "field 'shape' has a negative dimension -1");
  write_file(t / "nodtype.safetensors",
             safetensors(R"({"x": {"shape": [1], "data_offsets": [0, 4]}})"));
  expect_format_error(t / "nodtype.safetensors", st, "a missing field",
                      "tensor 'x': field 'dtype' missing");
  write_file(t / "notobj.safetensors", safetensors(R"({"x": 3})"));
  expect_format_error(t / "notobj.safetensors", st, "a tensor entry that is no object",
                      "tensor 'x': not a JSON object");
  auto idx = [](const std::filesystem::path& p) { return read_idx(p); };
  write_file(t / "big.idx", std::string("\x00\x00\x08\x02\x00\x01\x00\x00\x00\x01\x00\x00", 12));
  expect_format_error(t / "big.idx", idx, "dimensions the raw file does not hold");
}

}  // namespace
}  // namespace tdstore
