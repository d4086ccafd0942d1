// The writer's transaction on its own (storage/write_txn.h): a group undone puts every part of
// the staged state back exactly (records, index entries, catalog records, batch size, deltas,
// running checksums), nested groups join the outermost; a replaced staged extent is retired
// unless it holds the committed bytes or the new version keeps it; small writes wait, go out
// together (gaps zero-filled) and a failed one breaks the transaction; commit and rollback
// leave nothing staged.
#include "storage/write_txn.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fault_env.h"
#include "storage/format.h"
#include "tdstore/env.h"
#include "tdstore/errors.h"
#include "temp_dir.h"

namespace tdstore::storage {
namespace write_txn_test {

constexpr uint64_t P = kPageSize;

struct Harness {
  testing::TempDir dir;
  std::shared_ptr<testing::FaultEnv> env = std::make_shared<testing::FaultEnv>();
  std::shared_ptr<File> arena = env->open(dir / "arena", Env::Access::Create);
  std::unique_ptr<WriteTxn> make(bool reuse = true) {
    ArenaAllocator::Setup s;
    s.where = "/s";
    s.tail = P;
    s.limit = 1024 * P;
    if (reuse) s.free = std::make_unique<FreeSpace>();
    s.oldest_reader = [] { return UINT64_MAX; };  // no reader
    s.pins = std::make_shared<ExtentPins>();
    s.taken = [](uint64_t, uint64_t) {};
    return std::make_unique<WriteTxn>(std::move(s), arena, 64);
  }
  std::string file(uint64_t offset, size_t n) {
    std::string out(n, '\x7f');
    arena->read_at(offset, out.data(), n);
    return out;
  }
};

SlotRecord live(uint64_t offset, uint64_t capacity) {
  SlotRecord r{};
  r.state = static_cast<uint8_t>(SlotState::Live);
  r.data_offset = offset;
  r.data_nbytes = capacity;
  r.data_capacity = capacity;
  return r;
}

bool same(const SlotRecord* a, const SlotRecord& b) {
  return a && std::memcmp(a, &b, sizeof b) == 0;
}

TEST(WriteTxn, AGroupUndoneLeavesTheStagedStateAsItBegan) {
  Harness h;
  auto t = h.make();
  const SlotRecord before = live(t->allocate(100, 64), 100);
  t->stage(1, before, std::nullopt, 1, 100);
  t->stage_meta("attr/a", "old");
  bool fresh = false;
  t->running_hash(1, &fresh).update("x", 1);
  const uint64_t retired = t->allocator().retired_count();

  t->begin_group();
  t->stage(1, live(t->allocate(200, 64), 200), std::nullopt, 0, 100);
  t->begin_group();  // nested: joins the outer one
  t->stage(7, live(t->allocate(50, 64), 50), std::nullopt, 1, 50);
  t->stage_index_entry(3, 7);
  t->end_group();
  t->stage_meta("attr/a", std::nullopt);
  t->stage_meta("attr/b", "new");
  t->stage_batch_size({4});
  EXPECT_EQ(t->allocator().retired_count(), retired + 1) << "slot 1's staged extent replaced";
  EXPECT_EQ(t->keys_delta(), 2);

  t->begin_group();
  EXPECT_FALSE(t->abort_group()) << "an inner group leaves the undoing to the outermost";
  EXPECT_TRUE(t->abort_group());
  EXPECT_FALSE(t->in_group());
  EXPECT_TRUE(same(t->record(1), before));
  EXPECT_EQ(t->record(7), nullptr);
  EXPECT_TRUE(t->new_index_entries().empty());
  ASSERT_EQ(t->meta().size(), 1u);
  EXPECT_EQ(t->meta().at("attr/a"), std::optional<std::string>("old"));
  EXPECT_FALSE(t->batch_size());
  EXPECT_EQ(t->keys_delta(), 1);
  EXPECT_EQ(t->bytes_delta(), 100);
  t->running_hash(1, &fresh);
  EXPECT_TRUE(fresh) << "a running checksum the group may have fed is dropped";
  // What the group retired is staged again, so not free; what it allocated (200 and 50 bytes)
  // is unreferenced: retired, free after the next commit.
  EXPECT_EQ(t->allocator().retired_count(), retired + 2);
}

TEST(WriteTxn, AReplacedStagedExtentIsRetiredUnlessCommittedOrKept) {
  Harness h;
  auto t = h.make();
  const SlotRecord a = live(t->allocate(100, 64), 100);
  t->stage(1, a, std::nullopt, 1, 100);
  size_t n = t->allocator().retired_count();
  SlotRecord appended = a;  // same extent, more bytes
  appended.data_nbytes = 150;
  t->stage(1, appended, std::nullopt, 0, 50, /*keep_hash=*/true);
  EXPECT_EQ(t->allocator().retired_count(), n) << "appended in place: the extent is kept";
  t->stage(1, live(t->allocate(10, 64), 10), a.data_offset, 0, -140);
  EXPECT_EQ(t->allocator().retired_count(), n)
      << "the committed version's bytes: commit's to retire";
  t->stage(1, live(t->allocate(10, 64), 10), std::nullopt, 0, 0);
  EXPECT_EQ(t->allocator().retired_count(), n + 1) << "a staged extent nothing else holds";
}

TEST(WriteTxn, SmallWritesWaitAndGoOutTogetherWithZeroFilledGaps) {
  Harness h;
  auto t = h.make();
  const int writes = h.env->writes;
  t->write_small(P, "abc", 3);
  t->write_small(P + 64, "de", 2);  // the next aligned offset: joins the buffer
  EXPECT_EQ(h.env->writes, writes) << "nothing written yet";
  t->write_small(P + 4 * 64, "f", 1);  // a gap of a whole alignment: the buffer goes out first
  EXPECT_EQ(h.env->writes, writes + 1);
  std::string expect = std::string("abc") + std::string(61, '\0') + "de";
  EXPECT_EQ(h.file(P, expect.size()), expect);
  t->flush();
  EXPECT_EQ(h.env->writes, writes + 2);
  EXPECT_EQ(h.file(P + 4 * 64, 1), "f");
  t->flush();
  EXPECT_EQ(h.env->writes, writes + 2) << "nothing left to write";
}

TEST(WriteTxn, AFailedSmallWriteBreaksTheTransaction) {
  Harness h;
  auto t = h.make();
  t->write_small(P, "abc", 3);
  h.env->fail_write_at = 1;
  EXPECT_THROW(t->flush(), IOError);
  EXPECT_TRUE(t->broken());
}

TEST(WriteTxn, CommitAndRollbackLeaveNothingStaged) {
  Harness h;
  auto t = h.make();
  t->stage(1, live(t->allocate(100, 64), 100), std::nullopt, 1, 100);
  t->stage_meta("attr/a", "x");
  t->stage_batch_size({2});
  bool fresh = false;
  t->running_hash(1, &fresh).update("x", 1);
  t->committed(1);
  EXPECT_TRUE(t->empty());
  EXPECT_EQ(t->keys_delta(), 0);
  t->running_hash(1, &fresh);
  EXPECT_FALSE(fresh) << "a running checksum holds across a commit: it is the committed content's";

  t->write_small(t->allocate(3, 64), "abc", 3);
  t->stage(2, live(P, 3), std::nullopt, 1, 3);
  t->begin_group();
  const int writes = h.env->writes;
  t->rolled_back(2, P);
  EXPECT_TRUE(t->empty());
  EXPECT_FALSE(t->in_group());
  t->flush();
  EXPECT_EQ(h.env->writes, writes) << "a rollback drops the small writes waiting";
  t->running_hash(1, &fresh);
  EXPECT_TRUE(fresh);
}

}  // namespace write_txn_test
}  // namespace tdstore::storage
