// Operator watching through a thread-local RecordFunction callback. Contract in src/run_watch.h.
#include "src/run_watch.h"

#include <ATen/TracerMode.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <string_view>
#include <unordered_set>

#include "src/guard.h"

namespace tdstore::detail {

// Invariant: `depth` counts the operators started and not yet ended since the watch was made
// (start and end callbacks pair up: an operator started before the callback existed calls
// neither); an operator at depth 1 is one the body (or the dict's own code it called) ran.
struct RunWatch::Scope {
  std::string* why;
  int depth;
  bool grad_mode;
  std::string ambient;
  Scope* outer;        // the watch this one is nested in (none in practice), restored after it
  int unwatched = 0;   // RunWatch::Unwatched scopes open
  int fixed_size = 0;  // FixedSize operators started and not ended
};

namespace {

thread_local RunWatch::Scope* active = nullptr;

// Operators that hand a tensor's value to C++ (Tensor::item, bool(), at::equal, at::allclose).
bool reads_value(std::string_view op) {
  static const std::unordered_set<std::string_view> ops = {
      "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal",
      "aten::allclose"};
  return ops.count(op) > 0;
}

// Operators whose result's size depends on tensor values (also inside another operator: a
// boolean-mask index runs nonzero). repeat_interleave's size does only with a tensor of counts
// (its int overload is fixed-size), tensor_split's only with a tensor of split points;
// one_hot's only without num_classes, which is not told apart here: one_hot runs eagerly.
std::string overload_of(const at::RecordFunction& fn) {
  auto name = fn.operator_name();
  return name ? name->overload_name : "";
}

bool sized_by_values(const at::RecordFunction& fn, std::string_view op) {
  static const std::unordered_set<std::string_view> ops = {"aten::nonzero",
                                                           "aten::nonzero_numpy",
                                                           "aten::argwhere",
                                                           "aten::masked_select",
                                                           "aten::unique",
                                                           "aten::_unique",
                                                           "aten::_unique2",
                                                           "aten::unique_dim",
                                                           "aten::unique_consecutive",
                                                           "aten::unique_dim_consecutive",
                                                           "aten::bincount",
                                                           "aten::one_hot"};
  if (ops.count(op)) return true;
  if (op != "aten::repeat_interleave" && op != "aten::tensor_split") return false;
  return op == "aten::repeat_interleave" ? overload_of(fn) != "self_int"
                                         : overload_of(fn) == "tensor_indices_or_sections";
}

// Marks an operator whose result's size is fixed by its arguments though it runs one sized by
// values inside (repeat_interleave with an int count runs the tensor-count overload).
struct FixedSize : at::ObserverContext {};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  RunWatch::Scope* s = active;
  if (!s) return nullptr;
  const int depth = ++s->depth;
  const std::string_view op = fn.name();
  if (op == "aten::repeat_interleave" && overload_of(fn) == "self_int") {
    ++s->fixed_size;
    return std::make_unique<FixedSize>();
  }
  if (!s->why->empty() || s->unwatched > 0) return nullptr;
  if (depth == 1 && reads_value(op))
    *s->why = fmt::format(
        "reads a tensor's value into C++ ({}: item(), a bool of a tensor, at::equal): a trace "
        "would bake it in",
        op);
  else if (s->fixed_size == 0 && sized_by_values(fn, op))
    *s->why = fmt::format(
        "runs {}, whose result's size depends on tensor values: a size read into C++ would be "
        "baked into the trace",
        op);
  else if (depth == 1 &&
           (c10::GradMode::is_enabled() != s->grad_mode || ambient_state() != s->ambient))
    *s->why = fmt::format(
        "runs {} under another grad mode, inference mode, autocast or default dtype than the "
        "call's (a NoGradGuard or InferenceMode in the body): the graph would run under the "
        "caller's",
        op);
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  RunWatch::Scope* s = active;
  if (!s) return;
  --s->depth;
  if (dynamic_cast<FixedSize*>(ctx)) --s->fixed_size;
}

}  // namespace

bool RunWatch::watched_or_traced() {
  return active != nullptr || at::tracer::impl::is_dispatch_enabled();
}

RunWatch::RunWatch()
    : handle_(at::addThreadLocalCallback(
          at::RecordFunctionCallback(on_start, on_end).scopes({at::RecordScope::FUNCTION}))),
      scope_(new Scope{&why_, 0, c10::GradMode::is_enabled(), ambient_state(), active, 0, 0}) {
  active = scope_.get();
}

RunWatch::Unwatched::Unwatched() : scope_(active) {
  if (scope_) ++scope_->unwatched;
}

RunWatch::Unwatched::~Unwatched() {
  if (scope_) --scope_->unwatched;
}

RunWatch::~RunWatch() {
  active = scope_->outer;
  at::removeCallback(handle_);
}

}  // namespace tdstore::detail
