// The one validity rule of lazy properties (storage/derived.h), over facts a test controls.
#include <gtest/gtest.h>

#include <map>

#include "storage/derived.h"

namespace tdstore::storage {
namespace {

using Deps = std::vector<std::pair<std::string, uint64_t>>;

// Keys with fingerprints; some are lazy properties, each with its recorded dependencies.
struct Facts final : LazyFacts {
  std::map<std::string, uint64_t> fingerprints;
  std::map<std::string, Deps> properties;
  mutable int deepest = 0;
  std::optional<uint64_t> fingerprint(std::string_view key, int) const override {
    auto it = fingerprints.find(std::string(key));
    return it == fingerprints.end() ? std::nullopt : std::optional(it->second);
  }
  std::optional<bool> lazy_valid(std::string_view key, int depth) const override {
    deepest = std::max(deepest, depth);
    auto it = properties.find(std::string(key));
    if (it == properties.end()) return std::nullopt;
    return storage::lazy_valid(true, it->second, depth, *this);
  }
};

TEST(LazyRule, ValidWhileThePropertyAndEveryDependencyAreUnchanged) {
  Facts f;
  f.fingerprints = {{"x", 1}, {"y", 2}};
  EXPECT_TRUE(lazy_valid(true, Deps{{"x", 1}, {"y", 2}}, 0, f));
  EXPECT_FALSE(lazy_valid(false, Deps{{"x", 1}, {"y", 2}}, 0, f)) << "the property changed";
  EXPECT_FALSE(lazy_valid(true, Deps{{"x", 1}, {"y", 3}}, 0, f)) << "a dependency changed";
  EXPECT_FALSE(lazy_valid(true, Deps{{"x", 1}, {"gone", 2}}, 0, f)) << "a dependency is gone";
  EXPECT_TRUE(lazy_valid(true, Deps{}, 0, f));
}

TEST(LazyRule, APropertyBuiltOnAStalePropertyIsStale) {
  Facts f;
  f.fingerprints = {{"x", 1}, {"norm", 10}, {"n2", 20}};
  f.properties["norm"] = {{"x", 1}};
  EXPECT_TRUE(lazy_valid(true, Deps{{"norm", 10}}, 0, f));
  f.properties["norm"] = {{"x", 99}};  // norm's own input changed since norm was computed
  EXPECT_FALSE(lazy_valid(true, Deps{{"norm", 10}}, 0, f))
      << "norm still has the fingerprint recorded, but norm itself is stale";
}

TEST(LazyRule, ACycleOrAChainDeeperThanTheLimitIsStale) {
  Facts f;
  f.fingerprints = {{"a", 1}, {"b", 2}};
  f.properties["a"] = {{"b", 2}};
  f.properties["b"] = {{"a", 1}};
  EXPECT_FALSE(lazy_valid(true, Deps{{"a", 1}}, 0, f));
  EXPECT_EQ(f.deepest, kMaxLazyChain) << "the recursion ends at the limit";
  // A chain of kMaxLazyChain properties (the one asked about, then p62 .. p0) is trusted, one
  // more is not.
  Facts chain;
  for (int i = 0; i <= kMaxLazyChain; ++i) {
    chain.fingerprints["p" + std::to_string(i)] = i;
    if (i > 0) chain.properties["p" + std::to_string(i)] = {{"p" + std::to_string(i - 1), i - 1}};
  }
  chain.properties["p0"] = {};
  EXPECT_TRUE(lazy_valid(true, Deps{{"p" + std::to_string(kMaxLazyChain - 2), kMaxLazyChain - 2}},
                         0, chain));
  EXPECT_FALSE(
      lazy_valid(true, Deps{{"p" + std::to_string(kMaxLazyChain), kMaxLazyChain}}, 0, chain));
  EXPECT_FALSE(lazy_valid(true, Deps{}, kMaxLazyChain, chain));
}

}  // namespace
}  // namespace tdstore::storage
