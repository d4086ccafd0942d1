// Writes the seed corpora of the fuzz targets from a reference store (every kind of slot
// version: live, overwritten with history, erased, nested, ragged-flagged; attributes).
// Usage: make_seeds DIR (creates DIR/directory/ (formats 4 and 3), DIR/catalog_value/ and
// DIR/records/graph, DIR/manifest/, DIR/compressed/).
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include "storage/catalog.h"
#include "storage/compressed.h"
#include "storage/dataset_manifest.h"
#include "storage/graph_record.h"
#include "storage/store.h"

namespace fs = std::filesystem;
using namespace tdstore::storage;

static std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

static void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f << bytes;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  fs::path out = argv[1],
           tmp = fs::temp_directory_path() / ("tdstore-seeds-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  tdstore::StoreOptions o;
  o.key_capacity = 8;
  o.arena_reserve = int64_t{1} << 26;
  o.alignment = 64;
  fs::create_directories(out / "directory");
  fs::create_directories(out / "catalog_value");
  for (int format : {3, 4}) {  // the store left in tmp is the format-4 one
    fs::remove_all(tmp);
    o.format_version = format;
    auto s = Store::create(tmp, {3}, o);
    float v[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    s->put("a", DType::Float32, {3, 4}, v, sizeof v);
    s->put("b/c", DType::Int32, {3}, v, 12);
    s->put("gone", DType::UInt8, {3}, v, 3);
    s->put_attr("source", "seed");
    s->commit();
    s->put("a", DType::Float32, {3, 2}, v, 24);
    s->erase("gone");
    if (format == 4) {  // a compressed key, appended to (format 5)
      s->put_compressed("z", DType::Float32, {3, 2}, v, 24, tdstore::Compression::zstd(3, 4096));
      s->commit();
      s->set_batch_size({4});
      s->put("a", DType::Float32, {4, 2}, v, 32);
      s->put("b/c", DType::Int32, {4}, v, 16);
      s->append("z", {4, 2}, v, 8);
    }
    s->commit();
    s.reset();
    std::string dir = slurp(tmp / kDirectoryFile), arena = slurp(tmp / kArenaFile);
    uint32_t n = static_cast<uint32_t>(dir.size());
    const std::string name = format == 3 ? "reference-v3" : "reference";
    for (char mode : {'\0', '\1'})  // as stored, and resealed after mutation
      spit(out / "directory" / (mode ? name + "-resealed" : name),
           std::string(1, mode) + std::string(reinterpret_cast<const char*>(&n), 4) + dir + arena);
  }
  // Catalog records as LMDB holds them: a framed two-version value (read back raw), and a
  // version-1 (unframed) one.
  auto record = [](const std::string& key, std::string_view body) {
    return std::string(1, static_cast<char>(key.size())) + key + std::string(body);
  };
  std::string v1;
  uint64_t gen = 1;
  uint32_t len = 4;
  v1.append(reinterpret_cast<const char*>(&gen), 8).push_back(1);
  v1.append(reinterpret_cast<const char*>(&len), 4).append("seed");
  spit(out / "catalog_value" / "version1", record("attr/source", v1));
  {
    auto w = Store::open(tmp, tdstore::OpenMode::ReadWrite, o);
    w->put_attr("source", "seed v2");
    w->commit();
  }
  MDB_env* env;
  MDB_txn* txn;
  MDB_dbi dbi;
  mdb_env_create(&env);
  if (mdb_env_open(env, (tmp / kCatalogDir).c_str(), MDB_RDONLY, 0644) == 0 &&
      mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn) == 0 &&
      mdb_dbi_open(txn, nullptr, 0, &dbi) == 0) {
    std::string key = "attr/source";
    MDB_val k{key.size(), key.data()}, v;
    if (mdb_get(txn, dbi, &k, &v) == 0)
      spit(out / "catalog_value" / "framed",
           record(key, {static_cast<const char*>(v.mv_data), v.mv_size}));
    mdb_txn_abort(txn);
  }
  mdb_env_close(env);
  fs::remove_all(tmp);
  // A compiled-graph record (fuzz_records kind 3) with a guard of every observation kind.
  auto meta = nlohmann::json::parse(R"({"prefix": "", "observations": [
      {"read": "get", "key": "obs", "spec": {"dtype": "float32", "sizes": [128, 784],
       "strides": [784, 1], "device": "cpu", "requires_grad": false}},
      {"query": "contains", "key": "mask", "answer": false},
      {"query": "keys", "key": "next/", "answer": ["next/obs"], "exclude": ["next/a"]},
      {"lazy": "features/norm", "deps": ["obs"], "version": "v1", "answer": true},
      {"read": "get", "key": "gone", "error": {"kind": "KeyError", "message": "key \"gone\" not found"}}],
    "inputs": [], "grad_mode": true,
    "effects": {"erases": [], "writes": ["out"], "lazy_writes": [], "lazy_reuses": 1, "returns": true}})");
  fs::create_directories(out / "records");
  spit(out / "records" / "graph",
       std::string(1, '\3') + encode_graph_record(meta, std::string(600, 'm')));
  // Manifests: an empty dataset, and one with a dense and a ragged key over two shards.
  fs::create_directories(out / "manifest");
  Manifest m;
  spit(out / "manifest" / "empty", manifest_json(m));
  m.row_shape = {2};
  m.shards = {{0, 30}, {3, 0}, {7, 12}};
  m.keys["obs"] = KeySpec{"float32", {4}, false};
  m.keys["tok"] = KeySpec{"int64", {}, true};
  m.seals[0] = ShardSeal{5, 1700000000000000000, {{"obs", 0x0123456789abcdef}, {"tok", 42}}};
  m.seals[7] = ShardSeal{2, 1700000000000000001, {{"obs", 7}, {"tok", 8}}};
  spit(out / "manifest" / "two_shards", manifest_json(m));
  // Compressed keys (fuzz_compressed: u8 row bytes, u16 rows, the stored bytes): one block, many
  // blocks, and blocks appended to a short last block.
  fs::create_directories(out / "compressed");
  auto seed = [&](const char* name, RowLayout l, const std::string& stored) {
    std::string in{static_cast<char>(l.row_bytes), static_cast<char>(l.rows & 0xff),
                   static_cast<char>(l.rows >> 8)};
    spit(out / "compressed" / name, in + stored);
  };
  std::string rows(300 * 40, '\0');
  auto u8 = [](const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); };
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<char>((i * 7) % 13);
  const auto small = tdstore::Compression::zstd(3, 4096);
  seed("one_block", {20, 40}, compress_rows({u8(rows), {}}, {20, 40}, small).join());
  seed("blocks", {40, 300}, compress_rows({u8(rows), {}}, {40, 300}, small).join());
  std::string first = compress_rows({u8(rows), {}}, {40, 150}, small).join();
  auto idx =
      read_index(reinterpret_cast<const uint8_t*>(first.data()), first.size(), {40, 150}, "");
  seed("appended", {40, 300},
       first + append_rows(reinterpret_cast<const uint8_t*>(first.data()), first.size(), idx,
                           {u8(rows) + 150 * 40, {}}, 150, "")
                   .join());
  seed("empty", {8, 0}, compress_rows({u8(rows), {}}, {8, 0}, small).join());
  return 0;
}
