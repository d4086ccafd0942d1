// `tdstore import` of directories (a tensordict memmap directory, a directory of .npy files) and
// `tdstore export --tensordict`, run as a program (TDSTORE_CLI), as tests/cli_test.cpp does.
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tdstore/tdstore.h"
#include "tests/temp_dir.h"

namespace tdstore::cli_import_test {

using json = nlohmann::json;
using testing::TempDir;

struct CliRun {
  int code;
  std::string out, err;
};

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

CliRun cli(const std::string& args) {
  const char* bin = std::getenv("TDSTORE_CLI");
  static TempDir io;
  std::string cmd = std::string(bin ? bin : "tdstore") + " " + args + " >" + (io / "out").string() +
                    " 2>" + (io / "err").string();
  int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, slurp(io / "out"), slurp(io / "err")};
}

std::string q(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

void write(const std::filesystem::path& file, const std::string& bytes) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << bytes;
}

std::string bytes_of(const at::Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
}

std::map<std::string, at::Tensor> sample(int64_t rows) {
  return {{"obs", at::randn({rows, 3})},
          {"action", at::randint(0, 9, {rows}, at::kLong)},
          {"next/pixels", at::randint(0, 256, {rows, 2, 2}, at::kByte)},
          {"next/deep/flag", at::randint(0, 2, {rows}, at::kByte).to(at::kBool)}};
}

void expect_store(const std::filesystem::path& dir, const std::map<std::string, at::Tensor>& t) {
  auto td = TensorDict::open(dir);
  EXPECT_EQ(td.keys().size(), t.size());
  for (const auto& [k, v] : t) EXPECT_TRUE(at::equal(td.get(k), v)) << k;
}

// A tensordict 0.3 directory by hand: sub-dicts found as subdirectories, a robust file name.
TEST(CliImport, ATensordictMemmapDirectoryOfTheOlderLayout) {
  TempDir t;
  auto x = at::arange(8, at::kFloat).reshape({4, 2});
  auto y = at::arange(4, at::kLong);
  write(t / "td" / "a%20b.memmap", bytes_of(x));
  write(t / "td" / "sub" / "y.memmap", bytes_of(y));
  write(t / "td" / "meta.json",
        R"({"a b": {"device": "cpu", "shape": [4, 2], "dtype": "torch.float32"},
            "shape": [4], "device": "cpu", "_type": "<class 'tensordict._td.TensorDict'>"})");
  write(t / "td" / "sub" / "meta.json",
        R"({"y": {"device": "cpu", "shape": [4], "dtype": "torch.int64"},
            "shape": [4], "device": "cpu", "_type": "<class 'tensordict._td.TensorDict'>"})");
  CliRun r = cli("import " + q(t / "s") + " " + q(t / "td"));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_store(t / "s", {{"a b", x}, {"sub/y", y}});
}

TEST(CliImport, ExportTensordictThenImportItBackInChunksAndResume) {
  TempDir t;
  const auto cols = sample(60000);  // 1.5 MB: two chunks of --chunk-mib 1
  write_tensordict(t / "src", cols, {60000});
  CliRun r = cli("import --progress --chunk-mib 1 " + q(t / "s") + " " + q(t / "src"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("import: 60000 of 60000"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("imported 4 key(s), 60000 rows; now 60000 rows"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1500000 bytes verified"), std::string::npos) << r.out;
  EXPECT_EQ(TensorDict::open(t / "s").generation(), 2u) << "one commit per chunk";
  expect_store(t / "s", cols);

  ASSERT_EQ(cli("export " + q(t / "s") + " --tensordict " + q(t / "out")).code, 0);
  json meta = json::parse(slurp(t / "out" / "meta.json"));
  EXPECT_EQ(meta["_type"], "<class 'tensordict._td.TensorDict'>");
  EXPECT_EQ(meta["shape"], json::array({60000}));
  EXPECT_EQ(meta["next"], json({{"type", "TensorDict"}}));
  EXPECT_EQ(meta["obs"]["dtype"], "torch.float32");
  EXPECT_EQ(json::parse(slurp(t / "out" / "next" / "deep" / "meta.json"))["flag"]["dtype"],
            "torch.bool");
  ASSERT_EQ(cli("import " + q(t / "back") + " " + q(t / "out")).code, 0);
  EXPECT_EQ(cli("diff " + q(t / "s") + " " + q(t / "back")).code, 0);

  // An interrupted import: a store holding the source's first rows is completed.
  std::map<std::string, at::Tensor> head;
  for (const auto& [k, v] : cols) head[k] = v.slice(0, 0, 1000);
  write_tensordict(t / "head", head, {1000});
  ASSERT_EQ(cli("import " + q(t / "part") + " " + q(t / "head")).code, 0);
  r = cli("import " + q(t / "part") + " " + q(t / "src"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed after 1000 rows"), std::string::npos) << r.out;
  expect_store(t / "part", cols);
}

TEST(CliImport, ADirectoryOfNpyFiles) {
  TempDir t;
  const auto cols = sample(10);
  for (const auto& [k, v] : cols) {
    std::filesystem::create_directories((t / "npy" / (k + ".npy")).parent_path());
    write_npy(t / "npy" / (k + ".npy"), v);
  }
  CliRun r = cli("import --compress zstd:3 " + q(t / "s") + " " + q(t / "npy"));
  ASSERT_EQ(r.code, 0) << r.err;
  expect_store(t / "s", cols);
  EXPECT_EQ(TensorDict::open(t / "s").compression_of("obs").text().substr(0, 6), "zstd:3");
  write_npy(t / "npy" / "next" / "short.npy", at::arange(9, at::kLong));
  r = cli("import " + q(t / "s2") + " " + q(t / "npy"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("'next/short'"), std::string::npos) << "names the key: " << r.err;
  EXPECT_FALSE(std::filesystem::exists(t / "s2" / "keys.tdd"));
}

TEST(CliImport, CraftedMetaJsonAndPythonOnlyFormatsAreNamedErrors) {
  TempDir t;
  write(t / "td" / "x.memmap", std::string(32, '\0'));
  const std::string head = R"({"shape": [4], "_type": "<class 'tensordict._td.TensorDict'>", )";
  struct Case {
    std::string meta, field;
  } cases[] = {
      {head + R"("x": {"shape": [4, 3], "dtype": "torch.float32"}})", "field 'shape'"},
      {head + R"("x": {"shape": [4, 2], "dtype": "torch.uint16"}})", "field 'dtype'"},
      {head + R"("../x": {"shape": [4, 2], "dtype": "torch.float32"}})", "'../x'"},
      {head + R"("z": {"shape": [4, 2], "dtype": "torch.float32"}})", "missing"},
      {head + R"("x": {"shape": [4, 2], "dtype": "torch.float32", "is_nested": true}})",
       "is_nested"},
      {head + R"("x": [1, 2, "not json)", "not JSON"},
  };
  for (const auto& c : cases) {
    write(t / "td" / "meta.json", c.meta);
    CliRun r = cli("import " + q(t / "s") + " " + q(t / "td"));
    EXPECT_EQ(r.code, 2) << c.meta << ": " << r.err;
    EXPECT_NE(r.err.find((t / "td" / "meta.json").string()), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(c.field), std::string::npos) << "names the field: " << r.err;
    EXPECT_FALSE(std::filesystem::exists(t / "s"));
  }
  write(t / "d.h5", "\x89HDF\r\n\x1a\n");
  CliRun r = cli("import " + q(t / "s") + " " + q(t / "d.h5"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("python3 -m tdstore import"), std::string::npos) << r.err;
}

}  // namespace tdstore::cli_import_test
