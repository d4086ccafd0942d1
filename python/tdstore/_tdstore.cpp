// The Python binding: a thin layer over the C++ engine (include/tdstore/). Conversions only;
// every rule (keys, batch sizes, guards, reuse) is the engine's.
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
#include <ATen/ops/arange.h>
#include <pthread.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>  // paths as str or os.PathLike
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>  // the at::Tensor caster; not torch/extension.h (build time)

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "tdstore/tdstore.h"
#include "walk_checks.h"

namespace py = pybind11;
using tdstore::TensorDict;

namespace {

// Python exception classes mirroring tdstore::Error's hierarchy, with the matching builtin
// as a second base (KeyError, ValueError, OSError, ...), so `except KeyError` works.
struct Exceptions {
  PyObject *error, *argument, *argument_type, *key, *shape, *index, *dtype, *capacity, *corruption,
      *format, *lock, *readonly, *io, *closed;
};
Exceptions exc;

// An argument of the wrong type (tdstore.ArgumentTypeError, also a TypeError): the engine's C++
// types make such a call impossible, so only the binding throws it.
class ArgumentTypeError : public tdstore::Error {
 public:
  using tdstore::Error::Error;
};

PyObject* make_exception(py::module_& m, const char* name, PyObject* base, PyObject* builtin,
                         const char* doc) {
  std::string full = std::string("tdstore.") + name;
  PyObject* bases = builtin ? PyTuple_Pack(2, base, builtin) : PyTuple_Pack(1, base);
  PyObject* cls = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  Py_DECREF(bases);
  m.add_object(name, py::handle(cls));
  return cls;
}

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

// "a/b" from "a/b" or ("a", "b").
// A str's UTF-8; KeyError for one that has none (a lone surrogate, e.g. from a file name
// decoded with surrogateescape).
std::string utf8_of(const py::handle& s) {
  Py_ssize_t n = 0;
  const char* p = PyUnicode_AsUTF8AndSize(s.ptr(), &n);
  if (!p) {
    PyErr_Clear();
    throw tdstore::KeyError("key " + py::repr(s).cast<std::string>() +
                            " is not valid Unicode text (it holds a lone surrogate); keys are "
                            "UTF-8: decode file names strictly or re-encode them");
  }
  return std::string(p, static_cast<size_t>(n));
}

std::string key_of(const py::handle& k) {
  if (py::isinstance<py::str>(k)) return utf8_of(k);
  if (py::isinstance<py::tuple>(k)) {
    std::string out;
    for (const auto& part : k.cast<py::tuple>()) {
      if (!py::isinstance<py::str>(part))
        throw ArgumentTypeError("a key tuple holds str parts, got " +
                                std::string(py::str(py::type::of(part))));
      if (!out.empty()) out += '/';
      out += utf8_of(part);
    }
    return out;
  }
  throw ArgumentTypeError("a key is a str or a tuple of str, got " +
                          std::string(py::str(py::type::of(k))));
}

bool is_key(const py::handle& k) {
  if (py::isinstance<py::str>(k)) return true;
  if (!py::isinstance<py::tuple>(k)) return false;
  for (const auto& part : k.cast<py::tuple>())
    if (!py::isinstance<py::str>(part)) return false;
  return py::len(k) > 0;
}

std::string type_name(const py::handle& v) {
  return py::str(py::type::of(v).attr("__qualname__")).cast<std::string>();
}

// torch.Tensor from a tensor, a numpy array or anything torch.as_tensor takes; `what` names the
// value in errors (e.g. "key 'obs'"). A numpy array in another byte order or with negative
// strides is stored converted (the same values); one of Python objects, strings or an unsigned
// type libtorch 1.13 lacks is refused, as is anything torch.as_tensor rejects: DTypeError.
at::Tensor tensor_of(const py::handle& v, const std::string& what = "the value") {
  if (THPVariable_Check(v.ptr())) return v.cast<at::Tensor>();
  auto refuse = [&](const std::string& why) -> at::Tensor {
    throw tdstore::DTypeError(what + ": " + why);
  };
  if (v.is_none() || v.ptr() == Py_Ellipsis || py::isinstance<py::str>(v) ||
      py::isinstance<py::bytes>(v))
    return refuse("cannot store a " + type_name(v) +
                  "; expected a tensor, a numpy array, a number or a sequence of numbers");
  py::object value = py::reinterpret_borrow<py::object>(v);
  py::object numpy = py::module_::import("sys").attr("modules").attr("get")("numpy");
  if (!numpy.is_none() && py::isinstance(value, numpy.attr("ndarray"))) {
    py::object dtype = value.attr("dtype");
    const std::string kind = dtype.attr("kind").cast<std::string>();
    const std::string name = py::str(dtype).cast<std::string>();
    if (kind == "O" || kind == "U" || kind == "S" || kind == "V")
      return refuse("a numpy array of dtype " + name + " holds no numbers a tensor can hold");
    if (kind == "u" && dtype.attr("itemsize").cast<int>() > 1)
      return refuse("numpy dtype " + name +
                    " has no torch dtype in this libtorch; convert it (e.g. .astype(numpy.int32) "
                    "or .astype(numpy.int64))");
    if (!dtype.attr("isnative").cast<bool>())
      value = value.attr("astype")(dtype.attr("newbyteorder")("="));
    for (const auto& stride : value.attr("strides"))
      if (stride.cast<int64_t>() < 0) {  // a copy, same values (0-d arrays have no strides)
        value = value.attr("copy")();
        break;
      }
  }
  try {
    return py::module_::import("torch").attr("as_tensor")(value).cast<at::Tensor>();
  } catch (py::error_already_set& e) {
    std::string msg = e.what();
    return refuse("cannot convert a " + type_name(v) +
                  " to a tensor: " + msg.substr(0, msg.find('\n')));
  }
}

// A Python int in [0, 2^64): ArgumentError naming `what` otherwise (a negative seed).
uint64_t unsigned_64(const std::string& what, const py::int_& v) {
  const unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
  if (x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    throw tdstore::ArgumentError(what + " must be an integer in [0, 2^64), got " +
                                 py::repr(v).cast<std::string>());
  }
  return x;
}

std::vector<int64_t> sizes_of(const py::handle& b) {
  std::vector<int64_t> out;
  for (const auto& d : b) out.push_back(d.cast<int64_t>());
  return out;
}

py::object torch_size(const std::vector<int64_t>& s) {
  return py::module_::import("torch").attr("Size")(py::cast(s));
}

// A value's leaves as (full key, tensor) pairs, ragged ones as (values, offsets), read before
// anything is written: the value may be a view of the dict it is assigned into.
struct Leaves {
  std::vector<std::pair<std::string, at::Tensor>> dense;
  std::vector<std::pair<std::string, TensorDict::Ragged>> ragged;
};

// Collects the leaves of v under key: a tensor (or array) is the leaf `key`; a dict or a
// TensorDict puts its leaves under "key/" (nested dicts give '/' paths), as tensordict does.
void collect_leaves(const std::string& key, const py::handle& v, Leaves& out) {
  if (py::isinstance<py::dict>(v)) {
    for (const auto& [k, inner] : v.cast<py::dict>())
      collect_leaves(key.empty() ? key_of(k) : key + "/" + key_of(k), inner, out);
  } else if (py::isinstance<TensorDict>(v)) {
    const TensorDict& td = v.cast<const TensorDict&>();
    for (const auto& k : td.keys()) {
      const std::string full = key.empty() ? k : key + "/" + k;
      if (td.is_ragged(k))
        out.ragged.emplace_back(full, td.get_ragged(k));
      else
        out.dense.emplace_back(full, td.get(k));
    }
  } else {
    out.dense.emplace_back(key, tensor_of(v, "key '" + key + "'"));
  }
}

// The leaves in an in-memory dict of the given batch size: the engine checks every key,
// shape and dtype before anything is written to the dict they go to.
TensorDict checked(const Leaves& leaves, const std::vector<int64_t>& batch_size) {
  TensorDict out(batch_size);
  for (const auto& [k, t] : leaves.dense) out.set(k, t);
  for (const auto& [k, r] : leaves.ragged) out.set_ragged(k, r.values, r.offsets);
  return out;
}

// td[key] = v. A tensor sets one leaf (KeyError when key is a prefix of other leaves). A dict
// or a TensorDict replaces what is under "key/" with its leaves: the engine's
// TensorDict::set(key, sub-dict), all or nothing.
void assign(TensorDict& td, const std::string& key, const py::handle& v) {
  if (py::isinstance<TensorDict>(v)) {
    const TensorDict& value = v.cast<const TensorDict&>();
    py::gil_scoped_release nogil;
    td.set(key, value);
    return;
  }
  const bool subdict = py::isinstance<py::dict>(v);
  Leaves leaves;
  collect_leaves(subdict ? "" : key, v, leaves);
  py::gil_scoped_release nogil;
  if (subdict)
    td.set(key, checked(leaves, td.batch_size()));
  else
    td.set(key, leaves.dense.at(0).second);
}

// from_dict's source: every leaf of a dict of tensors, arrays, dicts and TensorDicts.
void set_nested(TensorDict& td, const py::dict& d) {
  Leaves leaves;
  collect_leaves("", d, leaves);
  for (const auto& [k, t] : leaves.dense) td.set(k, t);
  for (const auto& [k, r] : leaves.ragged) td.set_ragged(k, r.values, r.offsets);
}

std::string where_of(const TensorDict& td) {
  return td.is_persistent() ? td.path().string() + ": " : std::string("TensorDict: ");
}

// An int index as int64: an int beyond int64 is out of range of any batch dim (IndexError).
int64_t index_of(const TensorDict& td, const py::handle& i) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0)
    throw tdstore::IndexError(where_of(td) + "index " + py::repr(i).cast<std::string>() +
                              " is out of range of every batch dim");
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

