// The engine's differential compile fuzzer: random C++ bodies over TensorDicts (built from the
// idioms a C++ body writes: dict reads, questions and writes, branches on sizes and on values,
// literals, random draws, grad-mode switches, captured tensors and parameters, a try/catch
// around an operator, value-sized results, requires_grad set in the body) and random
// mutation schedules between calls (batch size, keys added, erased, retyped, captured values,
// parameters, the caller's grad mode), each call run compiled and eagerly on identical copies.
// Results, the requires_grad of results, errors, the dicts after the call, parameters'
// gradients and the random generator's state must agree; a mismatch prints a minimized
// reproducer. Runs TDSTORE_FUZZ_SECONDS (default 20) seconds; TDSTORE_FUZZ_SEED picks the first
// seed. The Python fuzzer is tests/python/compile_fuzz.py.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/bincount.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/masked_select.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tdstore/tdstore.h"
#include "tests/compile_options.h"

namespace tdstore {
namespace {

const std::vector<std::string> kKeys = {"a", "b", "m/x", "m/y"};

// One step of a body. `then`/`otherwise` hold the branches of the branching kinds.
struct Step {
  enum Kind {
    AddKey,        // acc += get(key) summed over features, times c
    IfContains,    // if (contains(key)) then else otherwise
    IfBatchAbove,  // if (batch_size()[0] > n) then else otherwise
    KeyCount,      // acc += keys().size() * c
    Arange,        // acc += arange(B) * c
    Randn,         // acc += randn(B) * c
    Dropout,       // acc = dropout(acc, 0.5, train)
    Literal,       // acc += at::tensor({c})        (filled outside the tracer)
    ItemBranch,    // if (acc.sum().item() > c) acc *= 2 else acc -= 1
    EqualBranch,   // if (at::equal(acc, acc.abs())) acc += 1
    MaskCount,     // acc += masked_select(acc, acc > 0).size(0)
    MaskSum,       // acc += masked_select(acc, acc > 0).sum()
    NoGrad,        // { NoGradGuard; acc = acc * c }
    Captured,      // acc += captured * c           (a tensor captured, not in inputs)
    Param,         // acc = acc * w                 (a parameter listed in inputs)
    SetKey,        // set("out/<key>", acc)
    EraseIf,       // if (contains(key)) erase(key)
    InplaceAdd,    // if (contains(key)) get(key).add_(1)
    TryView,       // try { acc.view({-1, n}) } catch { acc.reshape({-1, 1}) }, summed back to [B]
    Bincount,      // acc += bincount(acc.abs().long()).size(0)
    MadeLeaf,      // acc = acc * (a zeros tensor made requires_grad in the body) + acc
    kKinds
  };
  Kind kind;
  std::string key;
  double c = 1;
  int64_t n = 0;
  std::vector<Step> then, otherwise;
};

struct World {  // what one side (compiled or eager) runs on
  TensorDict td;
  at::Tensor captured;  // [1] double, captured by the body
  at::Tensor w;         // [1] double, requires grad, in CompileOptions::inputs
};

void run_steps(const std::vector<Step>& steps, TensorDict& td, World& world, at::Tensor& acc) {
  for (const Step& s : steps) {
    switch (s.kind) {
      case Step::AddKey:
        acc = acc + td.get(s.key).to(at::kDouble).sum(1) * s.c;
        break;
      case Step::IfContains:
        run_steps(td.contains(s.key) ? s.then : s.otherwise, td, world, acc);
        break;
      case Step::IfBatchAbove:
        run_steps(td.batch_size()[0] > s.n ? s.then : s.otherwise, td, world, acc);
        break;
      case Step::KeyCount:
        acc = acc + static_cast<double>(td.keys().size()) * s.c;
        break;
      case Step::Arange:
        acc = acc + at::arange(td.batch_size()[0], at::kDouble) * s.c;
        break;
      case Step::Randn:
        acc = acc + at::randn({td.batch_size()[0]}, at::kDouble) * s.c;
        break;
      case Step::Dropout:
        acc = at::dropout(acc, 0.5, /*train=*/true);
        break;
      case Step::Literal:
        acc = acc + at::tensor({s.c}, at::kDouble);
        break;
      case Step::ItemBranch:
        if (acc.sum().item<double>() > s.c)
          acc = acc * 2;
        else
          acc = acc - 1;
        break;
      case Step::EqualBranch:
        if (at::equal(acc, acc.abs())) acc = acc + 1;
        break;
      case Step::MaskCount:
        acc = acc + static_cast<double>(at::masked_select(acc, acc > 0).size(0));
        break;
      case Step::MaskSum:
        acc = acc + at::masked_select(acc, acc > 0).sum();
        break;
      case Step::NoGrad: {
        at::NoGradGuard no_grad;
        acc = acc * s.c;
        break;
      }
      case Step::Captured:
        acc = acc + world.captured * s.c;
        break;
      case Step::Param:
        acc = acc * world.w;
        break;
      case Step::SetKey:
        td.set("out/" + s.key, acc.detach().to(at::kFloat).unsqueeze(1));
        break;
      case Step::EraseIf:
        if (td.contains(s.key)) td.erase(s.key);
        break;
      case Step::InplaceAdd:
        if (td.contains(s.key)) td.get(s.key).add_(1);
        break;
      case Step::TryView: {
        at::Tensor v;
        try {
          v = acc.view({-1, s.n});
        } catch (const std::exception&) {
          v = acc.reshape({-1, 1});
        }
        acc = acc + v.sum() * s.c;
        break;
      }
      case Step::Bincount:
        acc = acc + static_cast<double>(at::bincount(acc.detach().abs().to(at::kLong)).size(0));
        break;
      case Step::MadeLeaf: {
        at::Tensor h = at::zeros({td.batch_size()[0]}, at::kDouble);
        h.requires_grad_(true);
        acc = acc * h + acc;
        break;
      }
      case Step::kKinds:
        break;
    }
  }
}

at::Tensor run_program(const std::vector<Step>& body, TensorDict& td, World& world) {
  at::Tensor acc = at::zeros({td.batch_size()[0]}, at::kDouble);
  run_steps(body, td, world, acc);
  return acc;
}

// A mutation between calls, applied to both worlds alike.
struct Mutation {
  enum Kind { None, Batch, AddKey, EraseKey, Retype, Captured, Param, NoGradCall, kKinds };
  Kind kind = None;
  std::string key;
  int64_t n = 0;
  double v = 0;
};

struct Program {
  std::vector<Step> body;
  std::vector<Mutation> schedule;  // one per call
};

std::string describe(const std::vector<Step>& steps, const std::string& indent) {
  static const char* names[] = {
      "add_key",  "if_contains", "if_batch_above", "key_count",    "arange",     "randn",
      "dropout",  "literal",     "item_branch",    "equal_branch", "mask_count", "mask_sum",
      "no_grad",  "captured",    "param",          "set_key",      "erase_if",   "inplace_add",
      "try_view", "bincount",    "made_leaf"};
  std::string out;
  for (const Step& s : steps) {
    out += indent + names[s.kind] + "(key=" + s.key + ", c=" + std::to_string(s.c) +
           ", n=" + std::to_string(s.n) + ")\n";
    if (!s.then.empty() || !s.otherwise.empty())
      out += indent + " then:\n" + describe(s.then, indent + "  ") + indent + " else:\n" +
             describe(s.otherwise, indent + "  ");
  }
  return out;
}

std::string describe(const Program& p) {
  static const char* names[] = {"none",   "batch",    "add_key", "erase_key",
                                "retype", "captured", "param",   "no_grad_call"};
  std::string out = "body:\n" + describe(p.body, "  ") + "calls (mutation before each):\n";
  for (const Mutation& m : p.schedule)
    out += std::string("  ") + names[m.kind] + "(key=" + m.key + ", n=" + std::to_string(m.n) +
           ", v=" + std::to_string(m.v) + ")\n";
  return out;
}

struct Gen {
  std::mt19937_64 rng;
  int64_t pick(int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); }
  double value() { return static_cast<double>(pick(7)) - 3; }
  const std::string& key() { return kKeys[pick(kKeys.size())]; }

