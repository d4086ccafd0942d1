// The tdstore CLI, run as a program (TDSTORE_CLI: the built or the installed binary) on stores
// made here: every subcommand, --json parsed back, exit codes, a flipped byte found by verify,
// compaction killed midway.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "storage/graph_seal.h"
#include "storage/store.h"
#include "tdstore/tdstore.h"
#include "tests/catalog_record.h"
#include "tests/kill_harness.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

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

// Runs the CLI with arguments (shell-quoted by the caller), optionally through a prefix such
// as setpriv, capturing stdout, stderr and the exit code.
CliRun cli(const std::string& args, const std::string& via = "") {
  const char* bin = std::getenv("TDSTORE_CLI");
  std::string exe = bin ? bin : "tdstore";
  static TempDir io;
  std::string cmd =
      via + " " + exe + " " + args + " >" + (io / "out").string() + " 2>" + (io / "err").string();
  int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128, slurp(io / "out"), slurp(io / "err")};
}

std::string q(const std::filesystem::path& p) { return "'" + p.string() + "'"; }

// A store with nested keys, images, a NaN, an attribute, a lazy property and a compiled graph.
std::filesystem::path make_store(const TempDir& t, const std::string& name = "s") {
  auto dir = t / name;
  auto td = TensorDict::create(dir, {6});
  td.set("images", at::randint(0, 256, {6, 28, 28}, at::kByte));
  td.set("labels", at::arange(6, at::kLong));
  td.set("next/obs", at::arange(18, at::kFloat).reshape({6, 3}));
  at::Tensor withnan = at::arange(6, at::kDouble);
  withnan[1] = NAN;
  withnan[2] = INFINITY;
  td.set("next/reward", withnan);
  td.set_attr("source", "cli test");
  td.commit();
  td.get_or_compute("features/norm", {"next/obs"},
                    [](const TensorDict& d) { return d.get("next/obs") / 17; });
  auto f = compile("double_obs", [](TensorDict& d) { return d.get("next/obs") * 2; });
  f(td);
  return dir;
}

TEST(Cli, InfoJson) {
  TempDir t;
  auto dir = make_store(t);
  CliRun r = cli("info --json " + q(dir));
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["format_version"], 4);
  EXPECT_EQ(j["keys"], 5);
  EXPECT_EQ(j["key_capacity"], 4096);
  EXPECT_EQ(j["batch_size"], json::array({6}));
  EXPECT_EQ(j["generation"], 2);
  EXPECT_EQ(j["attributes"], 1);
  EXPECT_EQ(j["lazy_properties"], 1);
  EXPECT_EQ(j["compiled_graphs"], 1);
  EXPECT_GT(j["arena_bytes_used"].get<int64_t>(), 0);
  EXPECT_NE(cli("info " + q(dir)).out.find("generation       2"), std::string::npos);
}

TEST(Cli, LsTreeFlatAndJson) {
  TempDir t;
  auto dir = make_store(t);
  CliRun r = cli("ls " + q(dir));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("next/\n  obs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[lazy]"), std::string::npos) << r.out;
  r = cli("ls --flat --verify " + q(dir) + " next");
  EXPECT_NE(r.out.find("next/reward"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("images"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" ok"), std::string::npos) << r.out;
  json j = json::parse(cli("ls --json " + q(dir)).out);
  ASSERT_EQ(j.size(), 5u);
  std::map<std::string, json> by_key;
  for (const auto& row : j) by_key[row["key"]] = row;
  EXPECT_EQ(by_key["images"]["dtype"], "uint8");
  EXPECT_EQ(by_key["images"]["shape"], json::array({6, 28, 28}));
  EXPECT_EQ(by_key["images"]["bytes"], 6 * 28 * 28);
  EXPECT_EQ(by_key["features/norm"]["flags"], json::array({"lazy"}));
  EXPECT_EQ(by_key["labels"]["flags"], json::array());
}

