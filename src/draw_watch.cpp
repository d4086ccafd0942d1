// Per-thread draw counting through a thread-local RecordFunction callback. Contract in
// src/draw_watch.h.
#include "src/draw_watch.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/function_schema.h>

#include <mutex>

namespace tdstore::detail {

namespace {

thread_local uint64_t draws = 0;

bool takes_generator(const c10::FunctionSchema& schema) {
  for (const auto& arg : schema.arguments()) {
    c10::TypePtr t = arg.type();
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    if (t->kind() == c10::TypeKind::GeneratorType) return true;
  }
  return false;
}

std::unique_ptr<at::ObserverContext> count_draw(const at::RecordFunction& fn) {
  if (auto schema = fn.operator_schema(); schema && takes_generator(*schema)) ++draws;
  return nullptr;
}

}  // namespace

at::Tensor default_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard lock(gen.mutex());
  return gen.get_state();
}

void set_default_rng_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard lock(gen.mutex());
  gen.set_state(state);
}

DrawWatch::DrawWatch()
    : handle_(at::addThreadLocalCallback(
          at::RecordFunctionCallback(count_draw).scopes({at::RecordScope::FUNCTION}))),
      start_(draws) {}

DrawWatch::~DrawWatch() { at::removeCallback(handle_); }

bool DrawWatch::drew() const { return draws != start_; }

RngRestore::RngRestore() : state_(default_rng_state()) {}

RngRestore::~RngRestore() {
  if (watch_.drew()) set_default_rng_state(state_);
}

}  // namespace tdstore::detail
