// Catalog on its own: two versions per record, snapshots isolated until renewed, prefix scans,
// the content digest's running XOR, recovery after a crash mid-commit, cache entries, growth of
// the map, and damaged records reported with their key.
#include "storage/catalog.h"

#include <gtest/gtest.h>
#include <lmdb.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tdstore/errors.h"
#include "tests/temp_dir.h"

namespace tdstore::storage {
namespace {

using testing::TempDir;
using Changes = std::map<std::string, std::optional<std::string>>;

std::shared_ptr<Catalog> fresh(const TempDir& t) {
  return Catalog::open(t / "cat", /*writable=*/true, /*create=*/true);
}

TEST(Catalog, KeepsTheVersionVisibleBeforeEachWrite) {
  TempDir t;
  auto c = fresh(t);
  c->write({{"attr/a", "1"}}, 1);
  c->write({{"attr/a", "2"}}, 2);
  {
    auto s = c->snapshot();
    EXPECT_EQ(s->get("attr/a", 0), std::nullopt);
    EXPECT_EQ(s->get("attr/a", 1), "1");
    EXPECT_EQ(s->get("attr/a", 2), "2");
    EXPECT_EQ(s->get("attr/a", 9), "2");
  }
  c->write({{"attr/a", std::nullopt}}, 3);  // a delete is a version too
  auto s = c->snapshot();
  EXPECT_EQ(s->get("attr/a", 3), std::nullopt);
  EXPECT_EQ(s->get("attr/a", 2), "2") << "the version visible at gen - 1 is kept";
  EXPECT_EQ(s->get("attr/a", 1), std::nullopt) << "older versions are dropped";
}

TEST(Catalog, ASnapshotSeesNothingNewerUntilRenewed) {
  TempDir t;
  auto c = fresh(t);
  c->write({{"attr/x", "old"}}, 1);
  auto s = c->snapshot();
  c->write({{"attr/x", "new"}, {"attr/y", "y"}}, 2);
  EXPECT_EQ(s->get("attr/x", 2), "old");
  EXPECT_EQ(s->get("attr/y", 2), std::nullopt);
  s->renew();
  EXPECT_EQ(s->get("attr/x", 2), "new");
  EXPECT_EQ(s->get("attr/y", 2), "y");
}

TEST(Catalog, ScanVisitsThePresentKeysOfAPrefixAtAGeneration) {
  TempDir t;
  auto c = fresh(t);
  c->write({{"attr/a", "1"}, {"attr/b", "2"}, {"lazy/a", "L"}}, 1);
  c->write({{"attr/b", std::nullopt}, {"attr/c", "3"}}, 2);
  auto s = c->snapshot();
  auto scan = [&](uint64_t gen) {
    std::map<std::string, std::string> seen;
    s->scan("attr/", gen, [&](std::string_view k, std::string_view v) {
      seen.emplace(std::string(k), std::string(v));
    });
    return seen;
  };
  EXPECT_EQ(scan(1), (std::map<std::string, std::string>{{"attr/a", "1"}, {"attr/b", "2"}}));
  EXPECT_EQ(scan(2), (std::map<std::string, std::string>{{"attr/a", "1"}, {"attr/c", "3"}}));
}

TEST(Catalog, WriteReturnsTheChangeOfTheContentDigest) {
  TempDir t;
  auto c = fresh(t);
  uint64_t digest = 0;
  digest ^= c->write({{"attr/a", "1"}, {"attr/b", "2"}}, 1);
  digest ^= c->write({{"attr/a", "changed"}, {"attr/b", std::nullopt}, {"attr/c", "3"}}, 2);
  digest ^= c->write({{"cache/x", "not content"}}, 0);
  EXPECT_EQ(digest, content_digest("attr/a", "changed") ^ content_digest("attr/c", "3"));
}

TEST(Catalog, RecoverDropsVersionsNewerThanTheCommittedGeneration) {
  TempDir t;
  auto c = fresh(t);
  c->write({{"cache/k", "kept"}}, 0);
  c->write({{"attr/a", "committed"}}, 4);
  c->write({{"attr/a", "torn"}, {"attr/new", "torn"}}, 5);  // a commit that never finished
  c->recover(4, "cache/");
  auto s = c->snapshot();
  EXPECT_EQ(s->get("attr/a", 5), "committed");
  EXPECT_EQ(s->get("attr/new", 5), std::nullopt);
  EXPECT_EQ(s->get("cache/k", 0), "kept");
}

TEST(Catalog, CacheEntriesHaveOneVersionSeenByEverySnapshot) {
  TempDir t;
  auto c = fresh(t);
  c->write({{"graph/f", "v1"}}, 0);
  c->write({{"graph/f", "v2"}}, 0);
  auto s = c->snapshot();
  EXPECT_EQ(s->get("graph/f", 0), "v2");
  EXPECT_EQ(s->get("graph/f", 100), "v2");
  const uint64_t before = c->entries();
  c->write({{"graph/f", std::nullopt}}, 0);
  EXPECT_EQ(c->entries(), before - 1) << "deleting a cache entry removes it";
}

TEST(Catalog, GrowsPastItsMapAndReopensWithEverything) {
  TempDir t;
  const std::string big(2 << 20, 'x');
  {
    auto c = fresh(t);
    for (int i = 0; i < 40; ++i)  // 80 MiB: past the initial 64 MiB map
      c->write({{"attr/k" + std::to_string(i), big + std::to_string(i)}},
               static_cast<uint64_t>(i + 1));
  }
  EXPECT_GT(std::filesystem::file_size(t / "cat" / "data.mdb"), uint64_t{64} << 20);
  auto c = Catalog::open(t / "cat", /*writable=*/false);
  auto s = c->snapshot();
  for (int i : {0, 20, 39})
    EXPECT_EQ(s->get("attr/k" + std::to_string(i), 1000), big + std::to_string(i));
}

TEST(Catalog, ADamagedRecordNamesItsKey) {
  TempDir t;
  auto c = fresh(t);
  c->write({{"attr/a", "value"}}, 1);
  try {
    catalog_value_at("attr/a", "not a record", 1);
    ADD_FAILURE() << "a damaged record decoded";
  } catch (const CorruptionError& e) {
    EXPECT_NE(std::string(e.what()).find("attr/a"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tdstore::storage
