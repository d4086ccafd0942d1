// tdstore/trust.h at the storage layer: key files (storage/keyring.h), sealed graph records
// (storage/graph_seal.h), and where records go (storage/graph_cache.h), including this user's
// bounded graph cache under concurrent writers and a kill.
#include "tdstore/trust.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "storage/graph_cache.h"
#include "storage/graph_record.h"
#include "storage/graph_seal.h"
#include "storage/keyring.h"
#include "storage/store.h"
#include "tdstore/admin.h"
#include "tdstore/errors.h"
#include "tests/child_process.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {
namespace fs = std::filesystem;
using storage::Key;
using storage::Keyring;
using storage::SealStatus;
using testing::TempDir;

Key key_of(uint8_t first) {
  Key k;
  for (size_t i = 0; i < 32; ++i) k.secret[i] = static_cast<uint8_t>(first + i);
  k.id = storage::key_id(k.secret);
  return k;
}

// A record whose meta parses as CompiledFunction writes it (docs/FORMAT.md, "Compiled graphs").
std::string a_record(const std::string& archive) {
  auto meta = nlohmann::json::parse(R"json({"prefix": "", "observations": [
      {"read": "get", "key": "x", "spec": {"dtype": "float32", "sizes": [3],
       "strides": [1], "device": "cpu", "requires_grad": false}}],
    "inputs": [], "grad_mode": true,
    "effects": {"erases": [], "writes": [], "lazy_writes": [], "lazy_reuses": 0,
                "returns": true}})json");
  return storage::encode_graph_record(meta, archive);
}

Keyring ring(std::initializer_list<Key> keys) {
  Keyring r;
  for (const auto& k : keys) r.trusted.push_back(k);
  return r;
}

// Sets an environment variable for the scope.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old)
      ::setenv(name.c_str(), old->c_str(), 1);
    else
      ::unsetenv(name.c_str());
  }
};

mode_t mode_of(const fs::path& p) {
  struct stat st;
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_mode & 0777;
}

TEST(Trust, HmacAndKeyIdsAreTheStandardOnes) {
  // Python: hmac.new(bytes(range(32)), b"abc", hashlib.sha256).hexdigest()
  Key k = key_of(0);
  auto mac = storage::hmac_sha256(k.secret, {"a", "", "bc"});
  std::string hex;
  static const char* d = "0123456789abcdef";
  for (uint8_t b : mac) hex += {d[b >> 4], d[b & 15]};
  EXPECT_EQ(hex, "f0133729c4163dede81e21cd47839256da58171238c8a0d874397c73b14e1e47");
  EXPECT_EQ(k.id, "8384274df1f78929");
}

TEST(Trust, ASealedRecordIsTrustedOnlyUnderItsKeyAndUnaltered) {
  Key mine = key_of(1), other = key_of(100);
  const std::string key = "graph/f/c0de/1.13.0/0123456789abcdef";
  const std::string record = a_record("archive bytes");
  const std::string value = storage::seal(mine, key, record, 42);
  auto u = storage::unseal(value, key, ring({mine}));
  EXPECT_EQ(u.status, SealStatus::Trusted);
  EXPECT_EQ(u.signer, mine.id);
  EXPECT_EQ(u.written_ns, 42u);
  EXPECT_EQ(u.record, record);
  EXPECT_EQ(storage::unseal(value, key, ring({other})).status, SealStatus::Foreign);
  EXPECT_EQ(storage::unseal(value, key, Keyring{}).status, SealStatus::Foreign);
  // Every byte counts: the seal's head, its MAC, the record; and the key it is stored under.
  for (size_t i = 0; i < value.size(); ++i) {
    std::string altered = value;
    altered[i] ^= 0x20;
    auto a = storage::unseal(altered, key, ring({mine}));
    EXPECT_NE(a.status, SealStatus::Trusted) << "byte " << i;
  }
  EXPECT_EQ(storage::unseal(value, "graph/f/c0de/1.13.0/0123456789abcdee", ring({mine})).status,
            SealStatus::Altered);
  EXPECT_EQ(storage::unseal(value.substr(0, 30), key, ring({mine})).status, SealStatus::Altered);
  EXPECT_EQ(storage::unseal(value + "x", key, ring({mine})).status, SealStatus::Altered);
  // A record from before sealing is unsigned, and never trusted.
  auto legacy = storage::unseal(record, key, ring({mine}));
  EXPECT_EQ(legacy.status, SealStatus::Unsigned);
  EXPECT_EQ(legacy.record, record);
}

