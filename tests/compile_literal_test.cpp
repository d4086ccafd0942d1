// A C++ body's tensors made outside the tracer never reach a graph as garbage: a literal filled
// from C++ data (at::tensor), a tensor over memory the graph does not own (from_blob), run
// eagerly; literals the tracer records (arange, full) still compile. (Issue: hits returned
// -1.1e18 where eager gives 0, and index_select of a literal threw a raw c10::Error.)
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <array>
#include <functional>

#include "tdstore/tdstore.h"
#include "tests/compile_options.h"

namespace tdstore {
namespace compile_literal_test {

using testing::no_persist;

TensorDict batch(float offset) {
  TensorDict td;
  td.set("a", at::arange(8, at::kFloat) + offset);
  return td;
}

// Compiled fn equals eager fn on six calls over changing data; returns the stats.
CompileStats follows_eager(const char* name, std::function<at::Tensor(TensorDict&)> fn) {
  auto compiled = compile(name, fn, no_persist());
  for (int i = 0; i < 6; ++i) {
    TensorDict a = batch(static_cast<float>(i)), b = batch(static_cast<float>(i));
    at::Tensor want = fn(a);
    at::Tensor got = compiled(b);
    EXPECT_TRUE(at::equal(got, want))
        << name << " call " << i << ": " << got << " vs " << want << "\n"
        << compiled.explain();
  }
  return compiled.stats();
}

TEST(CompileLiteral, ATensorLiteralRunsEagerlyAndStaysExact) {
  auto s = follows_eager("literal_add", [](TensorDict& td) {
    return td.get("a") + at::tensor({1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f});
  });
  EXPECT_EQ(s.hits, 0);
  EXPECT_EQ(s.compiles, 0);
}

TEST(CompileLiteral, AScalarLiteralRunsEagerly) {
  auto s =
      follows_eager("literal_scalar", [](TensorDict& td) { return td.get("a") * at::tensor(2.f); });
  EXPECT_EQ(s.hits, 0);
}

TEST(CompileLiteral, AnIndexLiteralNeverThrowsARawError) {
  auto s = follows_eager("literal_index", [](TensorDict& td) {
    return at::index_select(td.get("a"), 0, at::tensor({3, 2, 1, 0}, at::kLong));
  });
  EXPECT_EQ(s.hits, 0);
}

TEST(CompileLiteral, FromBlobOverTheBodysMemoryRunsEagerly) {
  auto s = follows_eager("literal_blob", [](TensorDict& td) {
    std::array<float, 8> w{8, 7, 6, 5, 4, 3, 2, 1};
    return td.get("a") * at::from_blob(w.data(), {8}, at::kFloat);
  });
  EXPECT_EQ(s.hits, 0);
}

TEST(CompileLiteral, TracedFactoriesStillCompile) {
  auto s = follows_eager("traced_factories", [](TensorDict& td) {
    at::Tensor a = td.get("a");
    at::Tensor filled = at::zeros({8});
    filled.fill_(3.f);
    return a * at::arange(8, at::kFloat) + at::full({8}, 0.5f) + filled;
  });
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.hits, 5);
}

}  // namespace compile_literal_test
}  // namespace tdstore
