// Bytes stored from a file (storage::Payload with a file, map_file_array, Array::file): put and
// append copy them in the kernel and compare them as they land; an import of file-backed arrays
// is exact, resumable and refuses another store when asked to.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>
#include <numeric>
#include <stdexcept>

#include "storage/store.h"
#include "tdstore/admin.h"
#include "tdstore/errors.h"
#include "tdstore/formats.h"
#include "tests/fault_env.h"
#include "tests/temp_dir.h"

namespace tdstore::storage {
namespace file_payload_test {
using testing::FaultEnv;
using testing::TempDir;

constexpr int64_t kRowBytes = 24;  // a row: 6 float32

// `rows` rows of 6 floats after a header of `head` bytes, written to file; the rows' bytes.
std::vector<uint8_t> write_rows(const std::filesystem::path& file, uint64_t head, int64_t rows,
                                float base) {
  std::vector<float> v(static_cast<size_t>(rows) * 6);
  std::iota(v.begin(), v.end(), base);
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  std::ofstream out(file, std::ios::binary);
  out << std::string(head, 'h');
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  return bytes;
}

std::vector<uint8_t> stored(Store& s, const std::string& key) {
  const auto e = s.find(key);
  EXPECT_TRUE(e) << key;
  if (!e) return {};
  const auto* p = static_cast<const uint8_t*>(s.view(*e).data);
  return std::vector<uint8_t>(p, p + e->nbytes);
}

StoreOptions options(std::shared_ptr<Env> env = nullptr) {
  StoreOptions o;
  o.key_capacity = 16;
  o.arena_reserve = int64_t{1} << 30;
  o.env = std::move(env);
  return o;
}

// A source another process rewrites with the same bytes (it truncates the file, then writes it
// again) while its `nth` read runs: that read finds the file empty, and read_at reads zeros past
// its end; by the time the size is checked the file holds all its bytes again. Reads are one
// at a time (the compressing threads call read_at concurrently), so exactly one read sees it.
class RewrittenSource : public File {
 public:
  RewrittenSource(const std::filesystem::path& p, int nth)
      : f_(Env::posix()->open(p, Env::Access::ReadOnly)), nth_(nth) {}
  void read_at(uint64_t o, void* d, size_t n) override {
    std::lock_guard lock(mu_);
    if (++reads_ != nth_) return f_->read_at(o, d, n);
    std::string content(f_->size(), '\0');
    f_->read_at(0, content.data(), content.size());
    std::filesystem::resize_file(f_->path(), 0);
    f_->read_at(o, d, n);
    std::ofstream(f_->path(), std::ios::binary)
        .write(content.data(), static_cast<std::streamsize>(content.size()));
  }
  void write_at(uint64_t, const void*, size_t) override { ADD_FAILURE() << "source written"; }
  void sync() override {}
  void truncate(uint64_t) override {}
  void allocate(uint64_t) override {}
  uint64_t size() override { return f_->size(); }
  int fd() const override { return -1; }
  const std::filesystem::path& path() const override { return f_->path(); }

