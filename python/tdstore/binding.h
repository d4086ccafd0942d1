// What the binding's files share (python/tdstore/bind_*.cpp, one per Python class or
// concern, and _tdstore.cpp, the module): the engine lock, Python callables the engine calls,
// the conversions of Python values, keys and indices, and each file's bind_* function.
// Internal to the extension.
//
// GIL: released around every call that touches the disk, waits or runs a graph (commit,
// refresh, verify, append, set of a tensor, lazy properties, loader iteration and teardown, a
// compiled call, and the stats/explain calls that take a compiled function's lock), and
// re-acquired by every callback into Python (a compiled function's body, a lazy property's or
// a row feature's fn, on whichever thread the engine calls it). No C++ lock is ever waited for
// with the GIL held, so a thread holding an engine lock can always get the GIL: no deadlock.
// Python objects held by C++ callbacks are released under the GIL (PyCallable).
//
// Threads: every call on a TensorDict, its attributes, a Dataset or a compiled function runs
// under EngineLock, so Python threads sharing a handle never run two engine calls on it at once;
// the lock is lent out while a lazy property's function or a compiled function's body runs
// (EngineLock::Lend), so threads such a callback waits for can call tdstore.
#pragma once

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>  // paths as str or os.PathLike
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>  // the at::Tensor caster; not torch/extension.h (build time)

#include <atomic>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "tdstore/tdstore.h"

namespace py = pybind11;
using tdstore::TensorDict;

namespace tdstore::python {

// An argument of the wrong type (tdstore.ArgumentTypeError, also a TypeError): the engine's C++
// types make such a call impossible, so only the binding throws it.
class ArgumentTypeError : public tdstore::Error {
 public:
  using tdstore::Error::Error;
};

// Serializes every call into a dict or dataset handle made from Python: the engine allows one
// mutating call at a time on a handle (tensordict.h, "Thread safety") and Python threads may
// make them at once, with the GIL released around the I/O. One process-wide lock, as h5py's:
// recursive (a lazy property's or a compiled function's body uses the dict again on the same
// thread), and waited for without the GIL (its holder may need the GIL for such a body).
// Loader iteration does not take it: its workers run row features that do; the loader's own
// writes into its source (row features stored) take it (LoaderOptions::serialize_writes).
class EngineLock {
 public:
  // `gil_held`: false on a thread that does not hold the GIL (it waits for the lock as it is).
  explicit EngineLock(bool gil_held = true) {
    State& s = *state();
    if (s.owner.load() == std::this_thread::get_id()) {  // a body using the dict again
      ++s.depth;
      return;
    }
    if (!s.mu.try_lock()) {
      std::optional<py::gil_scoped_release> nogil;
      if (gil_held) nogil.emplace();
      s.mu.lock();
    }
    s.owner = std::this_thread::get_id();
    s.depth = 1;
  }
  ~EngineLock() {
    State& s = *state();
    if (--s.depth > 0) return;
    s.owner = std::thread::id();
    s.mu.unlock();
  }
  EngineLock(const EngineLock&) = delete;
  EngineLock& operator=(const EngineLock&) = delete;

  // Lends the lock out for a scope, on a thread that holds it (a no-op on one that does not):
  // a lazy property's function runs without it, so threads it starts and waits for (a
  // ThreadPoolExecutor reading the dict) take it as any other thread does, instead of waiting
  // forever for a caller that waits for them. The engine holds none of its own locks around
  // that function and checks afterwards that no dependency changed while it ran (tensordict.h,
  // get_or_compute). Taken back, as EngineLock waits, when the scope ends.
  class Lend {
   public:
    explicit Lend(bool gil_held = true) : gil_held_(gil_held) {
      State& s = *state();
      if (s.owner.load() != std::this_thread::get_id()) return;
      depth_ = std::exchange(s.depth, 0);
      s.owner = std::thread::id();
      s.mu.unlock();
    }
    ~Lend() {
      if (depth_ == 0) return;
      State& s = *state();
      if (!s.mu.try_lock()) {
        std::optional<py::gil_scoped_release> nogil;
        if (gil_held_) nogil.emplace();
        s.mu.lock();
      }
      s.owner = std::this_thread::get_id();
      s.depth = depth_;
    }
    Lend(const Lend&) = delete;
    Lend& operator=(const Lend&) = delete;

