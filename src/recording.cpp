#include "src/recording.h"

#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>

#include "src/tensordict_impl.h"

namespace tdstore::detail {
namespace {

std::string string_literal(std::string_view key) { return fmt::format("\"{}\"", key); }

std::string describe(Event::Op op, const std::string& key, uint8_t sub) {
  switch (op) {
    case Event::Op::Read:
      return fmt::format("get({})", string_literal(key));
    case Event::Op::Query:
      return fmt::format("{}({})", query_name(static_cast<Query>(sub)), string_literal(key));
    case Event::Op::BatchSize:
      return "batch_size()";
    case Event::Op::Set:
      return fmt::format("set({})", string_literal(key));
    case Event::Op::Erase:
      return fmt::format("erase({})", string_literal(key));
    case Event::Op::Lazy:
      return fmt::format("get_or_compute({})", string_literal(key));
  }
  return "?";
}

uint8_t sub_of(const Event& e) {
  if (e.op == Event::Op::Read) return static_cast<uint8_t>(e.read);
  if (e.op == Event::Op::Query) return static_cast<uint8_t>(e.query);
  return 0;
}

// Errors whose cause a guard cannot see (a full key directory, I/O): not modelled.
bool modelled(ErrorKind kind) { return kind != ErrorKind::Capacity && kind != ErrorKind::Other; }

}  // namespace

at::Tensor trace_copy(const at::Tensor& t) {
  at::Tensor c = t.detach().clone(at::MemoryFormat::Preserve);
  if (t.requires_grad()) c.requires_grad_(true);
  return c;
}

// ------------------------------------------------------------------------------ Recorder

Recorder::Recorder(const TensorDict& root, const std::string& prefix,
                   const std::vector<at::Tensor>& extra)
    : Observer(&Access::impl(root)), impl_(Access::impl(root)) {
  rec_.guard.prefix = prefix;
  rec_.guard.grad_mode = at::GradMode::is_enabled();
  for (const auto& t : extra) rec_.guard.extra_inputs.push_back(TensorSpec::of(t));
}

bool Recorder::touched(const std::string& key) const {
  if (touched_.count(key)) return true;
  std::string_view owner = storage::ragged_owner(key);
  return !owner.empty() && touched_.count(std::string(owner));
}

void Recorder::touch(const std::string& key, bool present) {
  if (touched_.insert(key).second) order_.push_back(key);
  final_[key] = present;
}

void Recorder::observe(Query q, const std::string& key, const Answer& answer,
                       std::optional<Failure> failure) {
  if (!guarded_.insert(fmt::format("Q{}\x01{}", static_cast<int>(q), key)).second) return;
  Observation o;
  o.kind = Observation::Kind::Query;
  o.query = q;
  o.key = key;
  o.failure = std::move(failure);
  if (!o.failure) o.answer = untouched_answer(q, key, answer, &o.exclude);
  rec_.guard.observations.push_back(std::move(o));
}

Answer Recorder::untouched_answer(Query q, const std::string& prefix, const Answer& answer,
                                  std::vector<std::string>* exclude) const {
  if (q != Query::HasPrefix && q != Query::Keys && q != Query::Count) return answer;
  for (auto it = touched_.lower_bound(prefix);
       it != touched_.end() && it->compare(0, prefix.size(), prefix) == 0; ++it)
    exclude->push_back(*it);
  if (exclude->empty()) return answer;
  std::vector<std::string> keys = impl_.keys_under(prefix);
  std::erase_if(keys, [&](const std::string& k) { return touched_.count(k) > 0; });
  if (q == Query::HasPrefix) return !keys.empty();
  if (q == Query::Count) return static_cast<int64_t>(keys.size());
  return keys;
}

void Recorder::precondition(Query q, const std::string& key) {
  try {
    observe(q, key, ask(impl_, q, key), std::nullopt);
  } catch (const Error& e) {
    observe(q, key, Answer(), Failure{error_kind(e), e.what()});
  }
}

void Recorder::fail(Event e, const Error& error) {
  e.failure = Failure{error_kind(error), error.what()};
  rec_.tape.push_back(std::move(e));
}

at::Tensor Recorder::read(ReadKind kind, const std::string& key, FunctionRef<at::Tensor()> real) {
  Event e;
  e.op = Event::Op::Read;
  e.read = kind;
  e.key = key;
  const bool own = touched(key);
  const std::string id = fmt::format("{}\x01{}", static_cast<int>(kind), key);
  at::Tensor t;
  try {
    t = real();
  } catch (const Error& err) {
    if (!own && guarded_.insert("R" + id).second) {
      Observation o;
      o.kind = Observation::Kind::Read;
      o.read = kind;
      o.key = key;
      o.failure = Failure{error_kind(err), err.what()};
      rec_.guard.observations.push_back(std::move(o));
    }
    fail(std::move(e), err);
    throw;
  }
  if (!own) {
    auto [it, fresh] = inputs_.emplace(id, static_cast<int64_t>(rec_.inputs.size()));
    if (fresh) {
      Observation o;
      o.kind = Observation::Kind::Read;
      o.read = kind;
      o.key = key;
      o.spec = TensorSpec::of(t);
      rec_.guard.observations.push_back(std::move(o));
      rec_.inputs.push_back(trace_copy(t));
      rec_.originals.push_back(t);
    }
    e.input = it->second;
  }
  rec_.tape.push_back(std::move(e));
  return t;
}

Answer Recorder::query(Query q, const std::string& key, FunctionRef<Answer()> real) {
  Event e;
  e.op = Event::Op::Query;
  e.query = q;
  e.key = key;
  const bool dependent = (q != Query::Contains && q != Query::IsRagged) || !touched(key);
  try {
    e.answer = real();
  } catch (const Error& err) {
    if (dependent) observe(q, key, Answer(), Failure{error_kind(err), err.what()});
    fail(std::move(e), err);
    throw;
  }
  if (dependent) observe(q, key, e.answer, std::nullopt);
  Answer a = e.answer;
  rec_.tape.push_back(std::move(e));
  return a;
}

const std::vector<int64_t>& Recorder::batch_size(FunctionRef<const std::vector<int64_t>&()> real) {
  const std::vector<int64_t>& b = real();
  Event e;
  e.op = Event::Op::BatchSize;
  e.answer = b;
  observe(Query::BatchSize, "", e.answer, std::nullopt);
  rec_.tape.push_back(std::move(e));
  return b;
}

void Recorder::set(const std::string& key, const at::Tensor&, FunctionRef<void()> real) {
  // What the outcome of a set depends on: what set() asks (for_each_set_question).
  for_each_set_question(key, [&](Query q, const std::string& arg) {
    if (q != Query::Contains || !touched(arg)) precondition(q, arg);  // else the call decided it
  });
  for (const auto& p : pending_)
    if (std::find(p.deps.begin(), p.deps.end(), key) != p.deps.end())
      unsupported(fmt::format("set({}) while computing lazy property {}, which depends on it",
                              string_literal(key), string_literal(p.key)));
  Event e;
  e.op = Event::Op::Set;
  e.key = key;
  try {
    real();
  } catch (const Error& err) {
    if (!modelled(error_kind(err)))
      unsupported(fmt::format("set({}), which threw {}", string_literal(key), err.what()));
    fail(std::move(e), err);
    throw;
  }
  rec_.tape.push_back(std::move(e));
  auto it = std::find_if(pending_.rbegin(), pending_.rend(),
                         [&](const PendingLazy& p) { return p.key == key; });
  if (it != pending_.rend()) {
    LazyInfo info;
    info.key = key;
    for (const auto& d : it->deps) info.deps.emplace_back(d, 0);
    info.version = it->version;
    lazy_writes_[key] = std::move(info);
    pending_.erase(std::next(it).base(), pending_.end());
  } else {
    lazy_writes_.erase(key);
  }
  touch(key, true);
}

void Recorder::erase(const std::string& key, FunctionRef<void()> real) {
  precondition(Query::IsWritable, "");
  if (!touched(key)) precondition(Query::Contains, key);
  for (const auto& p : pending_)
    if (std::find(p.deps.begin(), p.deps.end(), key) != p.deps.end())
      unsupported(fmt::format("erase({}) while computing lazy property {}, which depends on it",
                              string_literal(key), string_literal(p.key)));
  Event e;
  e.op = Event::Op::Erase;
  e.key = key;
  try {
    real();
  } catch (const Error& err) {
    if (!modelled(error_kind(err)))
      unsupported(fmt::format("erase({}), which threw {}", string_literal(key), err.what()));
    fail(std::move(e), err);
    throw;
  }
  rec_.tape.push_back(std::move(e));
  lazy_writes_.erase(key);
  touch(key, false);
}

bool Recorder::lazy(const std::string& key, const std::vector<std::string>& deps,
                    std::string_view version, FunctionRef<bool()> real) {
  for (const auto& d : deps)
    if (touched(d))
      unsupported(fmt::format(
          "get_or_compute({}) after writing its dependency {} (validity then depends on values)",
          string_literal(key), string_literal(d)));
  const bool own = touched(key);
  if (own && !lazy_writes_.count(key))
    unsupported(fmt::format("get_or_compute({}) after writing that key", string_literal(key)));
  Event e;
  e.op = Event::Op::Lazy;
  e.key = key;
  std::string id = fmt::format("L{}\x01{}", key, version);
  for (const auto& d : deps) id += "\x01" + d;
  auto observe_lazy = [&](std::optional<Failure> failure, bool valid) {
    if (own || !guarded_.insert(id).second) return;
    Observation o;
    o.kind = Observation::Kind::Lazy;
    o.key = key;
    o.deps = deps;
    o.version = std::string(version);
    o.failure = std::move(failure);
    if (!o.failure) o.answer = valid;
    rec_.guard.observations.push_back(std::move(o));
  };
  bool valid;
  try {
    valid = real();
  } catch (const Error& err) {
    observe_lazy(Failure{error_kind(err), err.what()}, false);
    fail(std::move(e), err);
    throw;
  }
  observe_lazy(std::nullopt, valid);
  e.answer = valid;
  rec_.tape.push_back(std::move(e));
  if (valid) {
    ++rec_.effects.lazy_reuses;
  } else {
    if (impl_.persistent() && !impl_.store->writable())
      unsupported(fmt::format("get_or_compute({}) computing on a read-only store (kept in memory)",
                              string_literal(key)));
    pending_.push_back({key, deps, std::string(version)});
  }
  return valid;
}

void Recorder::unsupported(std::string_view what) {
  if (rec_.unsupported.empty()) rec_.unsupported = "calls " + std::string(what);
}

Recording Recorder::finish(int64_t returns) {
  Effects& e = rec_.effects;
  e.returns = returns;
  for (const auto& k : order_) {
    if (!final_.at(k))
      e.erases.push_back(k);
    else if (auto it = lazy_writes_.find(k); it != lazy_writes_.end())
      e.lazy.push_back(it->second);
    else
      e.writes.push_back(k);
  }
  return std::move(rec_);
}

// ------------------------------------------------------------------------------ Replayer

Replayer::Replayer(const TensorDict& root, const Recording& rec, std::vector<at::Tensor> inputs)
    : Observer(&Access::impl(root)),
      rec_(rec),
      inputs_(std::move(inputs)),
      persistent_(Access::impl(root).persistent()) {}

const Event& Replayer::next(Event::Op op, const std::string& key, uint8_t sub) {
  if (pos_ >= rec_.tape.size())
    throw Error(
        fmt::format("under the tracer the function called {} after all the calls of its eager run",
                    describe(op, key, sub)));
  const Event& e = rec_.tape[pos_];
  if (e.op != op || e.key != key || sub_of(e) != sub)
    throw Error(fmt::format("under the tracer the function called {} where its eager run called {}",
                            describe(op, key, sub), describe(e.op, e.key, sub_of(e))));
  ++pos_;
  if (e.failure) throw_error(e.failure->kind, e.failure->message);
  return e;
}

at::Tensor Replayer::read(ReadKind kind, const std::string& key, FunctionRef<at::Tensor()>) {
  const Event& e = next(Event::Op::Read, key, static_cast<uint8_t>(kind));
  if (e.input >= 0) return inputs_.at(static_cast<size_t>(e.input));
  auto it = overlay_.find(key);
  if (it == overlay_.end() || !it->second.defined())
    throw Error(fmt::format("under the tracer the function read {} before writing it",
                            string_literal(key)));
  return it->second;
}

Answer Replayer::query(Query q, const std::string& key, FunctionRef<Answer()>) {
  return next(Event::Op::Query, key, static_cast<uint8_t>(q)).answer;
}

const std::vector<int64_t>& Replayer::batch_size(FunctionRef<const std::vector<int64_t>&()>) {
  return std::get<std::vector<int64_t>>(next(Event::Op::BatchSize, "", 0).answer);
}

void Replayer::set(const std::string& key, const at::Tensor& value, FunctionRef<void()>) {
  next(Event::Op::Set, key, 0);
  // A store keeps a copy of what was set; an in-memory dict keeps the tensor itself.
  overlay_[key] = persistent_ ? value.clone() : value;
}

void Replayer::erase(const std::string& key, FunctionRef<void()>) {
  next(Event::Op::Erase, key, 0);
  overlay_[key] = at::Tensor();
}

bool Replayer::lazy(const std::string& key, const std::vector<std::string>&, std::string_view,
                    FunctionRef<bool()>) {
  return std::get<bool>(next(Event::Op::Lazy, key, 0).answer);
}

void Replayer::unsupported(std::string_view what) {
  throw Error(
      fmt::format("under the tracer the function called {}, which its eager run did not", what));
}

std::vector<at::Tensor> Replayer::outputs(const std::vector<at::Tensor>& returned) const {
  if (pos_ != rec_.tape.size())
    throw Error(
        fmt::format("under the tracer the function stopped before {}",
                    describe(rec_.tape[pos_].op, rec_.tape[pos_].key, sub_of(rec_.tape[pos_]))));
  if (static_cast<int64_t>(returned.size()) != rec_.effects.returns)
    throw Error(fmt::format("under the tracer the function returned {} tensor(s), eagerly {}",
                            returned.size(), rec_.effects.returns));
  std::vector<at::Tensor> out = returned;
  auto final_value = [&](const std::string& key) {
    auto it = overlay_.find(key);
    if (it == overlay_.end() || !it->second.defined())
      throw Error(
          fmt::format("under the tracer the function did not write {}", string_literal(key)));
    return it->second;
  };
  for (const auto& k : rec_.effects.writes) out.push_back(final_value(k));
  for (const auto& l : rec_.effects.lazy) out.push_back(final_value(l.key));
  return out;
}

}  // namespace tdstore::detail
