#include "src/graph_checks.h"

#include <fmt/format.h>
#include <torch/csrc/jit/ir/ir.h>

#include <string_view>
#include <unordered_set>

namespace tdstore::detail {
namespace {

bool uninitialized_factory(c10::Symbol kind) {
  static const std::unordered_set<std::string_view> names = {
      "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
      "aten::new_empty_strided"};
  return names.count(kind.toQualString()) > 0;
}

// Operations that write every element of their first argument without reading it.
bool overwrites_self(c10::Symbol kind) {
  static const std::unordered_set<std::string_view> names = {
      "aten::fill_",    "aten::zero_",       "aten::copy_",      "aten::normal_",
      "aten::uniform_", "aten::random_",     "aten::bernoulli_", "aten::exponential_",
      "aten::cauchy_",  "aten::log_normal_", "aten::geometric_"};
  return names.count(kind.toQualString()) > 0;
}

// Whether the first use of v writes all of it: an overwrite with v as its first argument, or an
// operation with v as its `out` argument.
bool first_use_writes(const torch::jit::Value* v) {
  const torch::jit::Use* first = nullptr;
  for (const auto& u : v->uses())
    if (!first || u.user->isBefore(first->user)) first = &u;
  if (!first) return true;  // never used
  const torch::jit::Node* n = first->user;
  if (n->kind() == c10::prim::Return) return false;
  if (overwrites_self(n->kind()) && first->offset == 0) return true;
  if (const c10::FunctionSchema* s = n->maybeSchema(); s && first->offset < s->arguments().size())
    return s->arguments()[first->offset].name() == "out";
  return false;
}

std::string describe(const at::Tensor& t) {
  if (t.dim() == 0) return fmt::format("a {} scalar tensor", c10::toString(t.scalar_type()));
  return fmt::format("a {} {} tensor", c10::toString(t.scalar_type()), fmt::join(t.sizes(), "x"));
}

}  // namespace

std::string unreplayable(const torch::jit::Graph& graph,
                         const std::optional<std::vector<at::Tensor>>& made) {
  std::unordered_set<const c10::StorageImpl*> literals;
  if (made)
    for (const auto& t : *made)
      if (t.defined() && t.has_storage()) literals.insert(t.storage().unsafeGetStorageImpl());
  for (const torch::jit::Node* n : graph.nodes()) {
    if (n->kind() == c10::prim::Constant && n->output()->type()->cast<c10::TensorType>()) {
      at::Tensor t = torch::jit::toIValue(n->output())->toTensor();
      if (!t.defined() || !t.has_storage()) continue;
      // A Python number an operation took (x * 2.0) is a wrapped number the tracer made.
      const bool number = t.unsafeGetTensorImpl()->is_wrapped_number();
      if (!t.storage().resizable())
        return fmt::format(
            "holds {} over memory it does not own (from_blob, or a tensor of another dict): "
            "its bytes may change or be gone by the next call",
            describe(t));
      // A C++ body (no `made`) makes no tensor outside the tracer that is not caught below:
      // every other constant is a tensor it captured, whose value no guard holds.
      if (!made && !number)
        return fmt::format(
            "holds {} the body captured (a constant of the trace, whose value no guard holds): "
            "pass it in CompileOptions::inputs",
            describe(t));
      if (made && !number && !literals.count(t.storage().unsafeGetStorageImpl()))
        return fmt::format(
            "reads {} the traced run did not make, from a place no guard covers (a gradient, a "
            "tensor in a container the compile cannot summarize, a cast autocast cached): the "
            "trace would bake it in",
            describe(t));
    }
    if (uninitialized_factory(n->kind()) && !first_use_writes(n->output()))
      return "reads memory the trace never writes (a tensor filled outside the tracer, such as "
             "at::tensor({...}) in C++: build it with at::arange or at::full, or pass it in "
             "CompileOptions::inputs)";
  }
  return "";
}

}  // namespace tdstore::detail