TEST(Cli, ShowValuesPngAndDrawing) {
  TempDir t;
  auto dir = make_store(t);
  CliRun r = cli("show " + q(dir) + " next/obs --rows 1:3");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("[[3, 4, 5],\n [6, 7, 8]]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[ float32 [2, 3] ]"), std::string::npos) << r.out;
  json j = json::parse(cli("show --json " + q(dir) + " labels --rows 2:4").out);
  EXPECT_EQ(j["values"], json::array({2.0, 3.0}));
  r = cli("show " + q(dir) + " images");  // large: summarized
  EXPECT_NE(r.out.find("..."), std::string::npos);
  EXPECT_LT(r.out.size(), 4000u);
  auto png = t / "grid.png";
  r = cli("show " + q(dir) + " images --rows 0:3 --png " + q(png));
  ASSERT_EQ(r.code, 0) << r.err;
  std::string bytes = slurp(png);
  ASSERT_GT(bytes.size(), 33u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(bytes.substr(12, 4), "IHDR");
  auto be32 = [&](size_t o) {
    return (uint32_t(uint8_t(bytes[o])) << 24) | (uint32_t(uint8_t(bytes[o + 1])) << 16) |
           (uint32_t(uint8_t(bytes[o + 2])) << 8) | uint32_t(uint8_t(bytes[o + 3]));
  };
  EXPECT_EQ(be32(16), 3u * 28 + 2) << "three images side by side with 1-pixel gaps";
  EXPECT_EQ(be32(20), 28u);
  r = cli("show " + q(dir) + " images --rows 0:1 --draw");
  EXPECT_NE(r.out.find("row 0:"), std::string::npos);
  r = cli("show " + q(dir) + " labels --png " + q(t / "x.png"));
  EXPECT_EQ(r.code, 6);
  EXPECT_NE(r.err.find("'labels'"), std::string::npos) << r.err;
}

TEST(Cli, StatsCountNanAndInf) {
  TempDir t;
  auto dir = make_store(t);
  json j = json::parse(cli("stats --json " + q(dir) + " next/reward next/obs").out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["nan"], 1);
  EXPECT_EQ(j[0]["inf"], 1);
  EXPECT_EQ(j[0]["min"], 0.0);
  EXPECT_EQ(j[0]["max"], 5.0);
  EXPECT_DOUBLE_EQ(j[0]["mean"].get<double>(), (0 + 3 + 4 + 5) / 4.0);
  EXPECT_EQ(j[1]["min"], 0.0);
  EXPECT_EQ(j[1]["max"], 17.0);
  auto counts = j[1]["histogram"]["counts"].get<std::vector<int64_t>>();
  EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), 18);
  CliRun r = cli("stats " + q(dir) + " next/obs --bins 4");
  EXPECT_NE(r.out.find("\u2588"), std::string::npos) << r.out;
}

TEST(Cli, VerifyNamesCorruptKeys) {
  TempDir t;
  auto dir = make_store(t);
  CliRun r = cli("verify " + q(dir));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("5 keys intact"), std::string::npos);
  // Flip a byte inside next/obs (floats 0..17): find 17.0f in the arena past its header.
  std::string arena = slurp(dir / "arena.tda");
  float v = 17.0f;
  size_t at = arena.find(std::string(reinterpret_cast<const char*>(&v), 4), 4096);
  ASSERT_NE(at, std::string::npos);
  {
    std::fstream f(dir / "arena.tda", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put('\x55');
  }
  r = cli("verify " + q(dir));
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.err.find("key 'next/obs' fails its checksum"), std::string::npos) << r.err;
  json j = json::parse(cli("verify --json " + q(dir)).out);
  EXPECT_EQ(j["corrupt"], json::array({"next/obs"}));
  EXPECT_EQ(cli("verify " + q(dir) + " labels").code, 0);
}