 private:
  std::unique_ptr<File> f_;
  std::mutex mu_;
  int nth_, reads_ = 0;
};

}  // namespace file_payload_test

namespace {
using namespace file_payload_test;

// A key put from a file, then appended from it in place and moved, holds the file's bytes with
// the checksum a put from memory gives the same bytes; verify() finds it intact.
TEST(FilePayload, PutAndAppendFromAFileStoreItsBytesWithTheirChecksum) {
  TempDir t;
  const auto rows = write_rows(t / "src", 100, 50, 1.0f);
  auto src = Env::posix()->open(t / "src", Env::Access::ReadOnly);
  auto s = Store::create(t / "s", {0}, options());
  s->set_batch_size({10});
  s->put("a", DType::Float32, {10, 6}, Payload{nullptr, 10 * kRowBytes, src.get(), 100},
         20 * kRowBytes);
  s->put("m", DType::Float32, {10, 6}, rows.data(), 10 * kRowBytes);
  EXPECT_EQ(s->find("a")->content_hash, s->find("m")->content_hash);
  s->set_batch_size({20});
  s->append("a", {20, 6}, Payload{nullptr, 10 * kRowBytes, src.get(), 100 + 10 * kRowBytes});
  s->append("m", {20, 6}, rows.data() + 10 * kRowBytes, 10 * kRowBytes);
  const uint64_t offset = s->find("a")->offset;
  s->set_batch_size({50});  // past the capacity: the key moves
  s->append("a", {50, 6}, Payload{nullptr, 30 * kRowBytes, src.get(), 100 + 20 * kRowBytes});
  s->append("m", {50, 6}, rows.data() + 20 * kRowBytes, 30 * kRowBytes);
  EXPECT_NE(s->find("a")->offset, offset) << "the key was expected to move";
  s->commit();
  EXPECT_EQ(stored(*s, "a"), rows);
  EXPECT_EQ(s->find("a")->content_hash, s->find("m")->content_hash);
  EXPECT_TRUE(s->verify().empty());
}

// A copy that lands other bytes than the file's is a CorruptionError naming the key and the
// file, staging nothing; what was committed stays, and the handle goes on.
TEST(FilePayload, ACopyLandingOtherBytesIsACorruptionErrorAndCommitsNothing) {
  TempDir t;
  const auto rows = write_rows(t / "src", 0, 8, 5.0f);
  auto env = std::make_shared<FaultEnv>();
  auto src = Env::posix()->open(t / "src", Env::Access::ReadOnly);
  auto s = Store::create(t / "s", {4}, options(env));
  s->put("a", DType::Float32, {4, 6}, rows.data(), 4 * kRowBytes);
  s->commit();
  env->corrupt_copies = true;
  for (const bool append : {false, true}) {
    try {
      if (append) {
        s->set_batch_size({8});
        s->append("a", {8, 6}, Payload{nullptr, 4 * kRowBytes, src.get(), 4 * kRowBytes});
      } else {
        s->put("b", DType::Float32, {4, 6}, Payload{nullptr, 4 * kRowBytes, src.get(), 0});
      }
      ADD_FAILURE() << "a corrupted copy was stored";
    } catch (const CorruptionError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(append ? "'a'" : "'b'"), std::string::npos) << m;
      EXPECT_NE(m.find((t / "src").string()), std::string::npos) << m;
    }
    s->rollback();
  }
  env->corrupt_copies = false;
  EXPECT_FALSE(s->find("b"));
  EXPECT_EQ(s->find("a")->shape, (std::vector<int64_t>{4, 6}));
  s->put("b", DType::Float32, {4, 6}, Payload{nullptr, 4 * kRowBytes, src.get(), 0});
  s->commit();
  EXPECT_EQ(stored(*s, "b"), std::vector<uint8_t>(rows.begin(), rows.begin() + 4 * kRowBytes));
  EXPECT_TRUE(s->verify().empty());
  EXPECT_THROW(s->put("c", DType::Float32, {4, 6},
                      Payload{rows.data(), 4 * kRowBytes, src.get(), 0}, 0, kSlotCompressed),
               ArgumentError);
}

// map_file_array maps the bytes a shape needs at an offset, and says where they lie; a file
// too short for them is a FormatError naming it.
TEST(FilePayload, MapFileArrayMapsTheRowsAndRefusesAShortFile) {
  TempDir t;
  const auto rows = write_rows(t / "src", 16, 3, 0.5f);
  const Array a = map_file_array(t / "src", 16, DType::Float32, {3, 6});
  EXPECT_EQ(a.nbytes, rows.size());
  EXPECT_EQ(std::memcmp(a.data, rows.data(), rows.size()), 0);
  EXPECT_EQ(a.file, t / "src");
  EXPECT_EQ(a.file_offset, 16u);
  try {
    map_file_array(t / "src", 17, DType::Float32, {3, 6});
    ADD_FAILURE() << "a short file was mapped";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find((t / "src").string()), std::string::npos) << e.what();
  }
  EXPECT_THROW(map_file_array(t / "absent", 0, DType::Float32, {3, 6}), IOError);
}

