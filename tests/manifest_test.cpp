// The dataset manifest's parser and writer (storage/dataset_manifest.h), without libtorch: what
// manifest_json writes parse_manifest reads back exactly; format 1 (no seals) is still read;
// another format is a FormatError; every malformed field is a CorruptionError naming where the
// manifest is and what is wrong.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "storage/dataset_manifest.h"
#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

Manifest example() {
  Manifest m;
  m.row_shape = {};
  m.shards = {{0, 100}, {2, 0}, {5, 7}};  // shard 2 published no rows: no seal
  m.keys["image"] = {"uint8", {28, 28}, false};
  m.keys["tokens"] = {"int64", {}, true};
  m.seals[0] = {3, 1'700'000'000'000'000'000ull, {{"image", 0}, {"tokens", UINT64_MAX}}};
  m.seals[5] = {UINT64_MAX, 1, {{"image", 0x0123456789abcdefull}}};
  return m;
}

TEST(Manifest, WhatIsWrittenIsReadBackExactly) {
  const Manifest m = example();
  const Manifest back = parse_manifest(manifest_json(m), "d");
  EXPECT_EQ(back.row_shape, m.row_shape);
  EXPECT_EQ(back.shards, m.shards);
  EXPECT_EQ(back.keys, m.keys);
  EXPECT_EQ(back.seals, m.seals);
  EXPECT_EQ(manifest_json(back), manifest_json(m));

  Manifest batched = m;
  batched.row_shape = {4};
  EXPECT_EQ(parse_manifest(manifest_json(batched), "d").row_shape, std::vector<int64_t>{4});
}

TEST(Manifest, FormatOneIsReadWithoutSeals) {
  const Manifest m = parse_manifest(
      R"({"format": 1, "row_shape": [], "shards": [{"shard": 0, "rows": 3}],
          "keys": {"x": {"dtype": "float32", "shape": [2], "ragged": false}}})",
      "d");
  ASSERT_EQ(m.shards.size(), 1u);
  EXPECT_EQ(m.shards[0], (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_TRUE(m.seals.empty());
  EXPECT_EQ(m.keys.at("x").text(), "float32 [2]");
}

TEST(Manifest, AnotherFormatIsAFormatError) {
  try {
    parse_manifest(R"({"format": 3, "row_shape": [], "shards": [], "keys": {}})", "/data/d");
    FAIL() << "format 3 was read";
  } catch (const CorruptionError& e) {
    FAIL() << "a newer format is not damage: " << e.what();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("/data/d: manifest format 3"), std::string::npos)
        << e.what();
  }
}

// Each malformed manifest, by what is wrong with it, and a part of the message naming it.
TEST(Manifest, EachMalformedFieldIsACorruptionErrorNamingIt) {
  const std::string seal =
      R"("generation": 1, "committed_at_ns": 2, "xxh3": {"x": "00000000000000ff"})";
  auto shard = [&](const std::string& fields) {
    return R"({"format": 2, "row_shape": [], "shards": [)" + fields + R"(], "keys": {}})";
  };
  const std::pair<std::string, std::string> cases[] = {
      {"not json {", "is not JSON"},
      {"[1, 2]", "missing field 'format'"},
      {R"({"format": 2, "row_shape": [], "keys": {}})", "missing field 'shards'"},
      {R"({"format": 2, "row_shape": [], "shards": {}, "keys": {}})", "'shards' is not an array"},
      {R"({"format": 2, "row_shape": [-1.5], "shards": [], "keys": {}})", "not an integer"},
      {R"({"format": "2", "row_shape": [], "shards": [], "keys": {}})", "not an integer"},
      {shard(R"({"shard": 0, "rows": -1})"), "negative shard or rows"},
      {shard(R"({"shard": -3, "rows": 0})"), "negative shard or rows"},
      {shard(R"({"shard": 0, "rows": 9223372036854775808})"), "not an integer in range"},
      {shard(R"({"shard": 1, "rows": 0}, {"shard": 1, "rows": 0})"), "not ascending at shard 1"},
      {shard(R"({"shard": 0, "rows": 5})"), "missing field 'generation'"},
      {shard(R"({"shard": 0, "rows": 5, "generation": -1, "committed_at_ns": 2, "xxh3": {}})"),
       "not a non-negative integer"},
      {shard(R"({"shard": 0, "rows": 5, "generation": 1, "committed_at_ns": 2, "xxh3": []})"),
       "'xxh3' is not an object"},
      {shard(R"({"shard": 0, "rows": 5, "generation": 1, "committed_at_ns": 2,
                 "xxh3": {"x": "ff"}})"),
       "xxh3 of 'x' is not 16 hex digits"},
      {shard(R"({"shard": 0, "rows": 5, "generation": 1, "committed_at_ns": 2,
                 "xxh3": {"x": "00000000000000FF"}})"),
       "xxh3 of 'x' is not 16 hex digits"},
      {R"({"format": 2, "row_shape": [], "shards": [], "keys": []})", "'keys' is not an object"},
      {R"({"format": 2, "row_shape": [], "shards": [], "keys": {"x": {"shape": [], "ragged": false}}})",
       "missing field 'dtype'"},
      {R"({"format": 2, "row_shape": [], "shards": [],
           "keys": {"x": {"dtype": 7, "shape": [], "ragged": false}}})",
       "key 'x': bad dtype or ragged"},
      {R"({"format": 2, "row_shape": [], "shards": [],
           "keys": {"x": {"dtype": "int8", "shape": [], "ragged": 1}}})",
       "key 'x': bad dtype or ragged"},
  };
  // The well-formed neighbour of the shard cases is read: the cases fail for their one fault.
  EXPECT_EQ(parse_manifest(shard(R"({"shard": 0, "rows": 5, )" + seal + "}"), "d")
                .seals.at(0)
                .checksums.at("x"),
            0xffu);
  for (const auto& [text, what] : cases) {
    try {
      parse_manifest(text, "/data/d");
      ADD_FAILURE() << "read: " << text;
    } catch (const FormatError& e) {
      ADD_FAILURE() << "a FormatError for damage: " << e.what();
    } catch (const CorruptionError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("/data/d: manifest", 0), 0u) << msg;
      EXPECT_NE(msg.find(what), std::string::npos) << "expected '" << what << "' in: " << msg;
    }
  }
}

}  // namespace
}  // namespace tdstore::storage