TEST(Cli, DuAndDiff) {
  TempDir t;
  auto a = make_store(t, "a");
  json du = json::parse(cli("du --json " + q(a)).out);
  EXPECT_EQ(du["keys"]["images"], 6 * 28 * 28);
  EXPECT_EQ(du["prefixes"]["next/"], 6 * 3 * 4 + 6 * 8);
  EXPECT_GT(du["reclaimable_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(cli("diff " + q(a) + " " + q(a)).code, 0);
  auto b = t / "b";
  std::filesystem::copy(a, b, std::filesystem::copy_options::recursive);
  {
    auto td = TensorDict::open(b, OpenMode::ReadWrite);
    td.erase("labels");
    td.set("extra", at::zeros({6}));
    td.set("next/obs", at::zeros({6, 4}));
    td.set("images", td.get("images") + 1);
    td.commit();
  }
  CliRun r = cli("diff --json " + q(a) + " " + q(b));
  EXPECT_EQ(r.code, 8);
  json j = json::parse(r.out);
  EXPECT_EQ(j["added"], json::array({"extra"}));
  EXPECT_EQ(j["removed"], json::array({"labels"}));
  ASSERT_EQ(j["spec_changed"].size(), 1u);
  EXPECT_EQ(j["spec_changed"][0]["key"], "next/obs");
  EXPECT_EQ(j["content_changed"], json::array({"images"}));
}

TEST(Cli, CacheShowsADynamicEntry) {
  TempDir t;
  auto dir = (t / "g").string();
  TensorDict::create(dir, {}).commit();
  CompileOptions o;
  o.store = dir;
  auto fn = compile(
      "rows_doubled", [](TensorDict& td) { return td.get("x") * 2; }, o);
  for (int64_t n : {5, 3}) {
    TensorDict td({n});
    td.set("x", at::ones({n, 2}));
    fn(td);
  }
  ASSERT_EQ(fn.stats().entries, 1) << fn.explain();
  CliRun c = cli("cache --json " + q(dir));
  ASSERT_EQ(c.code, 0) << c.err;
  json cache = json::parse(c.out);
  ASSERT_EQ(cache.size(), 1u) << c.out;  // the two exact records were replaced by the dynamic one
  EXPECT_EQ(cache[0]["dynamic_dim0"], true);
  EXPECT_EQ(cache[0]["reads"][0], "x float32[*,2]");
  CliRun text = cli("cache " + q(dir));
  EXPECT_NE(text.out.find("reads x float32[*,2]"), std::string::npos) << text.out;
}

TEST(Cli, LazyAndCache) {
  TempDir t;
  auto dir = make_store(t);
  CliRun l0 = cli("lazy --json " + q(dir));
  ASSERT_EQ(l0.code, 0) << l0.err;
  json lazy = json::parse(l0.out);
  ASSERT_EQ(lazy.size(), 1u);
  EXPECT_EQ(lazy[0]["key"], "features/norm");
  EXPECT_EQ(lazy[0]["valid"], true);
  EXPECT_EQ(lazy[0]["deps"][0]["key"], "next/obs");
  int listed = 0;
  for (const auto& entry : json::parse(cli("ls --flat --json " + q(dir)).out))
    if (entry["key"] == "next/obs" && ++listed) {
      EXPECT_EQ(lazy[0]["deps"][0]["xxh3"], entry["xxh3"]) << "the dep's checksum";
    }
  EXPECT_EQ(listed, 1);
  EXPECT_EQ(lazy[0]["deps"][0]["fingerprint"].get<std::string>().size(), 16u);
  CliRun inv = cli("lazy " + q(dir) + " --invalidate features/norm");
  EXPECT_EQ(inv.code, 0) << inv.err;
  CliRun l1 = cli("lazy --json " + q(dir));
  ASSERT_EQ(l1.code, 0) << l1.err;
  EXPECT_TRUE(json::parse(l1.out).empty());
  EXPECT_EQ(cli("lazy " + q(dir) + " --invalidate labels").code, 6);
  CliRun c0 = cli("cache --json " + q(dir));
  ASSERT_EQ(c0.code, 0) << c0.err;
  json cache = json::parse(c0.out);
  ASSERT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache[0]["function"], "double_obs");
  EXPECT_EQ(cache[0]["torch_version"], "1.13.0");
  EXPECT_EQ(cache[0]["reads"][0], "next/obs float32[6,3]");
  EXPECT_EQ(cache[0]["dynamic_dim0"], false);
  EXPECT_EQ(cli("cache --clear " + q(dir)).code, 0);
  EXPECT_TRUE(json::parse(cli("cache --json " + q(dir)).out).empty());
}

TEST(Cli, DamagedCacheRecordIsReportedAndCleared) {
  TempDir t;
  auto dir = make_store(t);
  CliRun c0 = cli("cache --json " + q(dir));
  ASSERT_EQ(c0.code, 0) << c0.err;
  const std::string key = json::parse(c0.out).at(0).at("key");
  testing::overwrite_catalog_record(dir, key, "junk");
  CliRun v = cli("verify --json " + q(dir));
  EXPECT_EQ(v.code, 3) << v.err;
  EXPECT_EQ(json::parse(v.out)["damaged_catalog_records"], json::array({key}));
  EXPECT_NE(v.err.find(key), std::string::npos) << v.err;
  CliRun listed = cli("cache " + q(dir));
  EXPECT_EQ(listed.code, 0) << listed.err;
  EXPECT_NE(listed.err.find(key), std::string::npos)
      << "the listing warns about it: " << listed.err;
  EXPECT_EQ(cli("cache --clear " + q(dir)).code, 0);
  EXPECT_EQ(cli("verify " + q(dir)).code, 0);
  EXPECT_EQ(cli("info " + q(dir)).code, 0);
}

// tdstore/trust.h from the shell: who signed each graph, signing records from before sealing,
// this user's keys and graph cache, and a new team key.
TEST(Cli, CacheShowsWhoSignedEachGraphAndKeyShowsTheKeys) {
  TempDir t;
  auto dir = make_store(t);
  CliRun k = cli("key --json");
  ASSERT_EQ(k.code, 0) << k.err;
  json keys = json::parse(k.out);
  const std::string mine = keys["keys"].at(0)["id"];
  EXPECT_EQ(keys["keys"][0]["signs"], true);
  EXPECT_EQ(mine.size(), 16u);
  CliRun c0 = cli("cache --json " + q(dir));
  ASSERT_EQ(c0.code, 0) << c0.err;
  json cache = json::parse(c0.out);
  ASSERT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache[0]["trust"], "trusted");
  EXPECT_EQ(cache[0]["signer"], mine);
  EXPECT_NE(cli("cache " + q(dir)).out.find("trusted (key " + mine + ")"), std::string::npos);

  // A record as builds before sealing wrote it: unsigned until the user signs it.
  const std::string key = cache[0]["key"];
  {
    auto s = storage::Store::open(dir, OpenMode::ReadOnly, {});
    auto value = s->scan_cache(key).at(0).second;
    s->put_cache(key, value.substr(storage::kSealBytes));
  }
  EXPECT_EQ(json::parse(cli("cache --json " + q(dir)).out)[0]["trust"], "unsigned");
  CliRun signed_run = cli("cache --sign " + q(dir));
  EXPECT_EQ(signed_run.code, 0) << signed_run.err;
  EXPECT_NE(signed_run.out.find("signed 1 unsigned"), std::string::npos) << signed_run.out;
  EXPECT_EQ(json::parse(cli("cache --json " + q(dir)).out)[0]["trust"], "trusted");
  EXPECT_TRUE(TensorDict::open(dir).verify().empty());

  CliRun user = cli("cache --user --json");
  EXPECT_EQ(user.code, 0) << user.err;
  EXPECT_NE(cli("cache").code, 0);
  EXPECT_NE(cli("cache --user " + q(dir)).code, 0);
  EXPECT_NE(cli("cache --sign --clear " + q(dir)).code, 0);

  CliRun team = cli("key --new " + q(t / "team.key"));
  EXPECT_EQ(team.code, 0) << team.err;
  struct stat st;
  ASSERT_EQ(::stat((t / "team.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  CliRun again = cli("key --new " + q(t / "team.key"));
  EXPECT_NE(again.code, 0);
  EXPECT_NE(again.err.find("never overwritten"), std::string::npos) << again.err;
}

TEST(Cli, RaggedKeysListOnce) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "r", {3});
    td.set_ragged("tokens", {at::ones({1}), at::ones({3}), at::ones({2})});
    td.commit();
  }
  json j = json::parse(cli("ls --json " + q(t / "r")).out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["key"], "tokens");
  EXPECT_EQ(j[0]["flags"], json::array({"ragged"}));
  CliRun r = cli("verify " + q(t / "r"));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 keys intact"), std::string::npos) << "values and offsets: " << r.out;
  EXPECT_EQ(json::parse(cli("du --json " + q(t / "r")).out)["keys"]["tokens"], 6 * 4 + 4 * 8);
}