   private:
    bool gil_held_;
    int depth_ = 0;
  };

  // pthread_atfork child handler: a lock held by another thread of the parent would be held
  // forever in the child, which has only the forking thread; the child gets a fresh one.
  static void after_fork_in_child() {
    if (state()->owner.load() != std::this_thread::get_id()) state() = new State;  // old leaks
  }

 private:
  struct State {
    std::mutex mu;
    std::atomic<std::thread::id> owner{};
    int depth = 0;  // written only by the owner
  };
  static State*& state() {
    static State* s = new State;  // leaked: used until the interpreter exits
    return s;
  }
};

// A property getter of a handle of type T, under EngineLock.
template <class T, class F>
auto locked(F f) {
  return [f](const T& self) {
    EngineLock lock;
    return std::invoke(f, self);
  };
}

// Conversions (binding_values.cpp).
// A str's UTF-8; KeyError for one that has none (a lone surrogate, e.g. from a file name
// decoded with surrogateescape).
std::string utf8_of(const py::handle& s);
// "a/b" from "a/b" or ("a", "b").
std::string key_of(const py::handle& k);
bool is_key(const py::handle& k);  // a str or a non-empty tuple of str
std::string type_name(const py::handle& v);
// torch.Tensor from a tensor, a numpy array or anything torch.as_tensor takes; `what` names the
// value in errors (e.g. "key 'obs'"). A numpy array in another byte order or with negative
// strides is stored converted (the same values); one of Python objects, strings or an unsigned
// type libtorch 1.13 lacks is refused, as is anything torch.as_tensor rejects: DTypeError.
at::Tensor tensor_of(const py::handle& v, const std::string& what = "the value");
// A Python int in [0, 2^64): ArgumentError naming `what` otherwise (a negative seed).
uint64_t unsigned_64(const std::string& what, const py::int_& v);
std::vector<int64_t> sizes_of(const py::handle& b);
py::object torch_size(const std::vector<int64_t>& s);
// A value's leaves as (full key, tensor) pairs, ragged ones as (values, offsets), read before
// anything is written: the value may be a view of the dict it is assigned into.
struct Leaves {
  std::vector<std::pair<std::string, at::Tensor>> dense;
  std::vector<std::pair<std::string, TensorDict::Ragged>> ragged;
};
// The leaves of v under key: a tensor (or array) is the leaf `key`; a dict or a TensorDict
// puts its leaves under "key/" (nested dicts give '/' paths), as tensordict does.
void collect_leaves(const std::string& key, const py::handle& v, Leaves& out);
// The leaves in an in-memory dict of the given batch size: the engine checks every key,
// shape and dtype before anything is written to the dict they go to.
TensorDict checked(const Leaves& leaves, const std::vector<int64_t>& batch_size);
// td[key] = v. A tensor sets one leaf (KeyError when key is a prefix of other leaves). A dict
// or a TensorDict replaces what is under "key/" with its leaves: the engine's
// TensorDict::set(key, sub-dict), all or nothing.
void assign(TensorDict& td, const std::string& key, const py::handle& v);
// from_dict's source: every leaf of a dict of tensors, arrays, dicts and TensorDicts.
void set_nested(TensorDict& td, const py::dict& d);
// "path: " of a store, "TensorDict: " of an in-memory dict: the start of an error message.
std::string where_of(const TensorDict& td);
// The dict's leaves as nested Python dicts of tensors.
py::dict to_dict(const TensorDict& td);
// open()'s mode: "r" or "r+"; ArgumentError otherwise ("w" named: it would truncate in h5py).
tdstore::OpenMode mode_of(const std::string& mode);
// compression= and level= of the Python API (tdstore::Compression::parse's text; level replaces
// its zstd level): nullopt when neither is given.
std::optional<tdstore::Compression> compression_of(const std::optional<std::string>& text,
                                                   std::optional<int> level);

// Indexing (binding_indexing.cpp).
// td[key], td[i], td[a:b], td[mask], td[i, j], td[..., idx]: a tensor, a sub-dict or rows.
py::object getitem(const TensorDict& td, const py::object& idx);
// An index as a tensor: integral or bool (IndexError otherwise); an empty list is no rows.
at::Tensor index_tensor_of(const TensorDict& td, const py::handle& i);
// An int index as int64 (IndexError naming td when beyond int64).
int64_t index_of(const TensorDict& td, const py::handle& i);
// tensordict's API on the TensorDict class (bind_dict_api.cpp).
void bind_dict_api(py::class_<TensorDict>& c);
// Rows of a dataset by int (the row, its dim dropped, as TensorDict's), slice or index tensor.
py::object dataset_getitem(const tdstore::Dataset& d, const py::object& idx);
// Makes td["key"] skip pybind11's dispatch (TensorDict's class, once __getitem__ is bound).
void install_fast_getitem(const py::handle& td_class);

// A Python callable owned by C++ code that may drop it or call it on any thread: calls and the
// final release take the GIL.
class PyCallable {
 public:
  explicit PyCallable(py::object fn)
      : fn_(new py::object(std::move(fn)), [](py::object* p) {
          py::gil_scoped_acquire gil;
          delete p;
        }) {}
  // Calls the function, whose result must be a torch.Tensor: DTypeError naming `what` (a lazy
  // property or a row feature) otherwise, never a conversion guessed from another value.
  template <class... A>
  at::Tensor tensor(const std::string& what, A&&... args) const {
    py::gil_scoped_acquire gil;
    EngineLock::Lend lend;  // see Lend: never wait, holding it, for threads that need it
    py::object r = (*fn_)(std::forward<A>(args)...);
    if (!THPVariable_Check(r.ptr()))
      throw tdstore::DTypeError(what + ": the function returned " +
                                py::str(py::type::of(r).attr("__qualname__")).cast<std::string>() +
                                "; expected a torch.Tensor");
    return r.cast<at::Tensor>();
  }
  const py::object& object() const { return *fn_; }