  std::vector<Step> steps(int depth) {
    std::vector<Step> out(1 + pick(4));
    for (Step& s : out) {
      s.kind = static_cast<Step::Kind>(pick(Step::kKinds));
      s.key = key();
      s.c = value();
      s.n = 1 + pick(6);
      if ((s.kind == Step::IfContains || s.kind == Step::IfBatchAbove) && depth < 2) {
        s.then = steps(depth + 1);
        s.otherwise = steps(depth + 1);
      }
    }
    return out;
  }

  Program program() {
    Program p;
    p.body = steps(0);
    p.schedule.resize(3 + pick(8));
    for (Mutation& m : p.schedule) {
      m.kind = static_cast<Mutation::Kind>(pick(Mutation::kKinds));
      m.key = key();
      m.n = 2 + pick(6);
      m.v = value();
    }
    return p;
  }
};

// The data both worlds start from; rebuilt by Batch mutations.
TensorDict make_dict(int64_t rows, uint64_t seed) {
  TensorDict td({rows});
  for (size_t i = 0; i < kKeys.size(); ++i)
    td.set(kKeys[i],
           at::arange(rows * 2, at::kFloat).reshape({rows, 2}) * static_cast<double>(1 + i) -
               static_cast<double>(seed % 5));
  return td;
}

void mutate(World& w, const Mutation& m, uint64_t seed) {
  at::NoGradGuard no_grad;
  switch (m.kind) {
    case Mutation::Batch:
      w.td = make_dict(m.n, seed);
      break;
    case Mutation::AddKey:
      w.td.set(m.key, at::full({w.td.batch_size()[0], 3}, m.v, at::kFloat));
      break;
    case Mutation::EraseKey:
      if (w.td.contains(m.key)) w.td.erase(m.key);
      break;
    case Mutation::Retype:
      if (w.td.contains(m.key)) w.td.set(m.key, w.td.get(m.key).to(at::kDouble) + m.v);
      break;
    case Mutation::Captured:
      w.captured.fill_(m.v);
      break;
    case Mutation::Param:
      w.w.add_(m.v);
      break;
    default:
      break;
  }
}

bool same(const at::Tensor& a, const at::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         a.requires_grad() == b.requires_grad() &&
         at::allclose(a.detach(), b.detach(), 1e-6, 1e-9, /*equal_nan=*/true);
}

at::Tensor rng_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

void set_rng_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(state);
}