TEST(Cli, ImportExportRoundTrip) {
  TempDir t;
  auto dir = make_store(t);
  ASSERT_EQ(cli("export " + q(dir) + " images labels next/obs --npy " + q(t / "npy") +
                " --safetensors " + q(t / "all.safetensors"))
                .code,
            0);
  EXPECT_TRUE(std::filesystem::exists(t / "npy" / "next" / "obs.npy"));
  CliRun r = cli("import " + q(t / "from_npy") + " images=" + q(t / "npy" / "images.npy") +
                 " labels=" + q(t / "npy" / "labels.npy") +
                 " next/obs=" + q(t / "npy" / "next" / "obs.npy"));
  ASSERT_EQ(r.code, 0) << r.err;
  r = cli("import " + q(t / "from_st") + " " + q(t / "all.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  // Same keys, specs and checksums as the source's.
  for (auto other : {t / "from_npy", t / "from_st"}) {
    json d = json::parse(cli("diff --json " + q(other) + " " + q(dir)).out);
    EXPECT_TRUE(d["added"].size() == 2 && d["removed"].empty() && d["spec_changed"].empty() &&
                d["content_changed"].empty())
        << d.dump();
  }
  r = cli("import --append " + q(t / "from_st") + " " + q(t / "all.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(cli("info --json " + q(t / "from_st")).out)["batch_size"],
            json::array({12}));
  r = cli("import " + q(t / "bad") + " x=" + q(dir / "keys.tdd"));
  EXPECT_EQ(r.code, 2) << "not an IDX file: " << r.err;
}

TEST(Cli, ErrorsAndExitCodes) {
  TempDir t;
  CliRun r = cli("info " + q(t / "missing"));
  EXPECT_EQ(r.code, 5);
  EXPECT_NE(r.err.find((t / "missing").string()), std::string::npos);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  std::filesystem::create_directories(t / "plain");
  EXPECT_EQ(cli("ls " + q(t / "plain")).code, 2);
  EXPECT_EQ(cli("frobnicate").code, 1);
  EXPECT_EQ(cli("info").code, 1);
  EXPECT_EQ(cli("--help").code, 0);
  auto dir = make_store(t);
  auto writer = TensorDict::open(dir, OpenMode::ReadWrite);
  writer.set("staged", at::zeros({6}));  // a writer is active: readers see the last commit
  r = cli("ls --flat " + q(dir));
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out.find("staged"), std::string::npos);
  r = cli("compact " + q(dir));
  EXPECT_EQ(r.code, 4);
  EXPECT_NE(r.err.find("another writer"), std::string::npos) << r.err;
}

TEST(Cli, ReadOnlyFiles) {
  TempDir t;
  auto dir = make_store(t);
  std::system(("chmod -R a-w " + q(dir) + " && chmod a+rx " + q(t.path())).c_str());
  // As root permissions do not bind, so read as an unprivileged user.
  std::string via = geteuid() == 0 ? "setpriv --reuid=65534 --regid=65534 --clear-groups" : "";
  CliRun r = cli("ls --flat " + q(dir), via);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("next/obs"), std::string::npos);
  EXPECT_EQ(cli("verify " + q(dir), via).code, 0);
  EXPECT_EQ(cli("info --json " + q(dir), via).code, 0);
  std::system(("chmod -R u+w " + q(dir)).c_str());
}

TEST(Cli, CompactKilledMidwayLosesNothing) {
  TempDir t;
  auto dir = t / "big";
  {
    auto td = TensorDict::create(dir, {});
    for (int round = 0; round < 2; ++round) {
      for (int k = 0; k < 48; ++k)
        td.set("k" + std::to_string(k), at::full({1 << 19}, static_cast<float>(k + round)));
      td.commit();
    }
  }
  json before = json::parse(cli("ls --json " + q(dir)).out);
  const int64_t arena_before =
      json::parse(cli("info --json " + q(dir)).out)["arena_bytes_used"].get<int64_t>();
  // Each compaction is killed after its k-th progress line (one per key copied, 48 in all; k = 48
  // lands in its commit, exchange or clean-up), until 8 kills landed before it exited. The kill
  // lands wherever the compaction got to, up to after its exit (then it succeeded): every
  // landing leaves a store that verifies with the same contents, which is all that is asserted.
  std::mt19937 rng(3);
  const char* bin = std::getenv("TDSTORE_CLI");
  auto progress_line = [](std::string_view line) -> std::optional<testing::Event> {
    if (line.rfind("compact: ", 0) != 0) return std::nullopt;
    return testing::Event{"begin", std::atoll(std::string(line.substr(9)).c_str())};
  };
  testing::KillRounds rounds(8, 40);
  while (rounds.more()) {
    testing::Child c = testing::Child::program(
        {bin ? bin : "tdstore", "compact", "--progress", dir.string()}, progress_line);
    const testing::Killed k =
        c.wait_for("begin", 1 + static_cast<int>(rng() % 48)) ? c.kill() : testing::Killed{};
    ASSERT_NE(k.code, 127) << "the CLI never ran";
    if (!k.signaled) {
      EXPECT_EQ(k.code, 0) << "the compaction exited by itself: it succeeded";
    }
    rounds.count(k);
    CliRun r = cli("verify " + q(dir));
    ASSERT_EQ(r.code, 0) << "after kill " << rounds.rounds() << ": " << r.err;
    json after = json::parse(cli("ls --json " + q(dir)).out);
    ASSERT_EQ(after.size(), before.size());
    for (size_t k = 0; k < after.size(); ++k) {
      EXPECT_EQ(after[k]["key"], before[k]["key"]);
      EXPECT_EQ(after[k]["xxh3"], before[k]["xxh3"]) << "content changed by a killed compaction";
    }
  }
  std::cerr << rounds.landings() << "\n";
  CliRun r = cli("compact --json " + q(dir));
  ASSERT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["keys"], 48);
  // Whichever compaction got through its exchange reclaimed the replaced round.
  EXPECT_LT(j["arena_bytes_after"].get<int64_t>(), arena_before);
  EXPECT_LE(j["arena_bytes_after"].get<int64_t>(), 48 * (2 << 20) + (8 << 20))
      << "48 tensors of 2 MiB";
  std::error_code ec;
  int siblings = 0;
  for (const auto& e : std::filesystem::directory_iterator(t.path(), ec))
    siblings += e.path().filename().string().rfind("big.compact.", 0) == 0;
  EXPECT_EQ(siblings, 0) << "leftovers of killed compactions are removed";
}