// Runs a torch indexing call: its refusals become tdstore errors (IndexError, ArgumentError for
// a bad value such as a slice step of 0 or below, ArgumentTypeError for a bad type).
template <class F>
auto torch_indexing(const TensorDict& td, F f) {
  try {
    return f();
  } catch (py::error_already_set& e) {
    const std::string what = where_of(td) + py::str(e.value()).cast<std::string>() +
                             " (batch dims " + std::string(py::repr(torch_size(td.batch_size()))) +
                             ")";
    if (e.matches(PyExc_IndexError)) throw tdstore::IndexError(what);
    if (e.matches(PyExc_TypeError)) throw ArgumentTypeError(what);
    if (e.matches(PyExc_ValueError) || e.matches(PyExc_RuntimeError) ||
        e.matches(PyExc_OverflowError))
      throw tdstore::ArgumentError(what);
    throw;
  }
}

py::object getitem(const TensorDict& td, const py::object& idx);

// None, True, False: numpy adds a dim of 1 (or 0) there; a TensorDict's batch dims are its
// keys' leading dims, so such an index is refused.
[[noreturn]] void throw_new_dim() {
  throw tdstore::DTypeError(
      "TensorDict index None or a bool (a new batch dimension) is not supported: index with a "
      "key, an int, a slice, a bool mask or an integer tensor per batch dim");
}

// td[i, j], td[:, 2], td[..., mask]: one index per batch dim, as numpy and tensordict
// index a tensor's leading dims; every leaf indexed alike (the batch dims only: an Ellipsis
// spans the batch dims left), into an in-memory dict of the batch size the index leaves. An
// index that selects along batch dim 0 only (td[2, ...], td[..., mask] of one batch dim) is
// td[that index], which keeps ragged keys ragged.
py::object index_batch_dims(const TensorDict& td, const py::tuple& idx) {
  const auto bd = static_cast<int64_t>(td.batch_size().size());
  py::module_ torch = py::module_::import("torch");
  int64_t consumed = 0, ellipses = 0;
  py::list parts;
  for (const auto& part : idx) {
    py::object p = py::reinterpret_borrow<py::object>(part);
    if (p.ptr() == Py_Ellipsis) {
      ++ellipses;
    } else if (p.is_none() || py::isinstance<py::bool_>(p)) {
      throw_new_dim();
    } else if (py::isinstance<py::int_>(p)) {
      p = py::int_(index_of(td, p));  // beyond int64: out of range (IndexError)
      ++consumed;
    } else if (py::isinstance<py::slice>(p)) {
      ++consumed;
    } else {
      at::Tensor t = tensor_of(p, "the index");
      if (t.scalar_type() == at::kBool && t.dim() == 0) throw_new_dim();
      consumed += t.scalar_type() == at::kBool ? t.dim() : 1;
      p = py::cast(t);
    }
    parts.append(p);
  }
  const std::string w = where_of(td);
  if (ellipses > 1) throw tdstore::IndexError(w + "an index holds at most one Ellipsis (...)");
  if (consumed > bd)
    throw tdstore::IndexError(w + "too many indices: " + std::to_string(consumed) +
                              " for the batch dims " +
                              std::string(py::repr(torch_size(td.batch_size()))));
  py::list norm;
  for (const auto& p : parts) {
    if (p.ptr() != Py_Ellipsis) {
      norm.append(p);
      continue;
    }
    for (int64_t i = 0; i < bd - consumed; ++i)
      norm.append(py::slice(py::none(), py::none(), py::none()));
  }
  // Trailing full slices select nothing: one index left along dim 0 is td[that index].
  auto is_all = [](const py::handle& p) {
    if (!py::isinstance<py::slice>(p)) return false;
    return p.attr("start").is_none() && p.attr("stop").is_none() && p.attr("step").is_none();
  };
  py::ssize_t used = py::len(norm);
  while (used > 1 && is_all(norm[used - 1])) --used;
  if (used == 1) return getitem(td, norm[0]);
  const py::tuple index(norm);
  for (const auto& k : td.keys())
    if (td.is_ragged(k))
      throw tdstore::ShapeError(w + "key '" + k +
                                "' is ragged: index its rows along batch dim 0 (td[i], td[a:b], "
                                "a 1-d index tensor or mask), not with " +
                                std::string(py::repr(idx)));
  // The batch size the index leaves; its bounds and values checked once, here.
  py::object batch = torch_indexing(td, [&]() -> py::object {
    return torch.attr("zeros")(py::tuple())
        .attr("expand")(torch_size(td.batch_size()))[index]
        .attr("shape");
  });
  TensorDict out(sizes_of(batch));
  for (const auto& k : td.keys()) out.set(k, py::cast(td.get(k))[index].cast<at::Tensor>());
  return py::cast(out);
}

py::object getitem(const TensorDict& td, const py::object& idx) {
  if (py::isinstance<py::tuple>(idx) && !is_key(idx)) {
    const auto t = idx.cast<py::tuple>();
    if (t.size() == 0) return py::cast(td);  // t[()]: all of it
    return index_batch_dims(td, t);
  }
  if (is_key(idx)) {
    std::string key = key_of(idx);
    if (td.contains(key)) return py::cast(td.get(key));
    if (td.has_prefix(key + "/")) return py::cast(td.sub(key));
    return py::cast(td.get(key));  // the engine's KeyError, naming the key and the store
  }
  if (py::isinstance<py::bool_>(idx) || idx.is_none()) throw_new_dim();
  if (py::isinstance<py::int_>(idx)) return py::cast(td.index(index_of(td, idx)));
  if (py::isinstance<py::slice>(idx)) {
    if (td.batch_size().empty())
      throw tdstore::IndexError(where_of(td) + "slicing a TensorDict without batch dims");
    py::ssize_t start = 0, stop = 0, step = 0, n = 0;
    torch_indexing(td, [&] {
      if (!idx.cast<py::slice>().compute(td.batch_size()[0], &start, &stop, &step, &n))
        throw py::error_already_set();
      return 0;
    });
    if (step <= 0)
      throw tdstore::ArgumentError(where_of(td) + "TensorDict slices need a positive step, got " +
                                   std::to_string(step));
    return py::cast(td.slice(start, std::max(start, stop), step));
  }
  if (idx.ptr() == Py_Ellipsis) return py::cast(td);  // every row: the dict itself, as t[...]
  at::Tensor t = tensor_of(idx, "the index");
  if (t.dim() == 0 && t.scalar_type() != at::kBool)  // a 0-d integer tensor is an int
    return py::cast(td.index(t.item<int64_t>()));
  if (t.dim() == 0) throw_new_dim();
  return py::cast(td.index(t));
}