// Runs p compiled and eagerly; the first difference in words, or "".
std::string differs(const Program& p, uint64_t seed, CompileStats* stats) {
  World eager{make_dict(4, seed), at::ones({1}, at::kDouble), at::ones({1}, at::kDouble)};
  World comp{make_dict(4, seed), at::ones({1}, at::kDouble), at::ones({1}, at::kDouble)};
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_current_seed(seed);  // a program draws the same numbers on every run of it
  eager.w.requires_grad_(true);
  comp.w.requires_grad_(true);
  CompileOptions o = testing::no_persist();
  o.inputs = {comp.w};
  auto fn = compile(
      "fuzz_" + std::to_string(seed),
      [&p, &comp](TensorDict& td) { return run_program(p.body, td, comp); }, o);
  for (size_t call = 0; call < p.schedule.size(); ++call) {
    const Mutation& m = p.schedule[call];
    mutate(eager, m, seed);
    mutate(comp, m, seed);
    c10::AutoGradMode mode(m.kind != Mutation::NoGradCall);
    const std::string at = "call " + std::to_string(call) + ": ";
    at::Tensor rng = rng_state();
    at::Tensor want, got;
    std::string want_error, got_error;
    try {
      want = run_program(p.body, eager.td, eager);
    } catch (const std::exception& e) {
      want_error = typeid(e).name();
    }
    at::Tensor rng_after = rng_state();
    set_rng_state(rng);
    try {
      got = fn(comp.td);
    } catch (const std::exception& e) {
      got_error = typeid(e).name();
    }
    if (want_error != got_error)
      return at + "error " + (got_error.empty() ? "none" : got_error) + " vs eager " +
             (want_error.empty() ? "none" : want_error);
    if (!at::equal(rng_state(), rng_after))
      return at + "the random generator ends elsewhere than eager's";
    if (!same(got, want)) return at + "result differs";
    if (eager.td.keys() != comp.td.keys()) return at + "the dict's keys differ";
    for (const auto& k : eager.td.keys())
      if (!same(comp.td.get(k), eager.td.get(k))) return at + "key " + k + " differs";
    if (want.defined() && want.requires_grad()) {
      torch::autograd::backward({want.sum()});
      torch::autograd::backward({got.sum()});
      if (!same(comp.w.grad(), eager.w.grad())) return at + "the parameter's gradient differs";
    }
  }
  *stats = fn.stats();
  return "";
}

