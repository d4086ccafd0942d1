// The torch-free admin API (tdstore/admin.h) and file formats (tdstore/formats.h): what the
// tdstore tool and scripts rely on, checked against stores written through storage::Store.
#include "tdstore/admin.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "storage/derived.h"
#include "storage/graph_record.h"
#include "storage/records.h"
#include "storage/store.h"
#include "tdstore/errors.h"
#include "tdstore/formats.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

using storage::Store;
using testing::TempDir;
namespace fs = std::filesystem;

std::vector<float> iota(size_t n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

void put_floats(Store& s, const std::string& key, std::vector<int64_t> shape, float from) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  auto v = iota(static_cast<size_t>(n), from);
  s.put(key, DType::Float32, shape, v.data(), v.size() * 4);
}

std::vector<float> floats_of(const Array& a) {
  std::vector<float> v(a.nbytes / 4);
  std::memcpy(v.data(), a.data, a.nbytes);
  return v;
}

Array view(DType d, std::vector<int64_t> shape, const void* data, uint64_t nbytes) {
  Array a;
  a.dtype = d, a.shape = std::move(shape), a.data = data, a.nbytes = nbytes;
  return a;
}

// The lazy-provenance record a property computed now from deps would get.
std::string lazy_record(const Store& s, const std::string& key,
                        const std::vector<std::string>& deps) {
  storage::LazyRecord r;
  r.version = "v1";
  for (const auto& d : deps) {
    uint64_t sum = 0;
    auto fp = storage::key_fingerprint(s, d, &sum);
    r.deps.push_back({d, *fp, sum});
  }
  r.fingerprint = storage::key_fingerprint(s, key);
  return storage::lazy_record_json(r);
}

// A store with nested keys, a ragged key, an attribute, a lazy property and two compiled-graph
// records, one whose meta is cut short.
fs::path make_store(const TempDir& t) {
  auto dir = t / "s";
  auto s = Store::create(dir, {4}, {});
  put_floats(*s, "a/x", {4, 3}, 0);
  put_floats(*s, "a/y", {4}, 100);
  put_floats(*s, "b", {4, 2}, -4);
  std::vector<float> values = iota(6, 1);
  std::vector<int64_t> offsets = {0, 1, 4, 4, 6};
  s->put("tokens", DType::Float32, {6}, values.data(), 24, 0, storage::kSlotRagged);
  s->put(storage::ragged_offsets_key("tokens"), DType::Int64, {5}, offsets.data(), 40, 0,
         storage::kSlotRagged);
  s->put_attr("source", "admin test");
  s->commit();
  put_floats(*s, "a/norm", {4, 3}, 7);
  s->put_meta("lazy/a/norm", lazy_record(*s, "a/norm", {"a/x"}));
  s->commit();
  // A record as CompiledFunction writes it (docs/FORMAT.md, "Compiled graphs").
  auto meta = nlohmann::json::parse(R"json({"prefix": "", "observations": [
      {"read": "get", "key": "a/x", "spec": {"dtype": "float32", "sizes": [-1, 3],
       "strides": [3, 1], "device": "cpu", "requires_grad": false}},
      {"read": "get", "key": "a/gone", "error": {"kind": "KeyError", "message": "not found"}}],
    "inputs": [], "grad_mode": true, "dynamic_dim0": true,
    "effects": {"erases": [], "writes": [], "lazy_writes": [], "lazy_reuses": 0,
                "returns": true}})json");
  s->put_cache("graph/double/c0de/1.13/9999", storage::encode_graph_record(meta, "archive"));
  s->put_cache("graph/double/c0de/1.13/0bad", std::string("\x05\x00", 2));  // meta cut short
  return dir;
}

TEST(Admin, SummaryCountsWhatTheStoreHolds) {
  TempDir t;
  auto dir = make_store(t);
  auto r = StoreReader::open(dir);
  StoreSummary s = r.summary();
  EXPECT_EQ(s.generation, 2u);
  EXPECT_EQ(s.batch_size, std::vector<int64_t>({4}));
  EXPECT_EQ(s.keys, 5u) << "a ragged key's offsets are not a key";
  EXPECT_EQ(s.key_capacity, 4096u);
  EXPECT_EQ(s.tensor_bytes, 48u + 16 + 32 + 24 + 40 + 48);
  EXPECT_GE(s.arena_bytes_used, s.tensor_bytes);
  EXPECT_EQ(s.attributes, 1u);
  EXPECT_EQ(s.lazy_properties, 1u);
  EXPECT_EQ(s.compiled_graphs, 2u) << "records, decodable or not";
  EXPECT_GT(s.committed_at_ns, 0);
  EXPECT_THROW(StoreReader::open(t / "nowhere"), Error);
}