// Whose record a write may replace or remove: this user's (unsigned, or sealed under the
// signing key, intact or not), never a teammate's trusted one nor a stranger's.
TEST(Trust, OnlyThisUsersOwnRecordsAreReplaceable) {
  Key mine = key_of(1), team = key_of(50), stranger = key_of(100);
  Keyring keys;
  keys.signing = mine;
  keys.trusted.push_back(team);
  const std::string key = "graph/f/c/1/00";
  const std::string record = a_record("r");
  auto status_of = [&](const std::string& v) { return storage::unseal(v, key, keys); };
  std::string altered = storage::seal(mine, key, record, 1);
  altered.back() ^= 1;
  EXPECT_TRUE(storage::replaceable(status_of(record), keys));
  EXPECT_TRUE(storage::replaceable(status_of(storage::seal(mine, key, record, 1)), keys));
  EXPECT_TRUE(storage::replaceable(status_of(altered), keys));
  EXPECT_EQ(status_of(storage::seal(team, key, record, 1)).status, SealStatus::Trusted);
  EXPECT_FALSE(storage::replaceable(status_of(storage::seal(team, key, record, 1)), keys));
  EXPECT_FALSE(storage::replaceable(status_of(storage::seal(stranger, key, record, 1)), keys));
  std::string newer = storage::seal(mine, key, record, 1);
  newer[4] = 2;  // a seal version this build does not know
  EXPECT_EQ(status_of(newer).status, SealStatus::Newer);
  EXPECT_FALSE(storage::replaceable(status_of(newer), keys));
  EXPECT_EQ(status_of(newer.substr(0, 6)).status, SealStatus::Newer);
  EXPECT_EQ(status_of(storage::seal(mine, key, record, 1).substr(0, 40)).status,
            SealStatus::Altered);
}

TEST(Trust, TheBudgetIsDecimalBytesOrTheDefault) {
  for (auto [text, want] :
       std::vector<std::pair<std::string, uint64_t>>{{"123", 123},
                                                     {"0", 0},
                                                     {"-1", 1u << 30},
                                                     {"1G", 1u << 30},
                                                     {"", 1u << 30},
                                                     {"99999999999999999999999", 1u << 30}}) {
    ScopedEnv budget("TDSTORE_GRAPH_CACHE_BYTES", text);
    EXPECT_EQ(storage::graph_cache_budget(), want) << text;
  }
}

// Key files that are no regular file never block or sign; a symlink to a good key (a mounted
// secret) is followed and checked.
TEST(Trust, AFifoKeyFileIsRefusedAndASymlinkedOneIsFollowed) {
  TempDir t;
  ScopedEnv config("XDG_CONFIG_HOME", (t / "config").string());
  ASSERT_EQ(::mkfifo((t / "fifo").c_str(), 0600), 0);
  {
    ScopedEnv file("TDSTORE_KEY_FILE", (t / "fifo").string());
    Keyring k = Keyring::load();  // returns: a FIFO is never read
    // The key the user named is refused, and no other key signs in its place (graphs signed by
    // the own key would not be the team's); the own key still loads.
    EXPECT_FALSE(k.signing);
    ASSERT_EQ(k.trusted.size(), 1u);
    EXPECT_EQ(k.trusted[0].path, t / "config" / "tdstore" / "key");
    ASSERT_FALSE(k.refused.empty());
    EXPECT_NE(k.refused[0].find("not a readable regular file"), std::string::npos) << k.refused[0];
  }
  const std::string id = create_key_file(t / "secret" / "team.key");
  fs::create_symlink(t / "secret" / "team.key", t / "link.key");
  ScopedEnv file("TDSTORE_KEY_FILE", (t / "link.key").string());
  Keyring k = Keyring::load();
  ASSERT_TRUE(k.signing);
  EXPECT_EQ(k.signing->id, id);
}

