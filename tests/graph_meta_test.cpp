// The compiled-graph record's meta parser (storage/graph_meta.h), without libtorch.
#include "storage/graph_meta.h"

#include <gtest/gtest.h>

#include "tdstore/errors.h"

namespace tdstore::storage {
namespace {

using json = nlohmann::json;

json meta() {
  return json::parse(R"json({"prefix": "agent/", "observations": [
      {"read": "get", "key": "obs", "spec": {"dtype": "float32", "sizes": [-1, 784],
       "strides": [784, 1], "device": "cpu", "requires_grad": false}},
      {"query": "keys", "key": "next/", "answer": ["next/obs"], "exclude": ["next/a"]},
      {"lazy": "norm", "deps": ["obs"], "version": "v1", "answer": true},
      {"read": "get", "key": "gone", "error": {"kind": "KeyError", "message": "not found"}}],
    "inputs": [], "grad_mode": false, "dynamic_dim0": true, "context": "eval",
    "effects": {"erases": ["tmp"], "writes": ["out"],
                "lazy_writes": [{"key": "norm", "deps": ["obs"], "version": "v1"}],
                "lazy_reuses": 1, "returns": 2, "structure": "(t,t)"}})json");
}

TEST(GraphMeta, EveryFieldIsRead) {
  GraphMeta m = parse_graph_meta(meta());
  EXPECT_EQ(m.prefix, "agent/");
  ASSERT_EQ(m.observations.size(), 4u);
  EXPECT_EQ(m.observations[0].call, "get");
  EXPECT_EQ(m.observations[0].spec.dtype, "float32");
  EXPECT_EQ(m.observations[0].spec.sizes, (std::vector<int64_t>{-1, 784}));
  EXPECT_EQ(m.observations[1].kind, GraphObservation::Kind::Query);
  EXPECT_EQ(m.observations[1].answer, json::array({"next/obs"}));
  EXPECT_EQ(m.observations[1].exclude, std::vector<std::string>{"next/a"});
  EXPECT_EQ(m.observations[2].kind, GraphObservation::Kind::Lazy);
  EXPECT_EQ(m.observations[2].answer, json(true));
  ASSERT_TRUE(m.observations[3].error);
  EXPECT_EQ(m.observations[3].error->first, "KeyError");
  EXPECT_FALSE(m.grad_mode);
  EXPECT_TRUE(m.dynamic_dim0);
  EXPECT_EQ(m.context, "eval");
  EXPECT_EQ(m.erases, std::vector<std::string>{"tmp"});
  ASSERT_EQ(m.lazy_writes.size(), 1u);
  EXPECT_EQ(m.lazy_writes[0].version, "v1");
  EXPECT_EQ(m.returns, 2);
  EXPECT_EQ(m.structure, "(t,t)");
}

TEST(GraphMeta, DamageIsACorruptionErrorNamingTheRecord) {
  auto refused = [](json j) {
    try {
      parse_graph_meta(j);
    } catch (const CorruptionError& e) {
      return std::string(e.what()).rfind("guard record: ", 0) == 0;
    }
    return false;
  };
  json j = meta();
  j.erase("prefix");
  EXPECT_TRUE(refused(j));
  j = meta();
  j["observations"][0]["spec"]["strides"] = {1};
  EXPECT_TRUE(refused(j));
  j = meta();
  j["observations"][1]["exclude"] = {"b", "a"};
  EXPECT_TRUE(refused(j));
  j = meta();
  j["observations"][2]["answer"] = "yes";
  EXPECT_TRUE(refused(j));
  j = meta();
  j["observations"][0].erase("read");
  EXPECT_TRUE(refused(j));
  j = meta();
  j["effects"]["returns"] = int64_t{1} << 21;
  EXPECT_TRUE(refused(j));
  j = meta();
  j["effects"]["lazy_reuses"] = 1.5;
  EXPECT_TRUE(refused(j));
  EXPECT_FALSE(refused(meta()));
}

}  // namespace
}  // namespace tdstore::storage