TEST(Cli, CompactRebuildsTheKeyDirectoryWithANewCapacity) {
  TempDir t;
  auto dir = make_store(t);
  CliRun r = cli("compact --key-capacity 1 " + q(dir));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("live keys"), std::string::npos) << r.err;
  r = cli("compact --key-capacity 5000 --json " + q(dir));
  ASSERT_EQ(r.code, 0) << r.err;
  r = cli("info --json " + q(dir));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out)["key_capacity"], 5000);
  EXPECT_EQ(cli("verify " + q(dir)).code, 0);
}

// The CLI answers from bytes: no libtorch in the binary, so it starts in milliseconds.
TEST(Cli, TheBinaryLinksNoLibtorch) {
  const char* bin = std::getenv("TDSTORE_CLI");
  ASSERT_NE(bin, nullptr) << "TDSTORE_CLI names the binary under test";
  FILE* p = popen(("ldd '" + std::string(bin) + "' 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  for (char buf[512]; fgets(buf, sizeof buf, p);) out += buf;
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("libtdstore_storage"), std::string::npos) << out;
  EXPECT_EQ(out.find("libtorch"), std::string::npos) << out;
  EXPECT_EQ(out.find("libc10"), std::string::npos) << out;
  EXPECT_EQ(out.find("not found"), std::string::npos) << out;
}

// Every stored dtype through show and stats, against what libtorch computes.
TEST(Cli, ShowAndStatsReadEveryDtype) {
  TempDir t;
  auto dir = t / "d";
  at::Tensor base = at::arange(-6, 6, at::kDouble) / 4;  // exact in float16 and bfloat16
  base[11] = NAN;
  {
    auto td = TensorDict::create(dir, {12});
    for (auto type :
         {at::kBool, at::kByte, at::kChar, at::kShort, at::kInt, at::kLong, at::kHalf,
          at::kBFloat16, at::kFloat, at::kDouble, at::kComplexFloat, at::kComplexDouble})
      td.set(std::string("t/") + c10::toString(type),
             (type == at::kBool ? base > 0 : base).to(type));
    td.commit();
  }
  json stats = json::parse(cli("stats --json " + q(dir)).out);
  ASSERT_EQ(stats.size(), 12u);
  auto td = TensorDict::open(dir);
  for (const auto& s : stats) {
    at::Tensor x = td.get(s["key"].get<std::string>());
    if (x.is_complex()) x = x.abs();
    x = x.to(at::kDouble);
    at::Tensor finite = x.masked_select(x.isfinite());
    SCOPED_TRACE(s.dump());
    EXPECT_EQ(s["numel"], 12);
    EXPECT_EQ(s["nan"], x.isnan().sum().item<int64_t>());
    EXPECT_DOUBLE_EQ(s["min"].get<double>(), finite.min().item<double>());
    EXPECT_DOUBLE_EQ(s["max"].get<double>(), finite.max().item<double>());
    EXPECT_NEAR(s["mean"].get<double>(), finite.mean().item<double>(), 1e-12);
    EXPECT_NEAR(s["std"].get<double>(), finite.std().item<double>(), 1e-12);
  }
  CliRun r = cli("show " + q(dir) + " t/Half --rows 0:3");
  EXPECT_NE(r.out.find("[-1.5, -1.25, -1]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[ float16 [3] ]"), std::string::npos) << r.out;
  r = cli("show " + q(dir) + " t/BFloat16 --rows 11:");
  EXPECT_NE(r.out.find("[nan]"), std::string::npos) << r.out;
  r = cli("show " + q(dir) + " t/ComplexFloat --rows 1:2");
  EXPECT_NE(r.out.find("[-1.25+0j]"), std::string::npos) << r.out;
  r = cli("show " + q(dir) + " t/Bool --rows 6:8");
  EXPECT_NE(r.out.find("[False, True]"), std::string::npos) << r.out;
  EXPECT_EQ(json::parse(cli("show --json " + q(dir) + " t/Short --rows 0:2").out)["values"],
            json::array({-1.0, -1.0}));
}

TEST(Cli, ShowPadsARaggedKeyAsGetDoes) {
  TempDir t;
  {
    auto td = TensorDict::create(t / "r", {3});
    td.set_ragged("tokens", {at::full({1}, 1.0), at::full({3}, 2.0), at::full({2}, 3.0)});
    td.commit();
  }
  json j = json::parse(cli("show --json " + q(t / "r") + " tokens").out);
  EXPECT_EQ(j["shape"], json::array({3, 3}));
  EXPECT_EQ(j["values"], json::parse("[[1, 0, 0], [2, 2, 2], [3, 3, 0]]"));
  CliRun r = cli("export " + q(t / "r") + " --npy " + q(t / "npy"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(
      at::equal(read_npy(t / "npy" / "tokens.npy"), TensorDict::open(t / "r").get("tokens")));
}

// Malformed input files are usage errors (exit 2) naming the file and the field, never a raw
// JSON or libtorch message, and the store is left as it was.
TEST(Cli, ImportNamesTheFileAndTheFieldOfBadInput) {
  TempDir t;
  auto dir = make_store(t);
  auto before = json::parse(cli("ls --json " + q(dir)).out);
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(t / name, std::ios::binary) << bytes;
    return q(t / name);
  };
  auto safetensors = [](const std::string& header) {
    uint64_t n = header.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + header + std::string(16, '\0');
  };
  auto npy = [](const std::string& dict) {
    std::string h = dict;
    h.append((10 + h.size() + 1 + 63) / 64 * 64 - 10 - h.size() - 1, ' ');
    h += '\n';
    return std::string("\x93NUMPY\x01\x00", 8) + char(h.size()) + '\0' + h + std::string(16, '\0');
  };
  struct Case {
    std::string file, field;
  } cases[] = {
      {write("nodtype.safetensors", safetensors(R"({"x":{"shape":[2],"data_offsets":[0,16]}})")),
       "dtype"},
      {write("neg.safetensors",
             safetensors(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,16]}})")),
       "shape"},
      {write("past.safetensors",
             safetensors(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,4096]}})")),
       "data_offsets"},
      {"x=" + write("neg.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }")),
       "shape"},
      {"x=" + write("huge.npy",
                    npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }")),
       "truncated"},
  };
  for (const auto& c : cases) {
    CliRun r = cli("import " + q(dir) + " " + c.file);
    EXPECT_EQ(r.code, 2) << c.file << ": " << r.err;
    EXPECT_NE(r.err.find((t / "").string()), std::string::npos) << "names the file: " << r.err;
    EXPECT_NE(r.err.find(c.field), std::string::npos) << "names the field: " << r.err;
    EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("Trying to create tensor"), std::string::npos)
        << "a libtorch message: " << r.err;
  }
  EXPECT_EQ(json::parse(cli("ls --json " + q(dir)).out), before) << "nothing committed was touched";
  CliRun r = cli("show " + q(dir) + " labels --rows 1:x");
  EXPECT_EQ(r.code, 6);
  EXPECT_NE(r.err.find("--rows '1:x'"), std::string::npos) << r.err;
}