TEST(Trust, AUsersOwnKeyIsCreatedOnceWithMode0600) {
  TempDir t;
  ScopedEnv config("XDG_CONFIG_HOME", (t / "config").string());
  ScopedEnv cache("XDG_CACHE_HOME", (t / "cache").string());
  ScopedEnv no_file("TDSTORE_KEY_FILE", "");
  Keyring a = Keyring::load();
  ASSERT_TRUE(a.signing) << (a.refused.empty() ? "" : a.refused[0]);
  EXPECT_EQ(a.signing->path, t / "config" / "tdstore" / "key");
  EXPECT_EQ(mode_of(a.signing->path), 0600u);
  EXPECT_EQ(mode_of(t / "config" / "tdstore"), 0700u);
  EXPECT_EQ(a.cache_dir, t / "cache" / "tdstore");
  EXPECT_EQ(Keyring::load().signing->id, a.signing->id);
  // No temporary file is left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(t / "config" / "tdstore"), {}), 1);

  // A key others may read signs nothing, and the user is told why.
  ::chmod(a.signing->path.c_str(), 0644);
  Keyring b = Keyring::load();
  EXPECT_FALSE(b.signing);
  ASSERT_EQ(b.refused.size(), 1u);
  EXPECT_NE(b.refused[0].find("mode 644"), std::string::npos) << b.refused[0];
  ::chmod(a.signing->path.c_str(), 0600);

  // Not a key: refused, never replaced.
  { std::ofstream(a.signing->path) << "not a key\n"; }
  Keyring c = Keyring::load();
  EXPECT_FALSE(c.signing);
  ASSERT_FALSE(c.refused.empty());
  EXPECT_NE(c.refused[0].find("64 hexadecimal digits"), std::string::npos) << c.refused[0];
}

TEST(Trust, ProcessesStartingAtOnceAgreeOnOneKey) {
  TempDir t;
  ScopedEnv config("XDG_CONFIG_HOME", (t / "config").string());
  ScopedEnv no_file("TDSTORE_KEY_FILE", "");
  std::vector<pid_t> kids;
  for (int i = 0; i < 8; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      Keyring k = Keyring::load();
      std::ofstream(t / ("id." + std::to_string(i))) << (k.signing ? k.signing->id : "none");
      _exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t p : kids) ::waitpid(p, nullptr, 0);
  std::set<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    std::ifstream in(t / ("id." + std::to_string(i)));
    std::string id;
    in >> id;
    ids.insert(id);
  }
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(*ids.begin(), Keyring::load().signing->id);
}

TEST(Trust, ATeamKeySignsAndTheOwnAndTrustedKeysStillLoad) {
  TempDir t;
  ScopedEnv config("XDG_CONFIG_HOME", (t / "config").string());
  const std::string team_id = create_key_file(t / "team.key");
  EXPECT_EQ(mode_of(t / "team.key"), 0600u);
  EXPECT_THROW(create_key_file(t / "team.key"), Error);  // never overwritten
  const std::string friend_id = create_key_file(t / "config" / "tdstore" / "trusted" / "friend");
  ScopedEnv file("TDSTORE_KEY_FILE", (t / "team.key").string());
  Keyring k = Keyring::load();
  ASSERT_TRUE(k.signing);
  EXPECT_EQ(k.signing->id, team_id);
  ASSERT_EQ(k.trusted.size(), 2u);  // the user's own key, then trusted/friend
  EXPECT_EQ(k.trusted[0].path, t / "config" / "tdstore" / "key");
  EXPECT_EQ(k.trusted[1].id, friend_id);
  EXPECT_TRUE(k.find(friend_id) && k.find(team_id) && k.find(k.trusted[0].id));
  EXPECT_FALSE(k.find("0000000000000000"));
}