// An import of file-backed arrays: every byte compared, in chunks; resumed from an empty store
// an earlier import created; another store refused when asked to, replaced otherwise.
TEST(FilePayload, AnImportFromFilesIsExactResumableAndRefusesAnotherStore) {
  TempDir t;
  const auto bytes = write_rows(t / "x", 8, 40, 2.0f);
  std::map<std::string, Array> arrays{{"x", map_file_array(t / "x", 8, DType::Float32, {40, 6})}};
  Store::create(t / "s", {0}, options())->commit();  // what a killed import leaves
  ImportOptions o;
  o.chunk_bytes = 7 * kRowBytes;
  o.refuse_other = true;
  std::vector<int64_t> done;
  o.progress = [&](int64_t d, int64_t) { done.push_back(d); };
  const auto r = import_arrays_chunked(t / "s", arrays, o);
  EXPECT_EQ(r.verified_bytes, bytes.size());
  EXPECT_EQ(r.total_rows, 40);
  EXPECT_EQ(done, (std::vector<int64_t>{0, 7, 14, 21, 28, 35, 40}));
  {
    auto s = Store::open(t / "s", OpenMode::ReadOnly, {});
    EXPECT_EQ(stored(*s, "x"), bytes);
    EXPECT_TRUE(s->verify().empty());
  }
  const auto other = write_rows(t / "y", 0, 40, 9.0f);
  std::map<std::string, Array> theirs{{"x", map_file_array(t / "y", 0, DType::Float32, {40, 6})}};
  try {
    import_arrays_chunked(t / "s", theirs, o);
    ADD_FAILURE() << "another store was written";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find("holds other data"), std::string::npos) << e.what();
  }
  EXPECT_EQ(stored(*Store::open(t / "s", OpenMode::ReadOnly, {}), "x"), bytes);
  o.refuse_other = false;
  EXPECT_EQ(import_arrays_chunked(t / "s", theirs, o).verified_bytes, other.size());
  EXPECT_EQ(stored(*Store::open(t / "s", OpenMode::ReadOnly, {}), "x"), other);
}

