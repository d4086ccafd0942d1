// What holds per process: one copy of the engine, so one LMDB environment per catalog however
// the store is reached (LMDB: one environment per file per process; a second one's locks and
// mappings break the first's).
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

#include "storage/store.h"
#include "tdstore/admin.h"
#include "tdstore/tdstore.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace {

using testing::TempDir;

// Mappings of `file` in this process (one per LMDB environment open on it).
int mappings_of(const std::filesystem::path& file) {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> starts;
  const std::string name = std::filesystem::canonical(file).string();
  for (std::string line; std::getline(maps, line);)
    if (line.size() > name.size() &&
        line.compare(line.size() - name.size(), name.size(), name) == 0)
      starts.insert(line.substr(0, line.find('-')));
  return static_cast<int>(starts.size());
}

// A writer through the libtorch API, a reader through the engine's own interface (what the
// storage tests and tools use) and one through the torch-free admin API: all share one
// environment on the catalog.
TEST(Process, OneCatalogEnvironmentPerStoreWhicheverLibraryOpensIt) {
  TempDir t;
  auto dir = t / "s";
  auto writer = TensorDict::create(dir, {2});
  writer.set("x", at::ones({2}));
  writer.set_attr("source", "test");
  writer.commit();
  const auto lock = dir / "catalog" / "lock.mdb";
  ASSERT_EQ(mappings_of(lock), 1);
  auto engine = storage::Store::open(dir, OpenMode::ReadOnly, StoreOptions{});
  EXPECT_EQ(engine->get_attr("source"), "test");
  auto reader = StoreReader::open(dir);
  EXPECT_EQ(reader.attribute("source"), "test");
  EXPECT_EQ(mappings_of(lock), 1) << "a second LMDB environment on " << lock;
  writer.set_attr("source", "changed");
  writer.commit();
  EXPECT_TRUE(engine->refresh());
  EXPECT_EQ(engine->get_attr("source"), "changed");
}

}  // namespace
}  // namespace tdstore