 private:
  std::shared_ptr<py::object> fn_;
};

// A handle that refers to nothing: every call on it throws tdstore::Error (a moved-from one).
template <class T>
T unopened() {
  if constexpr (std::is_same_v<T, TensorDict>) {
    TensorDict t;
    TensorDict taken(std::move(t));
    return t;  // NOLINT(bugprone-use-after-move): moved from on purpose
  } else {
    return T();
  }
}

// __setstate__ of a handle class (pickling, deepcopy): the object is restore(state); when that
// throws, the object is a handle that refers to nothing before the error propagates, so a call
// on it raises a typed error instead of reading an object never constructed (pybind11 leaves
// the instance unconstructed when a py::pickle factory throws).
template <class T, class Class, class Restore>
void def_setstate(Class& cls, Restore restore) {
  cls.def(
      "__setstate__",
      [restore](py::detail::value_and_holder& v_h, const py::tuple& state) {
        std::exception_ptr failed;
        T handle = unopened<T>();
        try {
          handle = restore(state);
        } catch (...) {
          failed = std::current_exception();
        }
        py::detail::initimpl::setstate<Class>(v_h, std::move(handle),
                                              Py_TYPE(v_h.inst) != v_h.type->type);
        if (failed) std::rethrow_exception(failed);
      },
      py::detail::is_new_style_constructor(), py::arg("state"),
      "Restores the handle pickle kept (__getstate__)");
}

// Each binds its classes and functions into the module (_tdstore.cpp calls them in order).
void bind_errors(py::module_& m);   // bind_errors.cpp: tdstore.Error and its subclasses
void bind_dict(py::module_& m);     // bind_dict.cpp: TensorDict, Attrs
void bind_dataset(py::module_& m);  // bind_dataset.cpp: Dataset, cache_in_parallel
void bind_loader(py::module_& m);   // bind_loader.cpp: Loader, LoaderIterator
void bind_compile(py::module_& m);  // bind_compile.cpp: the compile engine, keys, stats
void bind_formats(py::module_& m);  // bind_formats.cpp: tensordict memmap directories

}  // namespace tdstore::python