// Rows of a dataset by int (the row, its dim dropped, as TensorDict's), slice or index tensor.
py::object dataset_getitem(const tdstore::Dataset& d, const py::object& idx) {
  const int64_t n = d.rows();
  if (is_key(idx))
    throw tdstore::KeyError(d.path().string() +
                            ": a Dataset is indexed by rows (int, slice, tensor), not by key '" +
                            key_of(idx) + "': take the key from ds[rows]");
  at::Tensor rows;
  bool one = false;
  if (py::isinstance<py::int_>(idx)) {
    int64_t i = idx.cast<int64_t>();
    if (i < -n || i >= n)
      throw tdstore::IndexError(d.path().string() + ": row " + std::to_string(i) +
                                " out of range: " + std::to_string(n) + " rows published");
    rows = at::arange(i < 0 ? i + n : i, (i < 0 ? i + n : i) + 1, at::kLong);
    one = true;
  } else if (py::isinstance<py::slice>(idx)) {
    py::ssize_t start, stop, step, len;
    if (!idx.cast<py::slice>().compute(static_cast<py::ssize_t>(n), &start, &stop, &step, &len))
      throw py::error_already_set();
    rows = at::arange(static_cast<int64_t>(start),
                      static_cast<int64_t>(start) + static_cast<int64_t>(len) * step,
                      static_cast<int64_t>(step), at::kLong);
  } else {
    if (idx.is_none() || idx.ptr() == Py_Ellipsis)
      throw tdstore::DTypeError(d.path().string() +
                                ": a Dataset is indexed by an int, a slice, a bool mask or an "
                                "integer tensor, not " +
                                type_name(idx));
    rows = tensor_of(idx, "the index");
  }
  TensorDict out;
  {
    py::gil_scoped_release nogil;
    out = d.index(rows);
    if (one) out = out.index(int64_t{0});
  }
  return py::cast(out);
}

py::dict to_dict(const TensorDict& td) {
  py::dict out;
  for (const auto& k : td.keys()) {
    py::dict level = out;
    size_t s = 0;
    for (size_t e = k.find('/'); e != std::string::npos; s = e + 1, e = k.find('/', s)) {
      py::str part(k.substr(s, e - s));
      if (!level.contains(part)) level[part] = py::dict();
      level = level[part].cast<py::dict>();
    }
    level[py::str(k.substr(s))] = td.get(k);
  }
  return out;
}

tdstore::OpenMode mode_of(const std::string& mode) {
  if (mode == "r") return tdstore::OpenMode::ReadOnly;
  if (mode == "r+") return tdstore::OpenMode::ReadWrite;
  if (mode == "w")  // h5py's "w" truncates: never read as "r+", which keeps the data
    throw tdstore::ArgumentError(
        "mode 'w' is not supported: tdstore.TensorDict.create(path, batch_size) creates a "
        "store, mode 'r+' writes an existing one, 'r' reads it");
  throw tdstore::ArgumentError("mode is 'r' (read-only) or 'r+' (read-write), got '" + mode + "'");
}

// td["key"] without pybind11's dispatch, which alone costs about five dict lookups: a str key
// naming a leaf is looked up and wrapped here; everything else (tuples, indices, sub-dicts,
// errors) goes through the bound __getitem__, which gives the same answers and exceptions.
PyObject* bound_getitem = nullptr;

PyObject* fast_getitem(PyObject* self, PyObject* key) {
  if (PyUnicode_CheckExact(key)) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(key, &n);
    if (!s) return nullptr;  // not encodable: the UnicodeError stands
    auto vh = reinterpret_cast<py::detail::instance*>(self)->get_value_and_holder();
    if (auto* td = vh.value_ptr<TensorDict>(); td && vh.holder_constructed()) {
      EngineLock lock;
      try {
        std::string_view k(s, static_cast<size_t>(n));
        if (td->contains(k)) return THPVariable_Wrap(td->get(k));
      } catch (...) {  // answered below, with the error translated
      }
    }
  }
  return PyObject_CallFunctionObjArgs(bound_getitem, self, key, nullptr);
}

template <class Class>
void install_fast_getitem(Class& cls) {
  bound_getitem = PyObject_GetAttrString(cls.ptr(), "__getitem__");  // kept for the module's life
  if (!bound_getitem) throw py::error_already_set();
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  type->tp_as_mapping->mp_subscript = fast_getitem;
  PyType_Modified(type);
}

// The Loader's defaults are the C++ LoaderOptions' (one owner).
const tdstore::LoaderOptions kLoaderDefaults{};

// The attributes of a dict, as a mapping of str to str.
struct Attrs {
  TensorDict td;
};

// A Loader with the Python object of its source kept alive, and its running iterator.
struct PyLoader {
  py::object source_ref;
  std::unique_ptr<tdstore::Loader> loader;
  std::optional<tdstore::Loader::Iterator> it;
  bool fresh = true;  // the next next() starts a pass
  uint64_t pass = 0;  // iter() calls so far: only the newest iterator may advance
  PyLoader() { live().insert(this); }
  ~PyLoader() {
    live().erase(this);
    // Joining workers that may be waiting for the GIL in a row feature's fn.
    py::gil_scoped_release nogil;
    it.reset();
    loader.reset();
  }
  // The loader; Error once closed.
  tdstore::Loader& get() const {
    if (!loader) throw tdstore::ClosedError("tdstore.Loader: the loader was closed (close())");
    return *loader;
  }
  // Joins the workers and releases the loader (its row features stored, the source released);
  // called with the GIL held. Idempotent.
  void close() {
    py::gil_scoped_release nogil;
    it.reset();
    loader.reset();
  }
  // Loaders alive, guarded by the GIL. At interpreter exit (atexit, while threads may still take
  // the GIL) every pass in progress is stopped: a worker inside a Python row feature would
  // otherwise be ended by the finalizing interpreter in the middle of the engine's code.
  static std::set<PyLoader*>& live() {
    static auto* loaders = new std::set<PyLoader*>;  // never destroyed: used at exit
    return *loaders;
  }
};

// One pass of a Loader: iter(loader) makes one; only the newest advances the Loader.
struct PyLoaderIterator {
  py::object loader;  // the PyLoader, kept alive
  uint64_t pass;
};

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

