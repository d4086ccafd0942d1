// The message helpers every error is spelled with (storage/messages.h).
#include "storage/messages.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

TEST(Messages, KeysAndShapesHaveOneSpelling) {
  EXPECT_EQ(in_quotes("obs/pixels"), "'obs/pixels'");
  EXPECT_EQ(in_quotes(""), "''");
  EXPECT_EQ(shape_text(std::vector<int64_t>{}), "[]");
  EXPECT_EQ(shape_text(std::vector<int64_t>{7}), "[7]");
  EXPECT_EQ(shape_text(std::vector<int64_t>{2, -1, 3}), "[2, -1, 3]");
}

TEST(Messages, AnOsErrorNamesThePathWhatFailedAndWhy) {
  try {
    throw_os_error("/data/store", "cannot open the reader table", ENOENT, " (context)");
    FAIL();
  } catch (const IOError& e) {
    EXPECT_EQ(std::string(e.what()), std::string("/data/store: cannot open the reader table: ") +
                                         std::strerror(ENOENT) + " (context)");
  }
  errno = EACCES;
  try {
    throw_io_error("/data/store/arena.tda", "pread");
    FAIL();
  } catch (const IOError& e) {
    EXPECT_EQ(std::string(e.what()),
              std::string("/data/store/arena.tda: pread failed: ") + std::strerror(EACCES));
  }
}

}  // namespace
}  // namespace tdstore::storage