// A resumed import compares the rows an interrupted one committed with the source's: read from
// its file, a source cut short since it was mapped is an IOError naming it, not a SIGBUS
// through the mapping, and nothing is written.
TEST(FilePayload, AResumeFromASourceCutShortSinceItWasMappedIsAnIOError) {
  TempDir t;
  write_rows(t / "x", 8, 4000, 2.0f);  // 96 KB: pages past the first to fault on
  std::map<std::string, Array> arrays{{"x", map_file_array(t / "x", 8, DType::Float32, {4000, 6})}};
  ImportOptions o;
  o.chunk_bytes = 700 * kRowBytes;
  o.progress = [](int64_t done, int64_t) {
    if (done == 1400) throw std::runtime_error("interrupted");
  };
  EXPECT_THROW(import_arrays_chunked(t / "s", arrays, o), std::runtime_error);
  EXPECT_EQ(Store::open(t / "s", OpenMode::ReadOnly, {})->batch_size()[0], 1400);
  std::filesystem::resize_file(t / "x", 4096);  // a whole page kept; the mapped ones past it gone
  o.progress = nullptr;
  try {
    import_arrays_chunked(t / "s", arrays, o);
    ADD_FAILURE() << "resumed from a source cut short";
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find((t / "x").string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(Store::open(t / "s", OpenMode::ReadOnly, {})->batch_size()[0], 1400);
}

// A source whose copy goes through a buffer (its fd is refused, as a file on another file
// system's is by copy_file_range), cut short by another process after its first piece is read.
class ShrinkingSource : public File {
 public:
  ShrinkingSource(const std::filesystem::path& p, uint64_t cut_to)
      : f_(Env::posix()->open(p, Env::Access::ReadOnly)), cut_to_(cut_to) {}
  void read_at(uint64_t o, void* d, size_t n) override {
    if (++reads_ == 2) std::filesystem::resize_file(f_->path(), cut_to_);
    f_->read_at(o, d, n);
  }
  void write_at(uint64_t, const void*, size_t) override { ADD_FAILURE() << "source written"; }
  void sync() override {}
  void truncate(uint64_t) override {}
  void allocate(uint64_t) override {}
  uint64_t size() override { return f_->size(); }
  int fd() const override { return -1; }  // copy_file_range: EBADF, the buffered copy
  const std::filesystem::path& path() const override { return f_->path(); }

 private:
  std::unique_ptr<File> f_;
  uint64_t cut_to_;
  int reads_ = 0;
};

// A source cut short while it is copied through a buffer is an IOError naming it: the bytes
// past its new end are not stored as zeros (pread past the end reads zeros, and the check as
// they land reads the source the same way, so it found them equal) and counted as verified.
TEST(FilePayload, ASourceCutShortDuringABufferedCopyIsAnIOError) {
  TempDir t;
  const int64_t rows = (3 << 20) / kRowBytes;  // three of the buffer's 1 MiB pieces
  write_rows(t / "src", 0, rows, 1.0f);
  ShrinkingSource src(t / "src", 1 << 20);
  auto s = Store::create(t / "s", {rows}, options());
  try {
    s->put("a", DType::Float32, {rows, 6},
           Payload{nullptr, static_cast<uint64_t>(rows * kRowBytes), &src, 0});
    const auto got = stored(*s, "a");
    ADD_FAILURE() << "stored; zero bytes past the cut: "
                  << std::count(got.begin() + (1 << 20), got.end(), 0) << " of "
                  << got.size() - (1 << 20);
  } catch (const IOError& e) {
    EXPECT_NE(std::string(e.what()).find((t / "src").string()), std::string::npos) << e.what();
  }
  EXPECT_FALSE(s->find("a"));
}

// Rows of a compressed key read from a file that is rewritten with the same bytes meanwhile
// (truncated, then written again) are never stored as the zeros a read of the empty file gave:
// a put and an append either store the file's bytes or throw a CorruptionError or IOError
// naming the file, staging nothing.
TEST(FilePayload, ACompressedKeyFromAFileRewrittenMeanwhileStoresItsBytesOrThrows) {
  TempDir t;
  const int64_t rows = 3000;
  const auto bytes = write_rows(t / "src", 0, 2 * rows, 1.0f);
  const auto c = Compression::zstd(3, 4096);
  for (const bool append : {false, true}) {
    SCOPED_TRACE(append ? "append" : "put");
    auto s = Store::create(t / (append ? "a" : "p"), {rows}, options());
    if (append) {
      s->put_compressed("x", DType::Float32, {rows, 6}, bytes.data(), rows * kRowBytes, c);
      s->commit();
      s->set_batch_size({2 * rows});
    }
    RewrittenSource src(t / "src", 2);
    const uint64_t at = append ? rows * kRowBytes : 0, n = rows * kRowBytes;
    try {
      if (append)
        s->append("x", {2 * rows, 6}, Payload{nullptr, n, &src, at});
      else
        s->put_compressed("x", DType::Float32, {rows, 6}, Payload{nullptr, n, &src, at}, c);
    } catch (const CorruptionError& e) {
      EXPECT_NE(std::string(e.what()).find((t / "src").string()), std::string::npos) << e.what();
      s->rollback();
      EXPECT_EQ(s->find("x").has_value(), append);
      continue;
    } catch (const IOError& e) {
      EXPECT_NE(std::string(e.what()).find((t / "src").string()), std::string::npos) << e.what();
      s->rollback();
      continue;
    }
    s->commit();
    const auto e = s->find("x");
    ASSERT_TRUE(e);
    std::vector<uint8_t> got(static_cast<size_t>(e->shape[0]) * kRowBytes);
    s->read_rows("x", *e, 0, static_cast<uint64_t>(e->shape[0]), got.data());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), bytes.begin()))
        << "stored other bytes than the file's: "
        << std::count(got.begin(), got.end(), 0) -
               std::count(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(got.size()), 0)
        << " more zero bytes";
  }
}

}  // namespace
}  // namespace tdstore::storage
