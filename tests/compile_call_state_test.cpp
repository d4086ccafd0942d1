// What a compiled call depends on besides the dict: the engine's ambient state (autocast,
// default dtype, deterministic algorithms, inference mode), a caller's per-call inputs and
// context (CallState), structured returns (CallResult), and inputs updated in place.
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include "tdstore/tdstore.h"
#include "tests/compile_options.h"
#include "tests/temp_dir.h"

namespace tdstore {
namespace compile_call_state_test {

using testing::TempDir;

using testing::no_persist;

TensorDict batch(int64_t n) {
  TensorDict td({n});
  td.set("x", at::randn({n, 4}));
  return td;
}

// Creates a tensor of the default dtype: the trace bakes the dtype in.
at::Tensor plus_ones(TensorDict& td) { return td.get("x") + at::ones({td.get("x").size(0), 4}); }

TEST(CompileAmbient, DefaultDtypeIsInTheGuard) {
  auto f = compile("ambient_dtype", plus_ones, no_persist());
  TensorDict td = batch(8);
  EXPECT_EQ(f(td).scalar_type(), at::kFloat);
  EXPECT_EQ(f(td).scalar_type(), at::kFloat);
  const auto saved = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  at::Tensor under_double = f(td), again = f(td);
  c10::set_default_dtype(saved);
  EXPECT_EQ(under_double.scalar_type(), at::kDouble) << f.explain();
  EXPECT_EQ(again.scalar_type(), at::kDouble) << f.explain();
  EXPECT_EQ(f(td).scalar_type(), at::kFloat);
  EXPECT_EQ(f.stats().compiles, 2) << f.explain();
  EXPECT_NE(f.explain().find("default_dtype=Double"), std::string::npos) << f.explain();
}

const at::Tensor kW = at::randn({4, 3});
at::Tensor project(TensorDict& td) { return td.get("x").matmul(kW); }

CompileOptions with_weight() {  // kW is a graph input (a captured tensor not listed runs eagerly)
  CompileOptions o = no_persist();
  o.inputs = {kW};
  return o;
}

TEST(CompileAmbient, AutocastIsInTheGuard) {
  auto f = compile("ambient_autocast", project, with_weight());
  TensorDict td = batch(8);
  EXPECT_EQ(f(td).scalar_type(), at::kFloat);
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::Tensor eager = td.get("x").matmul(kW);
  at::Tensor first = f(td), hit = f(td);
  at::autocast::set_cpu_enabled(false);
  at::autocast::clear_cache();
  ASSERT_EQ(eager.scalar_type(), at::kBFloat16);  // the premise: autocast changes the result
  EXPECT_EQ(first.scalar_type(), at::kBFloat16) << f.explain();
  EXPECT_EQ(hit.scalar_type(), at::kBFloat16) << f.explain();
  EXPECT_EQ(f(td).scalar_type(), at::kFloat);
  EXPECT_EQ(f.stats().compiles, 2) << f.explain();
}

TEST(CompileAmbient, DeterministicAndInferenceModeAreInTheGuard) {
  auto f = compile("ambient_flags", project, with_weight());
  TensorDict td = batch(8);
  f(td);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  f(td);
  at::globalContext().setDeterministicAlgorithms(false, false);
  {
    c10::InferenceMode inference;
    TensorDict fresh = batch(8);
    at::Tensor r = f(fresh);
    EXPECT_TRUE(r.is_inference()) << f.explain();
  }
  EXPECT_EQ(f.stats().compiles, 3) << f.explain();
  f(td);
  EXPECT_EQ(f.stats().hits, 1) << f.explain();
}

// A structured function: two tensors arranged as the caller says.
CallResult two(TensorDict& td) {
  at::Tensor x = td.get("x");
  if (td.contains("pair")) return {{x * 2, x.sum(1)}, "pair"};
  return {{x - 1}, "single"};
}

TEST(CompileStructured, EveryReturnedTensorAndTheStructureComeBackOnHits) {
  auto f = CompiledFunction::structured("structured_two", two, no_persist());
  TensorDict td = batch(6);
  for (int i = 0; i < 3; ++i) {
    CallResult r = f.call(td, {});
    ASSERT_EQ(r.structure, "single");
    ASSERT_EQ(r.tensors.size(), 1u);
    EXPECT_TRUE(at::allclose(r.tensors[0], td.get("x") - 1));
  }
  td.set("pair", at::zeros({6}));
  for (int i = 0; i < 3; ++i) {
    CallResult r = f.call(td, {});
    ASSERT_EQ(r.structure, "pair");
    ASSERT_EQ(r.tensors.size(), 2u);
    EXPECT_TRUE(at::allclose(r.tensors[0], td.get("x") * 2));
    EXPECT_TRUE(at::allclose(r.tensors[1], td.get("x").sum(1)));
  }
  auto s = f.stats();
  EXPECT_EQ(s.compiles, 2) << f.explain();
  EXPECT_EQ(s.hits, 4) << f.explain();
}

TEST(CompileStructured, AStoredGraphKeepsItsStructure) {
  TempDir dir;
  {
    auto td = TensorDict::create(dir.path() / "s", {6});
    td.set("x", at::randn({6, 4}));
    td.set("pair", at::zeros({6}));
    td.commit();
    auto f = CompiledFunction::structured("structured_stored", two);
    f.call(td, {});
    EXPECT_EQ(f.stats().compiles, 1);
  }
  auto td = TensorDict::open(dir.path() / "s");
  auto f = CompiledFunction::structured("structured_stored", two);
  for (int i = 0; i < 2; ++i) {
    CallResult r = f.call(td, {});
    ASSERT_EQ(r.structure, "pair");
    ASSERT_EQ(r.tensors.size(), 2u);
    EXPECT_TRUE(at::allclose(r.tensors[1], td.get("x").sum(1)));
  }
  EXPECT_EQ(f.stats().loads, 1) << f.explain();
  EXPECT_EQ(f.stats().compiles, 0) << f.explain();
}

// The weight is a per-call input, found by the caller on every call.
at::Tensor weight_of_call;
CallResult scaled(TensorDict& td) { return {{td.get("x").matmul(weight_of_call)}, ""}; }

TEST(CompileCallState, PerCallInputsAreGraphInputsAndTheContextSelectsEntries) {
  auto f = CompiledFunction::structured("call_state_inputs", scaled, no_persist());
  TensorDict td = batch(5);
  for (int i = 0; i < 4; ++i) {
    weight_of_call = at::randn({4, 3});  // a new tensor every call: an input, not a constant
    CallResult r = f.call(td, {{weight_of_call}, "config=a", ""});
    EXPECT_TRUE(at::allclose(r.tensors[0], td.get("x").matmul(weight_of_call))) << i;
  }
  EXPECT_EQ(f.stats().compiles, 1) << f.explain();
  weight_of_call = at::randn({4, 2});  // another spec: another entry
  CallResult r = f.call(td, {{weight_of_call}, "config=a", ""});
  EXPECT_TRUE(at::allclose(r.tensors[0], td.get("x").matmul(weight_of_call)));
  EXPECT_EQ(f.stats().compiles, 2) << f.explain();
  f.call(td, {{weight_of_call}, "config=b", ""});  // another context: another entry
  EXPECT_EQ(f.stats().compiles, 3) << f.explain();
  EXPECT_NE(f.explain().find("context \"config=a\" != \"config=b\""), std::string::npos)
      << f.explain();
  f.call(td, {{weight_of_call}, "config=a", ""});
  EXPECT_EQ(f.stats().compiles, 3) << f.explain();
  auto before = f.stats().fallbacks;
  f.call(td, {{weight_of_call}, "config=a", "captures something opaque"});
  EXPECT_EQ(f.stats().fallbacks, before + 1);
  EXPECT_NE(f.explain().find("runs eagerly: captures something opaque"), std::string::npos);
}

// A buffer updated in place, as a running statistic is: once per call, also on a miss (eager
// run, then the trace) and on a checked first call (graph run, then eager).
at::Tensor counter;
CallResult count_calls(TensorDict& td) {
  counter.add_(1);
  return {{td.get("x") * counter}, ""};
}

TEST(CompileCallState, InputsUpdatedInPlaceAreUpdatedOncePerCall) {
  for (bool check : {false, true}) {
    counter = at::zeros({1});
    CompileOptions o = no_persist();
    o.check_first_run = check;
    auto f = CompiledFunction::structured(check ? "count_checked" : "count_plain", count_calls, o);
    TensorDict td = batch(3);
    for (int i = 1; i <= 4; ++i) {
      CallResult r = f.call(td, {{counter}, "", ""});
      ASSERT_EQ(counter.item<float>(), static_cast<float>(i)) << "check " << check << "\n"
                                                              << f.explain();
      EXPECT_TRUE(at::allclose(r.tensors[0], td.get("x") * i)) << i;
    }
    EXPECT_EQ(f.stats().compiles, 1) << f.explain();
    EXPECT_EQ(f.stats().hits, 3) << f.explain();
  }
}

}  // namespace compile_call_state_test
}  // namespace tdstore