TEST(Trust, RecordsGoToTheStoreUnlessAnotherSignerHoldsTheKey) {
  TempDir t;
  const Keyring& keys = Keyring::process();
  ASSERT_TRUE(keys.signing);
  auto store = storage::Store::create(t / "s", {1}, {});
  const std::string key = "graph/f/c0de/1.13.0/00000000000000aa";
  const std::string record = a_record("mine");
  EXPECT_EQ(storage::put_trusted_graph(*store, key, record), store->path());
  auto loaded = storage::load_trusted_graphs(*store, "graph/f/", [](auto&&...) {});
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].record, record);

  // Another signer's record under the key stays; this user's goes to the graph cache.
  const std::string theirs = storage::seal(key_of(200), key, record, 7);
  store->put_cache(key, theirs);
  std::vector<std::string> refused;
  EXPECT_TRUE(storage::load_trusted_graphs(*store, "graph/f/", [&](auto& k, auto&, auto& why) {
                refused.push_back(k + ": " + why);
              }).empty());
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("does not trust"), std::string::npos) << refused[0];
  std::string why;
  storage::Store* cache = storage::user_graph_cache(&why);
  ASSERT_TRUE(cache) << why;
  EXPECT_EQ(storage::put_trusted_graph(*store, key, record), cache->path());
  EXPECT_EQ(store->scan_cache(key)[0].second, theirs);
  loaded = storage::load_trusted_graphs(*store, "graph/f/", [](auto&&...) {});
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].source, cache->path());
  // erase_own_graph leaves the other signer's record alone.
  storage::erase_own_graph(*store, key);
  EXPECT_EQ(store->scan_cache(key).size(), 1u);
  EXPECT_TRUE(cache->scan_cache(key).empty());
  // An unsigned record (from before sealing) is replaced.
  store->put_cache(key, record);
  EXPECT_EQ(storage::put_trusted_graph(*store, key, record), store->path());
  EXPECT_EQ(storage::unseal(store->scan_cache(key)[0].second, key, keys).status,
            SealStatus::Trusted);
}

TEST(Trust, SigningOldRecordsAndListingWhoSignedThem) {
  TempDir t;
  const Keyring& keys = Keyring::process();
  {
    auto store = storage::Store::create(t / "s", {1}, {});
    const std::string record = a_record("old");
    store->put_cache("graph/f/c/1/01", record);
    store->put_cache("graph/f/c/1/02", storage::seal(key_of(9), "graph/f/c/1/02", record, 1));
  }
  auto trust_of = [&] {
    std::map<std::string, std::string> out;
    for (auto& g : StoreReader::open(t / "s").graphs()) out[g.key] = g.trust + " " + g.signer;
    return out;
  };
  auto before = trust_of();
  EXPECT_EQ(before["graph/f/c/1/01"], "unsigned ");
  EXPECT_EQ(before["graph/f/c/1/02"], "foreign " + key_of(9).id);
  SignResult r = sign_graphs(t / "s");
  EXPECT_EQ(r.signed_records, 1u);
  EXPECT_EQ(r.kept, 1u);
  auto after = trust_of();
  EXPECT_EQ(after["graph/f/c/1/01"], "trusted " + keys.signing->id);
  EXPECT_EQ(after["graph/f/c/1/02"], before["graph/f/c/1/02"]);
  EXPECT_EQ(sign_graphs(t / "s").signed_records, 0u);
  auto s = storage::Store::open(t / "s", OpenMode::ReadOnly, {});
  EXPECT_TRUE(s->verify({}).empty());  // sealed records are framed as verify expects
  // A value that is no graph record is never signed (it stays damage, for --clear).
  s->put_cache("graph/f/c/1/03", std::string("\x01\0\0\0{", 5));
  EXPECT_EQ(sign_graphs(t / "s").signed_records, 0u);
  // A catalog others may write: its unsigned records may be anyone's, so nothing is signed.
  s->put_cache("graph/f/c/1/01", a_record("planted"));
  ::chmod((t / "s" / "catalog" / "data.mdb").c_str(), 0666);
  try {
    sign_graphs(t / "s");
    ADD_FAILURE() << "signed a catalog others may write";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("may be written by its group or others"),
              std::string::npos)
        << e.what();
  }
  ::chmod((t / "s" / "catalog" / "data.mdb").c_str(), 0644);
  EXPECT_EQ(trust_of()["graph/f/c/1/01"], "unsigned ");
  // A newer build's seal is neither loaded nor damage.
  std::string newer = storage::seal(*keys.signing, "graph/f/c/1/04", a_record("new"), 1);
  newer[4] = 2;
  s->put_cache("graph/f/c/1/04", newer);
  EXPECT_EQ(trust_of()["graph/f/c/1/04"], "newer " + keys.signing->id);
  // (A fresh handle: a handle's catalog snapshot is pinned where it opened.)
  auto damage = storage::Store::open(t / "s", OpenMode::ReadOnly, {})->verify({});
  ASSERT_EQ(damage.size(), 1u);  // the value that is no graph record, only
  EXPECT_NE(damage[0].find("graph/f/c/1/03"), std::string::npos) << damage[0];
}

