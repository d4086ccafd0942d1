// The engine under tdstore.compile (_CompiledEngine, CompileStats), the compile phase
// questions the Python side asks, and the keys graphs are sealed with (binding.h).
#include <pthread.h>

#include <condition_variable>
#include <memory>

#include "binding.h"
#include "walk_checks.h"

namespace tdstore::python {

namespace {

// Forks survived by this process's child side: a gate entered before a fork is free in the
// child (the thread inside is not there).
std::atomic<uint64_t> fork_generation{0};

struct PyCompiled {
  std::unique_ptr<tdstore::CompiledFunction> fn;
  // The thread inside call() and how deeply (its body calling the function again). The engine
  // holds the function's lock for a whole call, the body included, while the body runs with
  // the engine lock lent out; so another thread waits for the function here, before it takes
  // the engine lock and never holding it (lent out if held), and the body's own calls into
  // tdstore can always take the engine lock: no lock-order cycle.
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  std::thread::id inside;   // guarded by gate_mu
  int depth = 0;            // guarded by gate_mu
  uint64_t entered_in = 0;  // fork_generation when `inside` entered; guarded by gate_mu
};

// Enters a compiled function's gate for one call (see PyCompiled).
class Gate {
 public:
  explicit Gate(PyCompiled& c) : c_(c) {
    const auto me = std::this_thread::get_id();
    std::unique_lock g(c.gate_mu);
    auto free = [&] {
      return c.inside == std::thread::id() || c.entered_in != fork_generation.load();
    };
    if (c.inside == me && !free()) {
      ++c.depth;
      return;
    }
    if (!free()) {
      g.unlock();
      EngineLock::Lend lend;  // taken back after the GIL, once the function is ours
      {
        py::gil_scoped_release nogil;
        std::unique_lock w(c.gate_mu);
        c.gate_cv.wait(w, free);
        enter(me);
      }  // gate_mu is never held waiting for the GIL: a thread holding the GIL may want it
      return;
    }
    enter(me);
  }
  ~Gate() {
    std::lock_guard g(c_.gate_mu);
    if (--c_.depth > 0) return;
    c_.inside = std::thread::id();
    c_.gate_cv.notify_all();
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

 private:
  void enter(std::thread::id me) {
    c_.inside = me;
    c_.depth = 1;
    c_.entered_in = fork_generation.load();
  }
  PyCompiled& c_;
};

// A BaseException that is not an Exception (KeyboardInterrupt, SystemExit) raised by a compiled
// function's body, carried through the engine as no std::exception (see _CompiledEngine).
struct Interrupt {
  py::error_already_set error;
};

}  // namespace

void bind_compile(py::module_& m) {
  pthread_atfork(nullptr, nullptr, [] { ++fork_generation; });
  m.def(
      "_compile_phase",
      [](const TensorDict& td) {
        switch (tdstore::compile_phase(td)) {
          case tdstore::CompilePhase::Recording:
            return "recording";
          case tdstore::CompilePhase::Tracing:
            return "tracing";
          case tdstore::CompilePhase::None:
            break;
        }
        return "";
      },
      "What a compiled function's body runs for: \"recording\", \"tracing\" or \"\"",
      py::call_guard<EngineLock>());

  m.def(
      "_compile_unsupported",
      [](const TensorDict& td, const std::string& what) { tdstore::compile_unsupported(td, what); },
      py::call_guard<EngineLock>());

  m.def(
      "keyring_info",
      [] {
        tdstore::KeyringInfo k = tdstore::keyring_info();
        py::list keys;
        for (const auto& t : k.keys)
          keys.append(
              py::dict(py::arg("id") = t.id, py::arg("path") = t.path, py::arg("signs") = t.signs));
        return py::dict(py::arg("keys") = keys, py::arg("refused") = k.refused,
                        py::arg("graph_cache") = k.graph_cache);
      },
      "The keys this user signs and trusts compiled graphs with (tdstore/trust.h): "
      "{'keys': [{'id', 'path', 'signs'}], 'refused': [reasons], 'graph_cache': path}. Loads "
      "them, creating this user's own key, on first use",
      py::call_guard<EngineLock>());
  m.def("user_graph_cache", py::overload_cast<>(&tdstore::user_graph_cache),
        "This user's graph cache (tdstore/trust.h), created when missing: pass it as "
        "tdstore.compile(store=...) to keep a function's graphs there",
        py::call_guard<EngineLock>());
  m.def("create_key_file", &tdstore::create_key_file, py::arg("path"),
        "Writes a new random key (a team key to share) to path with mode 0600 and returns its "
        "id; tdstore.Error when path exists",
        py::call_guard<EngineLock>());

  m.def("_walk_checks_hold", &tdstore::python::walk_checks_hold, py::arg("attrs"),
        py::arg("globals"), py::arg("cells"), py::arg("dicts"), py::arg("lists"),
        py::arg("missing"),
        "Whether every place a compile walk read still holds the object it found "
        "(tdstore._walk.Walk.still_holds)");

  // tdstore.compile's defaults are the C++ CompileOptions' (one owner: python/tdstore/_compile.py
  // reads them here).
  const tdstore::CompileOptions defaults;
  m.attr("_compile_defaults") =
      py::dict(py::arg("cache_limit") = defaults.cache_limit, py::arg("persist") = defaults.persist,
               py::arg("check_first_run") = defaults.check_first_run,
               py::arg("dynamic_batch") = defaults.dynamic_batch,
               py::arg("code_identity") = defaults.code_identity);

  py::class_<tdstore::CompileStats>(
      m, "CompileStats", "What a compiled function's calls did (CompiledFunction.stats())")
      .def(py::init<>(), "All counts zero")
      .def_readonly("compiles", &tdstore::CompileStats::compiles, "Graphs traced in this process")
      .def_readonly("loads", &tdstore::CompileStats::loads,
                    "Graphs loaded from a store's catalog instead of traced")
      .def_readonly("hits", &tdstore::CompileStats::hits, "Calls served by a cached graph")
      .def_readonly("fallbacks", &tdstore::CompileStats::fallbacks,
                    "Calls run eagerly (limit reached, untraceable function)")
      .def_readonly("entries", &tdstore::CompileStats::entries, "Graphs cached now")
      .def(
          "__repr__",
          [](const tdstore::CompileStats& s) {
            return "CompileStats(compiles=" + std::to_string(s.compiles) +
                   ", loads=" + std::to_string(s.loads) + ", hits=" + std::to_string(s.hits) +
                   ", fallbacks=" + std::to_string(s.fallbacks) +
                   ", entries=" + std::to_string(s.entries) + ")";
          },
          R"doc(CompileStats(compiles=..., loads=..., hits=..., fallbacks=..., entries=...).)doc");

  // The engine under tdstore.compile (python/tdstore/_compile.py): `body(td)` runs the user's
  // function and returns (tensors, structure); call() takes the graph inputs and context the
  // Python side found for this call and returns (tensors, structure).
  py::class_<PyCompiled>(m, "_CompiledEngine")
      .def(py::init([](py::function body, const std::string& name, const std::string& code_identity,
                       int64_t cache_limit, bool persist, py::object store, bool check_first_run,
                       bool dynamic_batch) {
             tdstore::CompileOptions o;
             o.code_identity = code_identity;
             o.cache_limit = cache_limit;
             o.persist = persist;
             if (!store.is_none()) o.store = store.cast<std::string>();
             o.check_first_run = check_first_run;
             o.dynamic_batch = dynamic_batch;
             auto c = std::make_unique<PyCompiled>();
             PyCallable f(body);  // called by the engine without the GIL: takes it for the body
             c->fn =
                 std::make_unique<tdstore::CompiledFunction>(tdstore::CompiledFunction::structured(
                     name,
                     [f](TensorDict& td) {
                       py::gil_scoped_acquire gil;
                       // Threads the body starts and waits for may call tdstore: the guards
                       // come from the answers this thread's calls got (src/recording.h).
                       EngineLock::Lend lend;
                       py::tuple r;
                       try {
                         r = f.object()(td);
                       } catch (py::error_already_set& e) {
                         // Ctrl-C (or exit) while the body runs under the tracer must reach
                         // the caller: thrown as no std::exception, no engine code catches it.
                         if (!e.matches(PyExc_Exception)) throw Interrupt{std::move(e)};
                         throw;
                       }
                       tdstore::CallResult out;
                       for (const auto& t : r[0]) out.tensors.push_back(t.cast<at::Tensor>());
                       out.structure = r[1].cast<std::string>();
                       if (!r[2].is_none()) {
                         out.made.emplace();
                         for (const auto& t : r[2]) out.made->push_back(t.cast<at::Tensor>());
                       }
                       return out;
                     },
                     o));
             return c;
           }),
           py::arg("body"), py::arg("name"), py::arg("code_identity"), py::arg("cache_limit"),
           py::arg("persist"), py::arg("store"), py::arg("check_first_run"),
           py::arg("dynamic_batch"))
      .def("call",
           [](PyCompiled& c, TensorDict& td, std::vector<at::Tensor> inputs, std::string context,
              std::string eager_reason) {
             Gate gate(c);  // first: never waited for holding the engine lock
             EngineLock lock;
             tdstore::CallState state{std::move(inputs), std::move(context),
                                      std::move(eager_reason)};
             tdstore::CallResult r;
             try {
               py::gil_scoped_release nogil;  // guard check and graph run; a miss re-takes it
               r = c.fn->call(td, state);
             } catch (Interrupt& i) {
               throw std::move(i.error);
             }
             return py::make_tuple(py::cast(r.tensors), r.structure);
           })
      .def("stats",
           [](const PyCompiled& c) {
             py::gil_scoped_release nogil;
             return c.fn->stats();
           })
      .def("explain",
           [](const PyCompiled& c) {
             py::gil_scoped_release nogil;
             return c.fn->explain();
           })
      .def_property_readonly("name", [](const PyCompiled& c) { return c.fn->name(); });
}

}  // namespace tdstore::python