TEST(Admin, EntriesListKeysUnderAPrefixWithTheirFlags) {
  TempDir t;
  auto r = StoreReader::open(make_store(t));
  std::vector<std::string> keys;
  for (const auto& e : r.entries()) keys.push_back(e.key);
  EXPECT_EQ(keys, std::vector<std::string>({"a/norm", "a/x", "a/y", "b", "tokens"}));
  keys.clear();
  for (const auto& e : r.entries("a")) keys.push_back(e.key);
  EXPECT_EQ(keys, std::vector<std::string>({"a/norm", "a/x", "a/y"}));
  ASSERT_EQ(r.entries("a/x").size(), 1u) << "a leaf named exactly";
  EXPECT_TRUE(r.entries("c").empty());
  auto x = *r.find("a/x");
  EXPECT_EQ(x.dtype, DType::Float32);
  EXPECT_EQ(x.shape, std::vector<int64_t>({4, 3}));
  EXPECT_EQ(x.nbytes, 48u);
  EXPECT_FALSE(x.lazy || x.ragged);
  EXPECT_TRUE(r.find("a/norm")->lazy);
  auto tokens = *r.find("tokens");
  EXPECT_TRUE(tokens.ragged);
  EXPECT_EQ(tokens.offsets_nbytes, 40u);
  EXPECT_FALSE(r.find(storage::ragged_offsets_key("tokens"))) << "companions are not keys";
  EXPECT_FALSE(r.find("nope"));
}

TEST(Admin, ReadIsZeroCopyAndReadDensePadsRaggedKeys) {
  TempDir t;
  auto r = StoreReader::open(make_store(t));
  Array y = r.read("a/y");
  EXPECT_EQ(floats_of(y), iota(4, 100));
  EXPECT_EQ(r.read("a/y").data, y.data) << "both are the mapped bytes";
  Array dense = r.read_dense("tokens");
  EXPECT_EQ(dense.shape, std::vector<int64_t>({4, 3}));
  EXPECT_EQ(floats_of(dense), std::vector<float>({1, 0, 0, 2, 3, 4, 0, 0, 0, 5, 6, 0}));
  Array off = r.read_offsets("tokens");
  EXPECT_EQ(off.dtype, DType::Int64);
  EXPECT_EQ(off.shape, std::vector<int64_t>({5}));
  try {
    r.read("missing");
    ADD_FAILURE() << "no KeyError";
  } catch (const KeyError& e) {
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find((t / "s").string()), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.read_offsets("a/x"), KeyError);
}