TEST(Trust, TheGraphCacheKeepsItsBudgetOldestFirst) {
  TempDir t;
  auto cache = storage::Store::create(t / "c", {}, {});
  const Key k = key_of(3);
  std::string archive(1000, 'a');
  for (int i = 0; i < 10; ++i) {
    std::string key = "graph/f/c/1/" + std::to_string(i);
    cache->put_cache(key, storage::seal(k, key, a_record(archive), 100 + i));
  }
  const uint64_t one = cache->scan_cache("graph/f/c/1/0")[0].second.size() + 13;
  EXPECT_EQ(storage::trim_graph_cache(*cache, 4 * one), 6u);
  std::vector<std::string> left;
  for (auto& [key, v] : cache->scan_cache("graph/")) left.push_back(key);
  EXPECT_EQ(left, (std::vector<std::string>{"graph/f/c/1/6", "graph/f/c/1/7", "graph/f/c/1/8",
                                            "graph/f/c/1/9"}));
  EXPECT_EQ(storage::trim_graph_cache(*cache, 4 * one), 0u);
  // The record just written stays, even alone over the budget.
  EXPECT_EQ(storage::trim_graph_cache(*cache, 1, "graph/f/c/1/6"), 3u);
  ASSERT_EQ(cache->scan_cache("graph/").size(), 1u);
  EXPECT_EQ(cache->scan_cache("graph/")[0].first, "graph/f/c/1/6");
}

// The graph cache is private: created in a 0700 directory, and not used when others may write
// it (another user could remove or replace what it holds). Each check runs in a fresh process:
// the cache's location is read once per process.
TEST(TrustChild, TheGraphCacheOpens) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  ::setenv("XDG_CACHE_HOME", testing::child_arg(), 1);
  std::string why;
  EXPECT_TRUE(storage::user_graph_cache(&why)) << why;
}

TEST(TrustChild, AnOpenGraphCacheIsRefused) {
  if (!testing::child_arg()) GTEST_SKIP() << "runs as a child";
  ::setenv("XDG_CACHE_HOME", testing::child_arg(), 1);
  std::string why;
  EXPECT_FALSE(storage::user_graph_cache(&why));
  EXPECT_NE(why.find("may be written by its group or others"), std::string::npos) << why;
}

TEST(Trust, TheGraphCacheIsPrivate) {
  TempDir t;
  const std::string cache = (t / "cache").string();
  EXPECT_EQ(testing::run_child("TrustChild.TheGraphCacheOpens", cache), 0);
  EXPECT_EQ(mode_of(t / "cache" / "tdstore"), 0700u);
  ::chmod((t / "cache" / "tdstore" / "graphs" / "catalog").c_str(), 0777);
  EXPECT_EQ(testing::run_child("TrustChild.AnOpenGraphCacheIsRefused", cache), 0);
  ::chmod((t / "cache" / "tdstore" / "graphs" / "catalog").c_str(), 0755);
  EXPECT_EQ(testing::run_child("TrustChild.TheGraphCacheOpens", cache), 0);
}

}  // namespace
}  // namespace tdstore