PYBIND11_MODULE(_tdstore, m) {
  m.doc() = "tdstore: memory-mapped TensorDict stores (binding over the C++ engine)";
  pthread_atfork(nullptr, nullptr, &EngineLock::after_fork_in_child);
  pthread_atfork(nullptr, nullptr, [] { ++fork_generation; });
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    // Closing one may free Python objects and so destroy other loaders (erased from live()):
    // iterate a copy and close only those still alive.
    const std::set<PyLoader*> loaders = PyLoader::live();
    for (PyLoader* l : loaders)
      if (PyLoader::live().count(l)) l->close();
  }));

  exc.error = make_exception(
      m, "Error", PyExc_Exception, nullptr,
      "Base of every error tdstore raises; messages name the store path, key or field.");
  exc.argument = make_exception(m, "ArgumentError", exc.error, PyExc_ValueError,
                                "An argument's value is outside what the call accepts: a "
                                "non-positive batch_size, a rank outside world_size, an empty list "
                                "to stack (also a ValueError).");
  exc.argument_type = make_exception(m, "ArgumentTypeError", exc.error, PyExc_TypeError,
                                     "An argument of a type the call does not take: a plain dict "
                                     "as a Loader's source, a str where a bool is expected (also "
                                     "a TypeError).");
  exc.key = make_exception(m, "KeyError", exc.error, PyExc_KeyError,
                           "A key is absent, empty, not valid text, or too long for a directory "
                           "slot (also a KeyError).");
  exc.shape = make_exception(m, "ShapeError", exc.error, PyExc_ValueError,
                             "A tensor's leading dims differ from the batch size, or an index is "
                             "out of range (also a ValueError).");
  exc.index = make_exception(m, "IndexError", exc.shape, PyExc_IndexError,
                             "A row index outside a batch dimension (also a ShapeError and an "
                             "IndexError).");
  exc.dtype = make_exception(m, "DTypeError", exc.error, PyExc_TypeError,
                             "A value's type or dtype cannot be stored (also a TypeError).");
  exc.capacity =
      make_exception(m, "CapacityError", exc.error, nullptr,
                     "The key directory is full, or the arena's reserved range is exhausted.");
  exc.corruption = make_exception(m, "CorruptionError", exc.error, nullptr,
                                  "Stored bytes fail a checksum or a structural check.");
  exc.format = make_exception(
      m, "FormatError", exc.error, nullptr,
      "The path is not a tdstore store, or its format is newer than this build reads.");
  exc.lock =
      make_exception(m, "LockError", exc.error, PyExc_BlockingIOError,
                     "Another writer holds the store's write lock (also a BlockingIOError).");
  exc.readonly =
      make_exception(m, "ReadOnlyError", exc.error, PyExc_PermissionError,
                     "A write through a handle opened read-only (also a PermissionError).");
  exc.io = make_exception(
      m, "IOError", exc.error, PyExc_OSError,
      "An operating-system call failed: disk full, permissions, ... (also an OSError).");
  exc.closed =
      make_exception(m, "ClosedError", exc.error, PyExc_ValueError,
                     "A call on a handle after close() (also a ValueError, as for a closed file).");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ArgumentTypeError& e) {
      PyErr_SetString(exc.argument_type, e.what());
    } catch (const tdstore::ArgumentError& e) {
      PyErr_SetString(exc.argument, e.what());
    } catch (const tdstore::KeyError& e) {
      PyErr_SetString(exc.key, e.what());
    } catch (const tdstore::IndexError& e) {
      PyErr_SetString(exc.index, e.what());
    } catch (const tdstore::ShapeError& e) {
      PyErr_SetString(exc.shape, e.what());
    } catch (const tdstore::DTypeError& e) {
      PyErr_SetString(exc.dtype, e.what());
    } catch (const tdstore::CapacityError& e) {
      PyErr_SetString(exc.capacity, e.what());
    } catch (const tdstore::CorruptionError& e) {
      PyErr_SetString(exc.corruption, e.what());
    } catch (const tdstore::FormatError& e) {
      PyErr_SetString(exc.format, e.what());
    } catch (const tdstore::LockError& e) {
      PyErr_SetString(exc.lock, e.what());
    } catch (const tdstore::ReadOnlyError& e) {
      PyErr_SetString(exc.readonly, e.what());
    } catch (const tdstore::IOError& e) {
      PyErr_SetString(exc.io, e.what());
    } catch (const tdstore::ClosedError& e) {
      PyErr_SetString(exc.closed, e.what());
    } catch (const tdstore::Error& e) {
      PyErr_SetString(exc.error, e.what());
    } catch (const c10::Error& e) {  // the engine converts what users trigger; a backstop
      PyErr_SetString(exc.error, e.what_without_backtrace());
    }
  });

  py::class_<Attrs>(m, "Attrs", "A dict's attributes: str -> str, committed with the data")
      .def(
          "__getitem__",
          [](const Attrs& a, const std::string& k) {
            auto v = a.td.attr(k);
            if (!v) throw py::key_error(k);
            return *v;
          },
          py::arg("key"), R"doc(The attribute's value; KeyError when absent.)doc",
          py::call_guard<EngineLock>())
      .def(
          "__setitem__",
          [](Attrs& a, const std::string& k, const std::string& v) { a.td.set_attr(k, v); },
          py::arg("key"), py::arg("value"),
          R"doc(Stages an attribute (str -> str); committed with the dict's next commit().)doc",
          py::call_guard<EngineLock>())
      .def(
          "__delitem__",
          [](Attrs& a, const std::string& k) {
            if (!a.td.attr(k)) throw py::key_error(k);
            a.td.erase_attr(k);
          },
          py::arg("key"),
          R"doc(Removes an attribute (staged like a set); KeyError when absent.)doc",
          py::call_guard<EngineLock>())
      .def(
          "__contains__",
          [](const Attrs& a, const std::string& k) { return a.td.attr(k).has_value(); },
          py::arg("key"), R"doc(True when the attribute exists.)doc", py::call_guard<EngineLock>())
      .def(
          "__len__", [](const Attrs& a) { return a.td.attr_names().size(); },
          R"doc(The number of attributes.)doc", py::call_guard<EngineLock>())
      .def(
          "__iter__", [](const Attrs& a) { return py::iter(py::cast(a.td.attr_names())); },
          R"doc(The attribute names, sorted.)doc", py::call_guard<EngineLock>())
      .def(
          "keys", [](const Attrs& a) { return a.td.attr_names(); },
          R"doc(The attribute names, sorted.)doc", py::call_guard<EngineLock>())
      .def(
          "get",
          [](const Attrs& a, const std::string& k, py::object dflt) -> py::object {
            auto v = a.td.attr(k);
            return v ? py::cast(*v) : dflt;
          },
          py::arg("key"), py::arg("default") = py::none(),
          R"doc(The attribute's value, or default when absent.)doc", py::call_guard<EngineLock>())
      .def(
          "__repr__",
          [](const Attrs& a) {
            py::dict d;
            for (const auto& k : a.td.attr_names()) d[py::str(k)] = py::str(*a.td.attr(k));
            return "tdstore.Attrs(" + py::repr(d).cast<std::string>() + ")";
          },
          R"doc(tdstore.Attrs({...}) with every attribute.)doc", py::call_guard<EngineLock>());

  auto td_class =
      py::class_<TensorDict>(m, "TensorDict", R"(Named tensors sharing leading batch dimensions.

In memory: TensorDict({"obs": t}, batch_size=[8]). Persistent: TensorDict.create(path, ...)
or tdstore.open(path). A handle shares its state, like a tensor: copies see the same dict.)")
          .def(
              py::init([](py::object data, py::object batch_size) {
                TensorDict td(batch_size.is_none() ? std::vector<int64_t>{} : sizes_of(batch_size));
                if (!data.is_none()) set_nested(td, data.cast<py::dict>());
                return td;
              }),
              py::arg("source") = py::none(), py::arg("batch_size") = py::none(),
              R"doc(An in-memory dict.

source: a dict of tensors or numpy arrays (nested dicts give '/' paths), or None: empty.
batch_size: the leading dims every tensor shares (a list or torch.Size); [] when None.)doc")
          .def_static(
              "create",
              [](const std::filesystem::path& path, py::object batch_size, int64_t key_capacity,
                 int64_t alignment, bool reuse_space) {
                tdstore::StoreOptions o;
                o.key_capacity = key_capacity;
                o.alignment = alignment;
                o.reuse_space = reuse_space;
                return TensorDict::create(path, sizes_of(batch_size), o);
              },
              py::arg("path"), py::arg("batch_size") = py::list(),
              py::arg("key_capacity") = tdstore::StoreOptions{}.key_capacity,
              py::arg("alignment") = tdstore::StoreOptions{}.alignment,
              py::arg("reuse_space") = tdstore::StoreOptions{}.reuse_space,
              R"doc(Creates a store at path (a directory that must not exist or be empty), open for writing.

batch_size: the leading dims every tensor shares. key_capacity: how many keys the fixed-size
key directory holds (CapacityError beyond). alignment: byte alignment of every tensor in the
arena (a power of two). reuse_space: whether space freed by overwritten keys is reused once
no reader can see it.)doc",
              py::call_guard<EngineLock>())
          .def_static(
              "open",
              [](const std::filesystem::path& path, const std::string& mode,
                 int64_t lock_timeout_ms) {
                tdstore::StoreOptions o;
                o.lock_timeout_ms = lock_timeout_ms;
                py::gil_scoped_release nogil;
                return TensorDict::open(path, mode_of(mode), o);
              },
              py::arg("path"), py::arg("mode") = "r",
              py::arg("lock_timeout_ms") = tdstore::StoreOptions{}.lock_timeout_ms,
              R"doc(Opens an existing store (tdstore.open is the same).

path: the store directory (str or os.PathLike). mode: "r" (read-only, any number of readers)
or "r+" (read-write, one writer at a time). lock_timeout_ms: how long to wait for another
writer to release the store before tdstore.LockError (0: fail at once).
FormatError when path is not a store.)doc",
              py::call_guard<EngineLock>())
          .def_static(
              "from_dict",
              [](const py::dict& d, py::object batch_size) {
                TensorDict td(batch_size.is_none() ? std::vector<int64_t>{} : sizes_of(batch_size));
                set_nested(td, d);
                return td;
              },
              py::arg("source"), py::arg("batch_size") = py::none(),
              R"doc(An in-memory dict from a dict of tensors (nested dicts give '/' paths) and a batch size.)doc",
              py::call_guard<EngineLock>())
          .def(
              "__getitem__", &getitem, py::arg("key"),
              R"doc(td["a/b"] or td["a", "b"]: the tensor (a zero-copy view of the store), or the sub-dict
under that prefix. td[i], td[a:b:c], td[index_tensor], td[bool_mask]: the rows selected along
batch dim 0, as an in-memory dict. KeyError naming the key when absent.)doc",
              py::call_guard<EngineLock>())
          .def(
              "__setitem__",
              [](TensorDict& td, const py::object& k, const py::object& v) {
                assign(td, key_of(k), v);
              },
              py::arg("key"), py::arg("value"),
              R"doc(Sets a tensor (or a numpy array); its leading dims must be the batch size. A dict or a
TensorDict value replaces the sub-dict under key with its leaves (key/...), as in tensordict.
On a store the bytes are written now and the keys staged until commit().)doc",
              py::call_guard<EngineLock>())
          .def(
              "__delitem__",
              [](TensorDict& td, const py::object& k) {
                const std::string key = key_of(k);
                py::gil_scoped_release nogil;
                if (!td.contains(key) && td.has_prefix(key + "/"))
                  td.set(key, TensorDict(td.batch_size()));  // the sub-dict, all of it
                else
                  td.erase(key);
              },
              py::arg("key"),
              R"doc(Removes a key, or the sub-dict under a prefix (staged on a store until commit());
KeyError when key names neither.)doc",
              py::call_guard<EngineLock>())
          .def(
              "__contains__",
              [](const TensorDict& td, const py::object& k) {
                if (!is_key(k)) return false;
                const std::string key = key_of(k);
                return td.contains(key) || td.has_prefix(key + "/");
              },
              py::arg("key"), R"doc(True when key names a leaf or a prefix of leaves.)doc",
              py::call_guard<EngineLock>())
          .def(
              "__len__",
              [](const TensorDict& td) { return td.batch_size().empty() ? 0 : td.batch_size()[0]; },
              R"doc(The first batch dim (0 for a dict without batch dims).)doc",
              py::call_guard<EngineLock>())
          .def(
              "__iter__", [](const TensorDict& td) { return py::iter(py::cast(td.keys())); },
              R"doc(The leaf keys, full '/' paths, sorted.)doc", py::call_guard<EngineLock>())
          .def(
              "__repr__",
              [](const TensorDict& td) {
                if (td.closed()) return td.to_string();
                std::string s =
                    "TensorDict(batch_size=" + std::string(py::repr(torch_size(td.batch_size()))) +
                    ", keys=" + std::string(py::repr(py::cast(td.keys())));
                if (td.is_persistent()) s += ", path='" + td.path().string() + "'";
                return s + ")";
              },
              R"doc(TensorDict(batch_size=..., keys=[...], path=...).)doc",
              py::call_guard<EngineLock>())
          .def("keys", &TensorDict::keys, "Every leaf key, full '/' paths, sorted",
               py::call_guard<EngineLock>())
          .def(
              "values",
              [](const TensorDict& td) {
                py::list out;
                for (const auto& k : td.keys()) out.append(td.get(k));
                return out;
              },
              R"doc(The tensors, in key order.)doc", py::call_guard<EngineLock>())
          .def(
              "items",
              [](const TensorDict& td) {
                py::list out;
                for (const auto& k : td.keys()) out.append(py::make_tuple(k, td.get(k)));
                return out;
              },
              R"doc((key, tensor) pairs, in key order.)doc", py::call_guard<EngineLock>())
          .def(
              "get",
              [](const TensorDict& td, const py::object& k, py::object dflt) -> py::object {
                std::string key = key_of(k);
                if (td.contains(key)) return py::cast(td.get(key));
                if (td.has_prefix(key + "/")) return py::cast(td.sub(key));
                return dflt;
              },
              py::arg("key"), py::arg("default") = py::none(),
              R"doc(What td[key] gives (the tensor, or the sub-dict under a prefix), or default when key
names neither.)doc",
              py::call_guard<EngineLock>())
          .def(
              "set",
              [](TensorDict& td, const py::object& k, const py::object& v) {
                assign(td, key_of(k), v);
              },
              py::arg("key"), py::arg("value"), R"doc(td.set(key, value) is td[key] = value.)doc",
              py::call_guard<EngineLock>())
          .def(
              "commit",
              [](TensorDict& td) {
                py::gil_scoped_release nogil;
                td.commit();
              },
              R"doc(Makes every staged change durable and visible to readers at once (fsync before the
new generation is published). A process killed at any instant leaves the last commit.)doc",
              py::call_guard<EngineLock>())
          .def(
              "rollback",
              [](TensorDict& td) {
                py::gil_scoped_release nogil;
                td.rollback();
              },
              R"doc(Discards every change staged since the last commit.)doc",
              py::call_guard<EngineLock>())
          .def(
              "refresh",
              [](TensorDict& td) {
                py::gil_scoped_release nogil;
                return td.refresh();
              },
              "Moves a reader to the newest commit; True when it moved",
              py::call_guard<EngineLock>())
          .def(
              "verify",
              [](const TensorDict& td) {
                py::gil_scoped_release nogil;
                return td.verify();
              },
              "Re-hashes every key: the damaged ones ([] when the store is exact)",
              py::call_guard<EngineLock>())
          .def(
              "append",
              [](TensorDict& td, const TensorDict& rows) {
                py::gil_scoped_release nogil;
                td.append(rows);
              },
              py::arg("rows"),
              R"doc(Appends rows (a TensorDict with the same keys, dtypes and trailing shapes) along batch
dim 0; staged until commit(). KeyError/DTypeError/ShapeError naming the key that differs.)doc",
              py::call_guard<EngineLock>())
          .def(
              "reserve", &TensorDict::reserve, py::arg("rows"),
              R"doc(A hint: rows the dict will grow to by append(), so space is laid out once.)doc",
              py::call_guard<EngineLock>())
          .def_property_readonly("batch_size", locked<TensorDict>([](const TensorDict& td) {
                                   return torch_size(td.batch_size());
                                 }),
                                 R"doc(The leading dims every tensor shares, as a torch.Size.)doc")
          .def_property_readonly("path", locked<TensorDict>([](const TensorDict& td) -> py::object {
                                   return td.is_persistent() ? py::cast(td.path().string())
                                                             : py::none();
                                 }),
                                 R"doc(The store directory, or None for an in-memory dict.)doc")
          .def_property_readonly(
              "attrs", locked<TensorDict>([](const TensorDict& td) { return Attrs{td}; }),
              R"doc(The dict's attributes (str -> str), a mutable mapping committed with the data.)doc")
          .def_property_readonly(
              "generation", locked<TensorDict>(&TensorDict::generation),
              R"doc(The commit this handle reads (0 before the first commit).)doc")
          .def_property_readonly("is_persistent", locked<TensorDict>(&TensorDict::is_persistent),
                                 R"doc(True for a dict in a store.)doc")
          .def_property_readonly(
              "is_writable", locked<TensorDict>(&TensorDict::is_writable),
              R"doc(True for an in-memory dict or a store opened with mode 'r+'.)doc")
          .def(
              "get_or_compute",
              [](TensorDict& td, const py::object& k, std::vector<std::string> deps,
                 py::function fn, const std::string& version) {
                PyCallable f(fn);
                std::string key = key_of(k);
                std::string what = "lazy property '" + key + "'";
                py::gil_scoped_release nogil;
                return td.get_or_compute(
                    key, std::move(deps),
                    [&f, &what](const TensorDict& d) { return f.tensor(what, d); }, version);
              },
              py::arg("key"), py::arg("deps"), py::arg("fn"), py::arg("version") = "",
              R"doc(A lazy property: the tensor stored under key when it is still valid (its deps unchanged
since it was computed, the same version string), else fn(td), stored under key with its
provenance (committed on a writable store) and returned. deps: the keys fn reads.)doc",
              py::call_guard<EngineLock>())
          .def(
              "invalidate",
              [](TensorDict& td, const py::object& k) { return td.invalidate(key_of(k)); },
              py::arg("key"),
              R"doc(Forgets a lazy property's provenance (the next get_or_compute recomputes); False when none.)doc",
              py::call_guard<EngineLock>())
          .def(
              "lazy_valid",
              [](const TensorDict& td, const py::object& k) {
                auto i = td.lazy_info(key_of(k));
                return i && i->valid;
              },
              py::arg("key"),
              R"doc(True when the lazy property under key is stored and still valid.)doc",
              py::call_guard<EngineLock>())
          .def(
              "set_ragged",
              [](TensorDict& td, const py::object& k, const std::vector<at::Tensor>& rows) {
                td.set_ragged(key_of(k), rows);
              },
              py::arg("key"), py::arg("rows"),
              R"doc(Stores a list of tensors of different lengths along dim 0 as one ragged key.)doc",
              py::call_guard<EngineLock>())
          .def(
              "get_ragged",
              [](const TensorDict& td, const py::object& k) {
                auto r = td.get_ragged(key_of(k));
                return py::make_tuple(r.values, r.offsets);
              },
              py::arg("key"),
              R"doc(A ragged key as (values, offsets): row i is values[offsets[i]:offsets[i+1]].)doc",
              py::call_guard<EngineLock>())
          .def(
              "is_ragged",
              [](const TensorDict& td, const py::object& k) { return td.is_ragged(key_of(k)); },
              py::arg("key"), R"doc(True when key is ragged (set_ragged).)doc",
              py::call_guard<EngineLock>())
          .def("clone", &TensorDict::clone, "An in-memory copy", py::call_guard<EngineLock>())
          .def(
              "select",
              [](const TensorDict& td, py::args keys) {
                std::vector<std::string> ks;
                for (const auto& k : keys) ks.push_back(key_of(k));
                return td.select(ks);
              },
              R"doc(An in-memory dict of the given keys or '/' prefixes (views of this one's tensors).)doc",
              py::call_guard<EngineLock>())
          .def(
              "exclude",
              [](const TensorDict& td, py::args keys) {
                std::vector<std::string> ks;
                for (const auto& k : keys) ks.push_back(key_of(k));
                return td.exclude(ks);
              },
              R"doc(An in-memory dict without the given keys or '/' prefixes.)doc",
              py::call_guard<EngineLock>())
          .def(
              "update",
              [](TensorDict& td, const py::object& other) {
                if (!py::isinstance<TensorDict>(other) && !py::isinstance<py::dict>(other))
                  throw ArgumentTypeError(
                      "TensorDict.update: other is a TensorDict or a dict, not " +
                      type_name(other));
                Leaves leaves;
                collect_leaves("", other, leaves);
                py::gil_scoped_release nogil;
                td.update(checked(leaves, td.batch_size()));
              },
              py::arg("other"),
              R"doc(Sets every leaf of other (a TensorDict, or a dict of tensors and dicts) into this dict;
keys not in other stay.)doc",
              py::call_guard<EngineLock>())
          .def("to_dict", &to_dict,
               "Nested dicts of tensors (views of the store for a persistent dict)",
               py::call_guard<EngineLock>())
          .def_static(
              "stack", &TensorDict::stack, py::arg("dicts"), py::arg("dim") = 0,
              R"doc(Dicts with the same keys and batch size stacked along a new batch dim.)doc",
              py::call_guard<EngineLock>())
          .def_static("cat", &TensorDict::cat, py::arg("dicts"), py::arg("dim") = 0,
                      R"doc(Dicts with the same keys joined along batch dim `dim`.)doc",
                      py::call_guard<EngineLock>())
          .def(
              "__getstate__",
              [](const TensorDict& td) -> py::tuple {
                EngineLock lock;
                std::string prefix = td.prefix();
                if (!prefix.empty()) prefix.pop_back();  // "a/b/" -> "a/b" for sub()
                // A store is reopened by path, read-only, in the other process (spawn, pickling,
                // deepcopy): the committed state; a writer's lock and staged changes stay here.
                if (td.is_persistent())
                  return py::make_tuple(std::string("store"),
                                        std::filesystem::absolute(td.path()).string(), "r", prefix);
                // In memory: dense keys, ragged keys as (values, offsets), attributes.
                py::dict dense, ragged, attrs;
                for (const auto& k : td.keys()) {
                  if (td.is_ragged(k)) {
                    auto r = td.get_ragged(k);
                    ragged[py::str(k)] = py::make_tuple(r.values, r.offsets);
                  } else {
                    dense[py::str(k)] = td.get(k);
                  }
                }
                for (const auto& a : td.attr_names()) attrs[py::str(a)] = *td.attr(a);
                return py::make_tuple(std::string("memory"), dense, py::cast(td.batch_size()),
                                      ragged, attrs);
              },
              "The state pickle keeps: a store's path, or an in-memory dict's tensors");
  def_setstate<TensorDict>(td_class, [](const py::tuple& t) -> TensorDict {
    EngineLock lock;
    if (t[0].cast<std::string>() == "store") {
      TensorDict td =  // read-only whatever the mode recorded (earlier pickles: "r+")
          TensorDict::open(t[1].cast<std::string>(), tdstore::OpenMode::ReadOnly);
      const std::string prefix = t.size() > 3 ? t[3].cast<std::string>() : "";
      return prefix.empty() ? td : td.sub(prefix);
    }
    TensorDict td(t[2].cast<std::vector<int64_t>>());
    for (const auto& [k, v] : t[1].cast<py::dict>())
      td.set(k.cast<std::string>(), v.cast<at::Tensor>());
    if (t.size() > 3) {
      for (const auto& [k, v] : t[3].cast<py::dict>()) {
        auto pair = v.cast<py::tuple>();
        td.set_ragged(k.cast<std::string>(), pair[0].cast<at::Tensor>(),
                      pair[1].cast<at::Tensor>());
      }
      for (const auto& [k, v] : t[4].cast<py::dict>())
        td.set_attr(k.cast<std::string>(), v.cast<std::string>());
    }
    return td;
  });

  td_class
      .def(
          "close",
          [](TensorDict& td) {
            py::gil_scoped_release nogil;
            td.close();
          },
          R"(Closes the dict for every handle on it (copies, sub-dicts, loaders reading it): a store
is unmapped and its writer lock released now; changes not committed are discarded. Tensors
already read stay valid. Later calls raise tdstore.ClosedError (a ValueError). Idempotent.)",
          py::call_guard<EngineLock>())
      .def_property_readonly("closed", locked<TensorDict>(&TensorDict::closed),
                             "True once close() was called on this dict or a handle sharing it")
      .def(
          "__enter__", [](py::object self) { return self; },
          R"doc(Returns the dict (for `with`).)doc")
      .def(
          "__exit__",
          [](TensorDict& td, const py::object& type, const py::object&, const py::object&) {
            py::gil_scoped_release nogil;
            struct Closer {
              TensorDict& td;
              ~Closer() { td.close(); }
            } closer{td};  // closes when the commit throws too
            if (type.is_none() && !td.closed() && td.is_writable()) td.commit();
          },
          py::arg("exc_type"), py::arg("exc_value"), py::arg("traceback"),
          R"(Leaving a `with` block: commits what is staged when the block ended without an
exception (a writable store), then closes; after an exception nothing staged is committed.)",
          py::call_guard<EngineLock>());

  install_fast_getitem(td_class);

  auto dataset_class =
      py::class_<tdstore::Dataset>(
          m, "Dataset",
          R"(A directory of shard stores, each written by one writer, plus a
manifest that publish() commits atomically; read as one dataset of the published rows.

    ds = tdstore.Dataset.create("/data/fmnist")
    shard = ds.shard(rank)            # a persistent TensorDict of batch size [rows]
    shard.append(rows); shard.commit()
    ds.publish()                      # readers see these rows from their next refresh()
    loader = tdstore.Loader(ds, batch_size=256))")
          .def_static(
              "create",
              [](const std::filesystem::path& path, std::vector<int64_t> row_shape) {
                py::gil_scoped_release nogil;
                return tdstore::Dataset::create(path, std::move(row_shape));
              },
              py::arg("path"), py::arg("row_shape") = std::vector<int64_t>{},
              "Creates the dataset directory (a manifest with no shards), or opens it when it "
              "exists",
              py::call_guard<EngineLock>())
          .def_static(
              "open",
              [](const std::filesystem::path& path) {
                py::gil_scoped_release nogil;
                return tdstore::Dataset::open(path);
              },
              py::arg("path"),
              R"doc(Opens an existing dataset directory; FormatError when path is not one.)doc",
              py::call_guard<EngineLock>())
          .def_property_readonly("path", locked<tdstore::Dataset>([](const tdstore::Dataset& d) {
                                   return d.path().string();
                                 }),
                                 R"doc(The dataset directory.)doc")
          .def(
              "shard",
              [](tdstore::Dataset& d, int64_t shard, int64_t key_capacity,
                 int64_t lock_timeout_ms) {
                tdstore::StoreOptions o;
                o.key_capacity = key_capacity;
                o.lock_timeout_ms = lock_timeout_ms;
                py::gil_scoped_release nogil;
                return d.shard(shard, o);
              },
              py::arg("shard"), py::arg("key_capacity") = tdstore::StoreOptions{}.key_capacity,
              py::arg("lock_timeout_ms") = tdstore::StoreOptions{}.lock_timeout_ms,
              "The store of shard `shard`, open for writing (created on first use, reopened to "
              "resume)",
              py::call_guard<EngineLock>())
          .def(
              "publish",
              [](tdstore::Dataset& d) {
                py::gil_scoped_release nogil;
                d.publish();
              },
              "Publishes every shard's committed rows at once; a shard that disagrees is refused",
              py::call_guard<EngineLock>())
          .def(
              "refresh",
              [](tdstore::Dataset& d) {
                py::gil_scoped_release nogil;
                d.refresh();
              },
              R"doc(Moves to the newest publish (and the shards it names).)doc",
              py::call_guard<EngineLock>())
          .def_property_readonly("rows", locked<tdstore::Dataset>(&tdstore::Dataset::rows),
                                 "Published rows over all shards")
          .def_property_readonly("shard_rows",
                                 locked<tdstore::Dataset>(&tdstore::Dataset::shard_rows),
                                 "Published rows per shard")
          .def("__len__", &tdstore::Dataset::rows, R"doc(Published rows over all shards.)doc",
               py::call_guard<EngineLock>())
          .def("keys", &tdstore::Dataset::keys, R"doc(Keys of the published rows, sorted.)doc",
               py::call_guard<EngineLock>())
          .def(
              "index",
              [](const tdstore::Dataset& d, const at::Tensor& rows) {
                py::gil_scoped_release nogil;
                return d.index(rows);
              },
              py::arg("rows"), "Global rows (int64, 1-d) gathered across shards in the order given",
              py::call_guard<EngineLock>())
          .def("__getitem__", &dataset_getitem, py::arg("index"),
               "ds[i]: global row i (negative from the end) without the row dim; ds[a:b:c], "
               "ds[rows]: "
               "those rows",
               py::call_guard<EngineLock>())
          .def(
              "close",
              [](tdstore::Dataset& d) {
                py::gil_scoped_release nogil;
                d.close();
              },
              R"(Closes the dataset's manifest and the shard stores it reads, now; shard handles from
shard() stay open. Later calls raise tdstore.ClosedError (a ValueError). Idempotent.)",
              py::call_guard<EngineLock>())
          .def_property_readonly("closed", locked<tdstore::Dataset>(&tdstore::Dataset::closed),
                                 "True once close() was called")
          .def(
              "__enter__", [](py::object self) { return self; },
              R"doc(Returns the dataset (for `with`).)doc")
          .def(
              "__exit__",
              [](tdstore::Dataset& d, const py::args&) {
                py::gil_scoped_release nogil;
                d.close();
              },
              "Leaving a `with` block closes the dataset", py::call_guard<EngineLock>())
          .def(
              "__repr__",
              [](const tdstore::Dataset& d) {
                if (d.closed()) return std::string("tdstore.Dataset(closed)");
                return "tdstore.Dataset('" + d.path().string() +
                       "', rows=" + std::to_string(d.rows()) +
                       ", shards=" + std::to_string(d.shard_rows().size()) + ")";
              },
              R"doc(tdstore.Dataset('path', rows=..., shards=...).)doc",
              py::call_guard<EngineLock>())
          .def(
              "__getstate__",
              [](const tdstore::Dataset&
                     d) {  // reopened by path (spawn workers, pickling, deepcopy)
                EngineLock lock;
                return py::make_tuple(std::filesystem::absolute(d.path()).string());
              },
              "The state pickle keeps: the dataset's path");
  def_setstate<tdstore::Dataset>(dataset_class, [](const py::tuple& t) {
    EngineLock lock;
    if (t.size() != 1 || !py::isinstance<py::str>(t[0]))
      throw ArgumentTypeError("tdstore.Dataset: a pickled Dataset's state is (path,)");
    const std::string path = t[0].cast<std::string>();
    py::gil_scoped_release nogil;
    return tdstore::Dataset::open(path);
  });

  py::class_<PyLoader>(m, "Loader",
                       R"(Shuffled batches of a TensorDict's or a Dataset's rows (batch dim 0).

Each epoch visits an order drawn from (seed, epoch), identical in every process; rank r of
world_size takes every world_size-th position. order: "random" (a permutation of all rows, the
default), "sequential" (also shuffle=False), or "quasi_random" for data larger than memory
(blocks of block_bytes, default 8 MiB, in random order, rows shuffled within windows of half
of memory_budget, default 1 GiB, read ahead). Batches are in-memory TensorDicts, gathered by
num_workers threads without the GIL.)")
      .def(py::init([](py::object source, int64_t batch_size, bool shuffle, const py::int_& seed,
                       bool drop_last, int64_t rank, int64_t world_size, int num_workers,
                       int prefetch, py::object keys, const std::string& order, int64_t block_bytes,
                       int64_t memory_budget) {
             tdstore::LoaderOptions o;
             if (order == "random")
               o.order = tdstore::LoaderOrder::Random;
             else if (order == "sequential")
               o.order = tdstore::LoaderOrder::Sequential;
             else if (order == "quasi_random")
               o.order = tdstore::LoaderOrder::QuasiRandom;
             else
               throw tdstore::ArgumentError(
                   "Loader: order '" + order +
                   "' is not one of 'random', 'sequential', 'quasi_random'");
             o.block_bytes = block_bytes;
             o.memory_budget = memory_budget;
             o.batch_size = batch_size;
             o.shuffle = shuffle;
             o.seed = unsigned_64("Loader: seed", seed);
             o.drop_last = drop_last;
             o.rank = rank;
             o.world_size = world_size;
             o.num_workers = num_workers;
             o.prefetch = prefetch;
             o.serialize_writes = [](const std::function<void()>& write) {
               EngineLock lock(PyGILState_Check() != 0);
               write();
             };
             if (py::isinstance<py::str>(keys))  // keys="image" names one key
               o.keys.push_back(key_of(keys));
             else if (!keys.is_none())
               for (const auto& k : keys) o.keys.push_back(key_of(k));
             auto l = std::make_unique<PyLoader>();
             l->source_ref = source;
             if (py::isinstance<tdstore::Dataset>(source)) {
               l->loader = std::make_unique<tdstore::Loader>(source.cast<tdstore::Dataset>(), o);
             } else if (py::isinstance<TensorDict>(source)) {
               l->loader = std::make_unique<tdstore::Loader>(source.cast<TensorDict>(), o);
             } else {
               throw ArgumentTypeError(
                   "Loader: source must be a tdstore.TensorDict or a tdstore.Dataset, not " +
                   py::str(py::type::of(source)).cast<std::string>());
             }
             return l;
           }),
           py::arg("source"), py::arg("batch_size") = kLoaderDefaults.batch_size,
           py::arg("shuffle") = kLoaderDefaults.shuffle,
           py::arg("seed") = py::int_(kLoaderDefaults.seed),
           py::arg("drop_last") = kLoaderDefaults.drop_last, py::arg("rank") = kLoaderDefaults.rank,
           py::arg("world_size") = kLoaderDefaults.world_size,
           py::arg("num_workers") = kLoaderDefaults.num_workers,
           py::arg("prefetch") = kLoaderDefaults.prefetch, py::arg("keys") = py::none(),
           py::arg("order") = "random", py::arg("block_bytes") = kLoaderDefaults.block_bytes,
           py::arg("memory_budget") = kLoaderDefaults.memory_budget,
           R"doc(Batches of source's rows (a tdstore.TensorDict or tdstore.Dataset; batch dim 0).

batch_size: rows per batch. shuffle: False reads in order. seed: with the epoch (set_epoch),
what the order is drawn from, identical in every process. drop_last: drop this rank's last
batch when it is smaller. rank, world_size: this process's share (every world_size-th batch
position). num_workers: gathering threads (0: on the iterating thread). prefetch: batches
gathered ahead. keys: the keys (or '/' prefixes) to load, every key when None. order:
"random", "sequential" or "quasi_random". block_bytes, memory_budget: quasi_random's block
size and the memory its window and read-ahead may use.)doc")
      .def(
          "set_epoch",
          [](PyLoader& l, int64_t epoch) {
            py::gil_scoped_release nogil;
            l.get().set_epoch(epoch);
            l.it.reset();
            l.fresh = true;
          },
          py::arg("epoch"),
          R"doc(Reshuffles from (seed, epoch) and restarts at the epoch's first batch; takes the source's
rows (appended, committed or refreshed since) anew.)doc")
      .def(
          "__len__", [](const PyLoader& l) { return l.get().size(); },
          R"doc(Batches per epoch for this rank.)doc")
      .def("close", &PyLoader::close,
           "Stops the pass in progress, stores computed row features and releases the source; "
           "later calls raise tdstore.ClosedError (a ValueError). Also called at interpreter exit.")
      .def_property_readonly(
          "closed", [](const PyLoader& l) { return !l.loader; }, "True once close() was called")
      .def(
          "__enter__", [](py::object self) { return self; },
          R"doc(Returns the loader (for `with`).)doc")
      .def(
          "__exit__", [](PyLoader& l, py::args) { l.close(); },
          "Leaving a `with` block closes the loader")
      .def(
          "__repr__",
          [](const PyLoader& l) {
            if (!l.loader) return std::string("tdstore.Loader(closed)");
            auto p = l.loader->position();
            return "tdstore.Loader(rows=" + std::to_string(l.loader->rows()) +
                   ", batches=" + std::to_string(l.loader->size()) +
                   ", batch_size=" + std::to_string(p.batch_size.value_or(0)) +
                   ", epoch=" + std::to_string(p.epoch) + ", step=" + std::to_string(p.step) + ")";
          },
          R"doc(tdstore.Loader(rows=..., batches=..., batch_size=..., epoch=..., step=...).)doc")
      .def(
          "add_feature",
          [](PyLoader& l, const py::object& k, std::vector<std::string> deps, py::function fn,
             const std::string& version) {
            tdstore::RowFeature f;
            f.key = key_of(k);
            f.deps = std::move(deps);
            PyCallable call(fn);  // runs on a worker thread: takes the GIL there
            f.fn = [call, what = "row feature '" + f.key + "'"](const TensorDict& rows) {
              return call.tensor(what, rows);
            };
            f.version = version;
            py::gil_scoped_release nogil;
            l.it.reset();
            l.fresh = true;
            return l.get().add_feature(std::move(f));
          },
          py::arg("key"), py::arg("deps"), py::arg("fn"), py::arg("version") = "",
          R"(Adds a row-wise lazy feature: fn(rows) gets the deps of some rows and returns one value
per row. Computed the first time a batch visits a row, stored beside the source with its
provenance, read by later epochs and runs; True when the source already holds it complete.)")
      .def(
          "feature_rows_done",
          [](const PyLoader& l, const py::object& k) {
            return l.get().feature_rows_done(key_of(k));
          },
          py::arg("key"), R"doc(Rows of the row feature `key` computed and stored so far.)doc")
      .def(
          "flush_features",
          [](PyLoader& l) {
            py::gil_scoped_release nogil;
            l.get().flush_features();
          },
          R"doc(Stores the row features computed so far (also done at the end of each epoch and at close()).)doc")
      .def_property_readonly(
          "rows", [](const PyLoader& l) { return l.get().rows(); },
          R"doc(Rows per epoch for this rank.)doc")
      .def(
          "state_dict",
          [](const PyLoader& l) {
            tdstore::LoaderPosition p = l.get().position();
            py::dict d;
            tdstore::for_each_field(p, [&d]<class T>(const char* name, const T& v) {
              if constexpr (std::is_same_v<T, decltype(p.shards)>) {
                if (!v) return;  // a dataset's: [shard, published rows] per shard
                py::list shards;
                for (const auto& [id, rows] : *v) shards.append(py::make_tuple(id, rows));
                d[name] = shards;
              } else if constexpr (requires { typename T::value_type; }) {
                d[name] = v ? py::cast(*v) : py::none();
              } else {
                d[name] = v;
              }
            });
            return d;
          },
          "The loader's position and what its stream depends on (PyTorch's resume convention)")
      .def(
          "load_state_dict",
          [](PyLoader& l, const py::dict& d) {
            auto field = [&](const char* name) -> py::object {
              if (!d.contains(name))
                throw tdstore::ArgumentError(
                    std::string("Loader.load_state_dict: the state has no field '") + name +
                    "' (expected a dict from Loader.state_dict())");
              return d[name];
            };
            auto num = [&](const char* name) {
              try {
                return field(name).cast<int64_t>();
              } catch (const py::cast_error&) {
                throw ArgumentTypeError(std::string("Loader.load_state_dict: field '") + name +
                                        "' is not an integer");
              }
            };
            tdstore::LoaderPosition p;
            tdstore::for_each_field(p, [&]<class T>(const char* name, T& out) {
              if constexpr (std::is_same_v<T, decltype(p.shards)>) {
                if (!d.contains(name) || d[name].is_none()) return;
                out.emplace();
                const ArgumentTypeError bad(std::string("Loader.load_state_dict: field '") + name +
                                            "' is not a list of [shard, rows] integer pairs");
                if (!py::isinstance<py::sequence>(d[name])) throw bad;
                for (const auto& s : d[name]) {
                  if (!py::isinstance<py::sequence>(s) || py::len(s) != 2) throw bad;
                  auto pair = py::reinterpret_borrow<py::sequence>(s);
                  if (!py::isinstance<py::int_>(pair[0]) || !py::isinstance<py::int_>(pair[1]))
                    throw bad;
                  out->emplace_back(pair[0].cast<int64_t>(), pair[1].cast<int64_t>());
                }
              } else if constexpr (std::is_same_v<T, std::optional<bool>>) {
                if (d.contains(name) && !d[name].is_none()) {
                  if (!py::isinstance<py::bool_>(d[name]))
                    throw ArgumentTypeError(std::string("Loader.load_state_dict: field '") + name +
                                            "' is not a bool (True or False), got " +
                                            type_name(d[name]));
                  out = d[name].cast<bool>();
                }
              } else if constexpr (requires { typename T::value_type; }) {
                if (d.contains(name) && !d[name].is_none()) out = num(name);
              } else {
                out = static_cast<T>(num(name));  // required
              }
            });
            py::gil_scoped_release nogil;
            l.get().restore(p);
            l.it.reset();
            l.fresh = true;
          },
          py::arg("state"),
          "Continues from state_dict(): the remaining batches of that epoch, exactly")
      .def(
          "save",
          [](const PyLoader& l, TensorDict& store, const std::string& name) {
            l.get().save(store, name);
          },
          py::arg("store"), py::arg("name"),
          R"doc(Saves the loader's position into store (a writable TensorDict) under name; committed with it.)doc")
      .def(
          "load",
          [](PyLoader& l, const TensorDict& store, const std::string& name) {
            py::gil_scoped_release nogil;
            bool found = l.get().load(store, name);
            l.it.reset();
            l.fresh = true;
            return found;
          },
          py::arg("store"), py::arg("name"),
          R"doc(Continues from the position saved under name in store; False when there is none.)doc")
      .def(
          "__iter__",
          [](py::object self) {
            auto& l = self.cast<PyLoader&>();
            l.it.reset();
            l.fresh = true;
            return PyLoaderIterator{self, ++l.pass};
          },
          "A new pass over the epoch's batches (as DataLoader's iter()); an older iterator of "
          "this Loader stops with an Error");

  py::class_<PyLoaderIterator>(m, "LoaderIterator",
                               "One pass over a Loader's batches (iter(loader))")
      .def(
          "__iter__", [](py::object self) { return self; }, R"doc(Returns the iterator.)doc")
      .def(
          "__repr__",
          [](const PyLoaderIterator& i) {
            return "tdstore.LoaderIterator(pass=" + std::to_string(i.pass) + ")";
          },
          R"doc(tdstore.LoaderIterator(pass=...).)doc")
      .def(
          "__next__",
          [](PyLoaderIterator& i) {
            auto& l = i.loader.cast<PyLoader&>();
            l.get();  // Error once closed
            if (i.pass != l.pass)
              throw tdstore::Error(
                  "Loader iterator: a newer iter() of its Loader started another pass; iterate "
                  "that "
                  "one (one pass runs at a time)");
            py::gil_scoped_release nogil;
            if (l.fresh) {
              l.it.emplace(l.get().begin());
              l.fresh = false;
            } else if (l.it) {
              ++*l.it;
            }
            if (!l.it || !(*l.it != l.get().end())) {
              l.it.reset();
              py::gil_scoped_acquire gil;
              throw py::stop_iteration();
            }
            return **l.it;
          },
          R"doc(The next batch, an in-memory TensorDict; StopIteration at the end of the epoch.)doc");

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
      "_cache_in_parallel",
      [](tdstore::Dataset& dataset, int64_t rank, int64_t world_size, py::function barrier,
         py::function job) {
        py::gil_scoped_release
            nogil;  // the engine's steps run without the GIL, the callbacks with it
        tdstore::cache_in_parallel(
            dataset, rank, world_size,
            [&] {
              py::gil_scoped_acquire gil;
              barrier();
            },
            [&](TensorDict& shard, int64_t r, int64_t world) {
              py::gil_scoped_acquire gil;
              job(shard, r, world);
            });
      },
      py::arg("dataset"), py::arg("rank"), py::arg("world_size"), py::arg("barrier"),
      py::arg("job"),
      "tdstore::cache_in_parallel with the barrier a Python callable (tdstore.cache_in_parallel); "
      "other threads' tdstore calls wait until it returns",
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