// Drops steps and mutations while the program still differs.
Program minimize(Program p, uint64_t seed) {
  CompileStats unused;
  auto still = [&](const Program& q) { return !differs(q, seed, &unused).empty(); };
  for (bool shrunk = true; shrunk;) {
    shrunk = false;
    for (size_t i = 0; p.body.size() > 1 && i < p.body.size(); ++i) {
      Program q = p;
      q.body.erase(q.body.begin() + static_cast<std::ptrdiff_t>(i));
      if (still(q)) p = std::move(q), shrunk = true;
    }
    for (size_t i = 0; p.schedule.size() > 1 && i < p.schedule.size(); ++i) {
      Program q = p;
      q.schedule.erase(q.schedule.begin() + static_cast<std::ptrdiff_t>(i));
      if (still(q)) p = std::move(q), shrunk = true;
    }
  }
  return p;
}

double env_number(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atof(v) : fallback;
}

TEST(CompileFuzz, CompiledCallsEqualEagerOnRandomBodiesAndMutations) {
  const double seconds = env_number("TDSTORE_FUZZ_SECONDS", 20);
  uint64_t seed = static_cast<uint64_t>(env_number("TDSTORE_FUZZ_SEED", 1));
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int64_t programs = 0, calls = 0, hits = 0, compiles = 0, failures = 0;
  while (std::chrono::steady_clock::now() < end || programs < 20) {
    Gen gen{std::mt19937_64(seed)};
    Program p = gen.program();
    CompileStats s;
    std::string why = differs(p, seed, &s);
    if (!why.empty()) {
      Program small = minimize(p, seed);
      ADD_FAILURE() << "seed " << seed << ": " << why << "; minimized: " << differs(small, seed, &s)
                    << "\nminimized reproducer (TDSTORE_FUZZ_SEED=" << seed << "):\n"
                    << describe(small);
      if (++failures >= 3) break;
    }
    ++programs;
    calls += static_cast<int64_t>(p.schedule.size());
    hits += s.hits;
    compiles += s.compiles;
    ++seed;
  }
  std::printf("compile fuzz: %lld programs, %lld calls, %lld compiles, %lld hits\n",
              static_cast<long long>(programs), static_cast<long long>(calls),
              static_cast<long long>(compiles), static_cast<long long>(hits));
  // Not vacuous: graphs were traced and served.
  EXPECT_GT(compiles, programs / 10);
  EXPECT_GT(hits, programs / 10);
}

}  // namespace
}  // namespace tdstore