// info, ls, verify and du take a dataset directory and report per shard and in total.
TEST(Cli, DatasetDirectoriesAreReportedPerShard) {
  TempDir t;
  auto dir = t / "ds";
  {
    Dataset ds = Dataset::create(dir);
    for (int s = 0; s < 3; ++s) {
      TensorDict rows({4 + s});
      rows.set("x", at::full({4 + s, 2}, static_cast<float>(s)));
      rows.set("y", at::arange(4 + s, at::kLong));
      TensorDict shard = ds.shard(s);
      shard.append(rows);
      shard.commit();
    }
    ds.publish();
    TensorDict late = ds.shard(0);  // committed, not published
    TensorDict more({1});
    more.set("x", at::zeros({1, 2}));
    more.set("y", at::zeros({1}, at::kLong));
    late.append(more);
    late.commit();
  }
  CliRun r = cli("info --json " + q(dir));
  ASSERT_EQ(r.code, 0) << r.err;
  json info = json::parse(r.out);
  EXPECT_EQ(info["dataset"], true);
  EXPECT_EQ(info["rows"], 4 + 5 + 6);
  ASSERT_EQ(info["shards"].size(), 3u);
  EXPECT_EQ(info["shards"][0]["rows"], 4);
  EXPECT_EQ(info["shards"][0]["committed_rows"], 5);
  EXPECT_NE(cli("info " + q(dir)).out.find("15 published in 3 shard(s)"), std::string::npos);
  json ls = json::parse(cli("ls --json " + q(dir)).out);
  ASSERT_EQ(ls.size(), 2u);
  EXPECT_EQ(ls[0]["key"], "x");
  EXPECT_EQ(ls[0]["shape"], json::array({15, 2}));
  EXPECT_EQ(ls[0]["shards"], 3);
  EXPECT_EQ(json::parse(cli("du --json " + q(dir)).out)["shards"].size(), 3u);
  r = cli("verify " + q(dir));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("3 shard(s) and the manifest intact"), std::string::npos) << r.out;
  EXPECT_TRUE(json::parse(cli("info --json " + q(dir)).out)["features"].is_null());
  {
    Loader loader(Dataset::open(dir), {});
    loader.add_feature(
        {"x_sum", {"x"}, [](const TensorDict& rows) { return rows.get("x").sum(1); }, "v1"});
    for (TensorDict batch : loader) (void)batch;  // the epoch's end stores the feature
  }
  info = json::parse(cli("info --json " + q(dir)).out);
  EXPECT_EQ(info["features"]["keys"], 2) << "the feature and its done-rows mask: " << info.dump();
  json du = json::parse(cli("du --json " + q(dir)).out);
  EXPECT_GT(du["features"]["tensor_bytes"].get<uint64_t>(), 15u * 4);
  r = cli("verify " + q(dir));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("3 shard(s), the manifest and the row features intact"), std::string::npos)
      << r.out;
  // Flip a byte of shard 1's x.
  uint64_t offset = StoreReader::open(dir / "shards" / "00001").find("x")->offset;
  {
    std::fstream f(dir / "shards" / "00001" / "arena.tda",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put('\x55');
  }
  r = cli("verify " + q(dir));
  EXPECT_EQ(r.code, 3);
  EXPECT_NE(r.err.find("shard 00001: key 'x' fails its checksum"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tdstore
