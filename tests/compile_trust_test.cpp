// The compile cache's trust boundary (tdstore/trust.h; docs/DESIGN.md, "Trust"): a stored graph
// runs only when sealed under a key this user holds, and is refused before any of it is parsed
// otherwise; graphs a store cannot hold go to this user's graph cache and are loaded from it.
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <string>

#include "storage/graph_cache.h"
#include "storage/graph_record.h"
#include "storage/graph_seal.h"
#include "storage/keyring.h"
#include "storage/store.h"
#include "tdstore/tdstore.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace compile_trust_test {
using testing::TempDir;

at::Tensor times_three(TensorDict& d) { return d.get("x") * 3; }

storage::Key other_key() {
  storage::Key k;
  for (size_t i = 0; i < 32; ++i) k.secret[i] = static_cast<uint8_t>(0xa0 + i);
  k.id = storage::key_id(k.secret);
  return k;
}

struct Outcome {
  CompileStats stats;
  std::string explain;
  bool right = false;
};

// Removes the graphs of `name` from this user's graph cache, where a read-only store's graphs
// go: an earlier run of the suite leaves them there, and a test expecting a first compile would
// load them instead.
void forget_user_graphs(const std::string& name) {
  if (storage::Store* cache = storage::user_graph_cache(nullptr))
    for (auto& [k, v] : cache->scan_cache("graph/" + name + "/")) cache->put_cache(k, std::nullopt);
}

// A fresh compiled function (it reads the stores anew) called once on the store at dir.
Outcome run(const std::filesystem::path& dir, const std::string& name) {
  auto td = TensorDict::open(dir, OpenMode::ReadOnly);
  auto f = compile(name, times_three);
  Outcome r;
  r.right = at::equal(f(td), td.get("x") * 3);
  r.stats = f.stats();
  r.explain = f.explain();
  return r;
}

// The one record of `name` in the store: its key and value.
std::pair<std::string, std::string> record_of(const std::filesystem::path& dir,
                                              const std::string& name) {
  auto s = storage::Store::open(dir, OpenMode::ReadOnly, {});
  auto records = s->scan_cache("graph/" + name + "/");
  EXPECT_EQ(records.size(), 1u);
  return records.empty() ? std::pair<std::string, std::string>{} : records[0];
}

void put(const std::filesystem::path& dir, const std::string& key, const std::string& value) {
  storage::Store::open(dir, OpenMode::ReadOnly, {})->put_cache(key, value);
}

std::filesystem::path make_store(const TempDir& t) {
  auto td = TensorDict::create(t / "s", {4});
  td.set("x", at::ones({4}));
  td.commit();
  return t / "s";
}

TEST(CompileTrust, AGraphSealedUnderAKeyThisUserDoesNotHoldIsNeverLoaded) {
  TempDir t;
  auto dir = make_store(t);
  forget_user_graphs("foreign");
  Outcome first = run(dir, "foreign");
  ASSERT_EQ(first.stats.compiles, 1) << first.explain;
  EXPECT_EQ(run(dir, "foreign").stats.loads, 1);  // this user's own graph is loaded
  // The same graph, sealed by someone else (a crafted one would look no different).
  auto [key, value] = record_of(dir, "foreign");
  auto u = storage::unseal(value, key, storage::Keyring::process());
  ASSERT_EQ(u.status, storage::SealStatus::Trusted);
  const std::string theirs = storage::seal(other_key(), key, std::string(u.record), 1);
  put(dir, key, theirs);

  Outcome second = run(dir, "foreign");
  EXPECT_TRUE(second.right);
  EXPECT_EQ(second.stats.loads, 0) << second.explain;
  EXPECT_EQ(second.stats.compiles, 1) << second.explain;
  EXPECT_NE(
      second.explain.find("signed by key " + other_key().id + ", which this user does not trust"),
      std::string::npos)
      << second.explain;
  // The other signer's record stays; this user's trace went to the user's graph cache.
  EXPECT_EQ(record_of(dir, "foreign").second, theirs);
  EXPECT_NE(second.explain.find("graph stored in this user's graph cache"), std::string::npos)
      << second.explain;

  Outcome third = run(dir, "foreign");
  EXPECT_TRUE(third.right);
  EXPECT_EQ(third.stats.loads, 1) << third.explain;
  EXPECT_EQ(third.stats.compiles, 0) << third.explain;
  std::string why;
  EXPECT_NE(third.explain.find(storage::user_graph_cache(&why)->path().string()), std::string::npos)
      << third.explain;
  // tdstore cache lists who signed what.
  auto graphs = StoreReader::open(dir).graphs("foreign");
  ASSERT_EQ(graphs.size(), 1u);
  EXPECT_EQ(graphs[0].trust, "foreign");
  EXPECT_EQ(graphs[0].signer, other_key().id);
}