TEST(Admin, VerifyReportsProgressAndNamesTheCorruptKey) {
  TempDir t;
  auto dir = make_store(t);
  {
    auto damaged = StoreReader::open(dir).verify().damaged_catalog;
    ASSERT_EQ(damaged.size(), 1u);
    EXPECT_EQ(damaged[0].rfind("graph/double/c0de/1.13/0bad: ", 0), 0u) << damaged[0];
    clear_graphs(dir);
    auto r = StoreReader::open(dir);
    uint64_t last = 0, total = 0;
    VerifyReport v = r.verify({}, [&](uint64_t done, uint64_t all) { last = done, total = all; });
    EXPECT_TRUE(v.ok()) << ::testing::PrintToString(v.corrupt)
                        << ::testing::PrintToString(v.damaged_catalog)
                        << ::testing::PrintToString(v.damaged_structure);
    EXPECT_EQ(v.checked, 6u) << "five keys and the ragged key's offsets";
    EXPECT_EQ(last, total);
    EXPECT_EQ(total, v.bytes);
    EXPECT_THROW(r.verify({"nope"}), KeyError);
    // Flip a byte of a/y in the arena file.
    uint64_t offset = r.find("a/y")->offset;
    std::fstream f(dir / "arena.tda", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put('\x7f');
  }
  auto r = StoreReader::open(dir);
  VerifyReport v = r.verify();
  EXPECT_EQ(v.corrupt, std::vector<std::string>({"a/y"}));
  EXPECT_TRUE(r.verify({"a/x", "tokens (offsets)"}).ok());
  EXPECT_FALSE(r.verify({"a/y"}).ok());
}

TEST(Admin, LazyProvenanceIsValidUntilADependencyChanges) {
  TempDir t;
  auto dir = make_store(t);
  {
    auto lazy = StoreReader::open(dir).lazy_properties();
    ASSERT_EQ(lazy.size(), 1u);
    EXPECT_EQ(lazy[0].key, "a/norm");
    EXPECT_EQ(lazy[0].version, "v1");
    ASSERT_EQ(lazy[0].deps.size(), 1u);
    EXPECT_EQ(lazy[0].deps[0].key, "a/x");
    EXPECT_TRUE(lazy[0].valid);
  }
  {
    auto s = Store::open(dir, OpenMode::ReadWrite, {});
    put_floats(*s, "a/n2", {4, 3}, 1);  // a property of the property
    s->put_meta("lazy/a/n2", lazy_record(*s, "a/n2", {"a/norm"}));
    s->commit();
  }
  for (const auto& p : StoreReader::open(dir).lazy_properties()) EXPECT_TRUE(p.valid) << p.key;
  {
    auto s = Store::open(dir, OpenMode::ReadWrite, {});
    put_floats(*s, "a/x", {4, 3}, 1);  // the input changes
    s->commit();
  }
  for (const auto& p : StoreReader::open(dir).lazy_properties())
    EXPECT_FALSE(p.valid) << p.key << ": stale directly or through the property it reads";
  EXPECT_TRUE(invalidate_lazy(dir, "a/norm"));
  EXPECT_FALSE(invalidate_lazy(dir, "a/norm")) << "nothing left to forget";
  auto r = StoreReader::open(dir);
  EXPECT_EQ(r.lazy_properties().size(), 1u);
  EXPECT_TRUE(r.find("a/norm")) << "the tensor stays";
  EXPECT_EQ(r.summary().generation, 5u) << "invalidation commits";
}

TEST(Admin, GraphsAreListedWithWhatTheyReadAndCleared) {
  TempDir t;
  auto dir = make_store(t);
  std::vector<std::string> damaged;
  auto graphs = StoreReader::open(dir).graphs("", &damaged);
  ASSERT_EQ(graphs.size(), 1u);
  EXPECT_EQ(graphs[0].function, "double");
  EXPECT_EQ(graphs[0].code_id, "c0de");
  EXPECT_EQ(graphs[0].torch_version, "1.13");
  EXPECT_EQ(graphs[0].guard, "9999");
  EXPECT_EQ(graphs[0].reads, std::vector<std::string>({"a/x float32[*,3]"}));
  EXPECT_TRUE(graphs[0].dynamic_dim0);
  EXPECT_EQ(damaged, std::vector<std::string>({"graph/double/c0de/1.13/0bad"}));
  EXPECT_TRUE(StoreReader::open(dir).graphs("other").empty());
  EXPECT_EQ(clear_graphs(dir, "other").removed, 0u);
  ClearResult c = clear_graphs(dir);
  EXPECT_EQ(c.removed, 2u);
  EXPECT_EQ(c.damaged, 1u);
  damaged.clear();
  EXPECT_TRUE(StoreReader::open(dir).graphs("", &damaged).empty());
  EXPECT_TRUE(damaged.empty());
  EXPECT_TRUE(StoreReader::open(dir).verify().ok()) << "the damaged record is gone";
  EXPECT_EQ(StoreReader::open(dir).summary().generation, 2u)
      << "cache records are outside the commit protocol";
}

TEST(Admin, DiffNamesAddedRemovedChangedKeys) {
  TempDir t;
  auto dir = make_store(t);
  fs::copy(dir, t / "copy", fs::copy_options::recursive);
  EXPECT_TRUE(diff(dir, t / "copy").identical());
  {
    auto s = Store::open(t / "copy", OpenMode::ReadWrite, {});
    put_floats(*s, "a/y", {4}, 0);   // content
    put_floats(*s, "b", {4, 1}, 0);  // spec
    s->erase("a/x");
    put_floats(*s, "c", {4}, 0);
    s->commit();
  }
  StoreDiff d = diff(dir, t / "copy");
  EXPECT_FALSE(d.identical());
  EXPECT_EQ(d.added, std::vector<std::string>({"c"}));
  EXPECT_EQ(d.removed, std::vector<std::string>({"a/x"}));
  EXPECT_EQ(d.content_changed, std::vector<std::string>({"a/y"}));
  ASSERT_EQ(d.spec_changed.size(), 1u);
  EXPECT_EQ(d.spec_changed[0].b_shape, std::vector<int64_t>({4, 1}));
}

TEST(Admin, ImportCreatesAppendsAndRefusesWhatDoesNotFit) {
  TempDir t;
  auto dir = t / "imp";
  std::vector<float> x = iota(6, 0);
  std::vector<int64_t> y = {1, 2};
  std::map<std::string, Array> rows = {{"x", view(DType::Float32, {2, 3}, x.data(), 24)},
                                       {"y", view(DType::Int64, {2}, y.data(), 16)}};
  ImportResult r = import_arrays(dir, rows, /*append=*/true);
  EXPECT_EQ(r.rows, 2);
  EXPECT_EQ(r.total_rows, 2);
  r = import_arrays(dir, rows, true);
  EXPECT_EQ(r.total_rows, 4);
  const uint64_t generation = r.generation;
  {
    auto reader = StoreReader::open(dir);
    std::vector<float> want = x;
    want.insert(want.end(), x.begin(), x.end());
    EXPECT_EQ(floats_of(reader.read("x")), want);
  }
  auto refused = [&](std::map<std::string, Array> bad, const char* what) {
    try {
      import_arrays(dir, bad, true);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(dir.string()), std::string::npos) << e.what();
    }
    EXPECT_EQ(StoreReader::open(dir).summary().generation, generation)
        << what << ": nothing committed";
    EXPECT_EQ(StoreReader::open(dir).summary().batch_size, std::vector<int64_t>({4})) << what;
  };
  refused({{"x", rows["x"]}}, "a key missing");
  refused({{"x", rows["x"]}, {"y", rows["y"]}, {"z", rows["y"]}}, "an extra key");
  refused({{"x", rows["x"]}, {"y", view(DType::Int32, {2}, y.data(), 8)}}, "another dtype");
  refused({{"x", view(DType::Float32, {2, 2}, x.data(), 16)}, {"y", rows["y"]}},
          "other trailing dims");
  refused({{"x", view(DType::Float32, {3, 2}, x.data(), 24)}, {"y", rows["y"]}},
          "rows disagreeing");
  // A lazy property the rows do not hold is dropped: every input grows.
  {
    auto s = Store::open(dir, OpenMode::ReadWrite, {});
    put_floats(*s, "mean", {4}, 0);
    s->put_meta("lazy/mean", lazy_record(*s, "mean", {"x"}));
    s->commit();
  }
  r = import_arrays(dir, rows, true);
  EXPECT_EQ(r.total_rows, 6);
  auto reader = StoreReader::open(dir);
  EXPECT_FALSE(reader.find("mean"));
  EXPECT_TRUE(reader.lazy_properties().empty());
  EXPECT_TRUE(reader.verify().ok());
  // Without append: the arrays are set (the store's batch size must match).
  EXPECT_THROW(import_arrays(dir, rows), ShapeError);
  EXPECT_EQ(import_arrays(t / "fresh", rows).total_rows, 2);
}