// An altered record (its catalog checksums redone: the catalog stores it as any other value) is
// refused by its MAC before a byte of it is decompressed or parsed: garbage in place of the
// record is reported as altered, never as a damaged frame or JSON.
TEST(CompileTrust, AnAlteredRecordIsRefusedBeforeItIsParsed) {
  TempDir t;
  auto dir = make_store(t);
  forget_user_graphs("altered_bytes");
  ASSERT_EQ(run(dir, "altered_bytes").stats.compiles, 1);
  auto [key, value] = record_of(dir, "altered_bytes");
  std::string flipped = value;
  flipped[flipped.size() / 2] ^= 1;
  std::string garbage = value.substr(0, storage::kSealBytes) + std::string(200, '\xff');
  for (const auto& bad : {flipped, garbage}) {
    put(dir, key, bad);
    Outcome r = run(dir, "altered_bytes");
    EXPECT_TRUE(r.right);
    EXPECT_EQ(r.stats.loads, 0) << r.explain;
    EXPECT_NE(r.explain.find("altered: its MAC under trusted key"), std::string::npos) << r.explain;
    EXPECT_EQ(r.explain.find("zstd"), std::string::npos) << r.explain;
    EXPECT_EQ(r.explain.find("JSON"), std::string::npos) << r.explain;
    // The trace replaced it with a sound record of this user's.
    EXPECT_EQ(run(dir, "altered_bytes").stats.loads, 1);
  }
}

TEST(CompileTrust, AnUnsignedRecordRunsOnlyOnceTheUserSignsIt) {
  TempDir t;
  auto dir = make_store(t);
  forget_user_graphs("legacy");
  ASSERT_EQ(run(dir, "legacy").stats.compiles, 1);
  auto [key, value] = record_of(dir, "legacy");
  const std::string unsigned_record(
      storage::unseal(value, key, storage::Keyring::process()).record);
  put(dir, key, unsigned_record);  // as builds before sealing wrote it

  Outcome r = run(dir, "legacy");
  EXPECT_EQ(r.stats.loads, 0) << r.explain;
  EXPECT_NE(r.explain.find("unsigned"), std::string::npos) << r.explain;
  EXPECT_EQ(run(dir, "legacy").stats.loads, 1);  // replaced by a sealed trace

  put(dir, key, unsigned_record);
  SignResult s = sign_graphs(dir, "legacy");
  EXPECT_EQ(s.signed_records, 1u);
  Outcome signed_run = run(dir, "legacy");
  EXPECT_EQ(signed_run.stats.loads, 1) << signed_run.explain;
  EXPECT_EQ(signed_run.stats.compiles, 0);
  EXPECT_TRUE(signed_run.right);
}

// CompileOptions::store = user_graph_cache(): an in-memory dict's graphs persist per user.
TEST(CompileTrust, AFunctionMayKeepItsGraphsInTheUsersGraphCache) {
  CompileOptions o;
  o.store = user_graph_cache();
  EXPECT_EQ(*o.store, keyring_info().graph_cache);
  auto fn = [](TensorDict& d) { return d.get("x").exp() - 1; };
  TensorDict td({5});
  td.set("x", at::ones({5}));
  forget_user_graphs("in_user_cache");
  auto first = compile("in_user_cache", fn, o);
  first(td);
  EXPECT_EQ(first.stats().compiles, 1);
  auto second = compile("in_user_cache", fn, o);
  EXPECT_TRUE(at::equal(second(td), fn(td)));
  EXPECT_EQ(second.stats().loads, 1) << second.explain();
  EXPECT_EQ(second.stats().compiles, 0);
}

}  // namespace compile_trust_test
}  // namespace tdstore