// ---- file formats

TEST(Formats, NpyRoundTripsEveryDtypeItHas) {
  TempDir t;
  for (DType d :
       {DType::Bool, DType::UInt8, DType::Int8, DType::Int16, DType::Int32, DType::Int64,
        DType::Float16, DType::Float32, DType::Float64, DType::Complex64, DType::Complex128}) {
    std::vector<uint8_t> bytes(6 * dtype_size(d));
    for (size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = d == DType::Bool ? i % 2 : static_cast<uint8_t>(i * 7);
    auto file = t / (std::string(dtype_name(d)) + ".npy");
    write_npy_array(file, view(d, {2, 3}, bytes.data(), bytes.size()));
    Array back = read_npy_array(file);
    EXPECT_EQ(back.dtype, d);
    EXPECT_EQ(back.shape, std::vector<int64_t>({2, 3}));
    ASSERT_EQ(back.nbytes, bytes.size());
    EXPECT_EQ(std::memcmp(back.data, bytes.data(), bytes.size()), 0) << dtype_name(d);
  }
  uint16_t bf[2] = {0, 0};
  EXPECT_THROW(write_npy_array(t / "bf.npy", view(DType::BFloat16, {2}, bf, 4)), DTypeError);
  EXPECT_THROW(write_npy_array(t / "short.npy", view(DType::Float32, {2}, bf, 4)), ShapeError)
      << "bytes that do not fill the shape";
}

std::string npy_file(const std::string& dict, const std::string& data) {
  std::string h = dict;
  h.append((10 + h.size() + 1 + 63) / 64 * 64 - 10 - h.size() - 1, ' ');
  h += '\n';
  return std::string("\x93NUMPY\x01\x00", 8) + char(h.size() & 0xff) + char(h.size() >> 8) + h +
         data;
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

TEST(Formats, NpyFortranOrderAndBigEndianComeBackInCOrderHostBytes) {
  TempDir t;
  // The 2x3 array [[0, 1, 2], [3, 4, 5]] stored column by column, big-endian int32.
  std::string data;
  for (int v : {0, 3, 1, 4, 2, 5}) data += std::string{0, 0, 0, static_cast<char>(v)};
  write_file(t / "f.npy",
             npy_file("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }", data));
  Array a = read_npy_array(t / "f.npy");
  EXPECT_EQ(a.shape, std::vector<int64_t>({2, 3}));
  std::vector<int32_t> v(6);
  std::memcpy(v.data(), a.data, 24);
  EXPECT_EQ(v, std::vector<int32_t>({0, 1, 2, 3, 4, 5}));
}

TEST(Formats, MalformedHeadersNameTheFileAndTheField) {
  TempDir t;
  auto expect = [&](const fs::path& file, auto read, const std::string& field) {
    try {
      read(file);
      ADD_FAILURE() << file << " accepted";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  auto npy = [](const fs::path& p) { return read_npy_array(p); };
  write_file(t / "neg.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }",
                                     std::string(8, 0)));
  expect(t / "neg.npy", npy, "'shape' holds '-'");
  write_file(t / "huge.npy",
             npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }",
                      std::string(8, 0)));
  expect(t / "huge.npy", npy, "data truncated");
  write_file(t / "nodescr.npy",
             npy_file("{'fortran_order': False, 'shape': (2,), }", std::string(8, 0)));
  expect(t / "nodescr.npy", npy, "'descr'");
  auto st = [](const fs::path& p) { return read_safetensors_arrays(p); };
  auto safetensors = [](const std::string& header, size_t data) {
    uint64_t n = header.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + header + std::string(data, '\0');
  };
  write_file(t / "a.safetensors",
             safetensors(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         12));
  expect(t / "a.safetensors", st, "overlap");
  write_file(t / "b.safetensors",
             safetensors(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,"8"]}})", 8));
  expect(t / "b.safetensors", st, "data_offsets");
  // IDX: gzip data claimed far past what the stream holds fails as truncated, allocating only
  // what arrives.
  std::string idx = {0, 0, 8, 1, 0x10, 0, 0, 0};  // u8, one dim of 2^28 * 16 = 4 GiB
  idx += std::string(100, 'x');
  gzFile g = gzopen((t / "big.idx.gz").c_str(), "wb");
  gzwrite(g, idx.data(), static_cast<unsigned>(idx.size()));
  gzclose(g);
  expect(
      t / "big.idx.gz", [](const fs::path& p) { return read_idx_array(p); }, "truncated");
}

TEST(Formats, SafetensorsRoundTripWithMetadata) {
  TempDir t;
  std::vector<float> x = iota(6, 0);
  std::vector<uint16_t> h = {0x3c00, 0x4000};  // float16 1, 2
  write_safetensors_arrays(t / "m.safetensors",
                           {{"x", view(DType::Float32, {2, 3}, x.data(), 24)},
                            {"h", view(DType::Float16, {2}, h.data(), 4)}},
                           {{"format", "pt"}});
  std::map<std::string, std::string> meta;
  auto back = read_safetensors_arrays(t / "m.safetensors", &meta);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(floats_of(back["x"]), x);
  EXPECT_EQ(back["h"].dtype, DType::Float16);
  EXPECT_EQ(std::memcmp(back["h"].data, h.data(), 4), 0);
  EXPECT_EQ(meta["format"], "pt");
  std::vector<float> c(4);
  EXPECT_THROW(write_safetensors_arrays(t / "c.safetensors",
                                        {{"c", view(DType::Complex64, {2}, c.data(), 16)}}),
               DTypeError);
}

}  // namespace
}  // namespace tdstore
