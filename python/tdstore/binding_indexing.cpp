// Indexing a TensorDict (keys, rows, slices, masks, one index per batch dim) and a Dataset
// (rows) from Python, with torch's refusals as tdstore errors (binding.h).
#include <ATen/ops/arange.h>

#include <algorithm>

#include "binding.h"

namespace tdstore::python {

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

at::Tensor index_tensor_of(const TensorDict& td, const py::handle& i) {
  at::Tensor t = tensor_of(i, "the index");
  if (t.numel() == 0 && at::isFloatingType(t.scalar_type())) return t.to(at::kLong);  // td[[]]
  if (!at::isIntegralType(t.scalar_type(), /*includeBool=*/true))
    throw tdstore::IndexError(where_of(td) +
                              "index tensors are integral (rows) or bool (a mask), not " +
                              std::string(c10::toString(t.scalar_type())));
  return t;
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
  at::Tensor t = index_tensor_of(td, idx);
  if (t.dim() == 0 && t.scalar_type() != at::kBool && t.scalar_type() != at::kByte)  // an int
    return py::cast(td.index(t.item<int64_t>()));
  if (t.dim() == 0) throw_new_dim();
  return py::cast(td.index(t));
}
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

namespace {

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

}  // namespace

void install_fast_getitem(const py::handle& td_class) {
  bound_getitem = PyObject_GetAttrString(td_class.ptr(), "__getitem__");  // for the module's life
  if (!bound_getitem) throw py::error_already_set();
  auto* type = reinterpret_cast<PyTypeObject*>(td_class.ptr());
  type->tp_as_mapping->mp_subscript = fast_getitem;
  PyType_Modified(type);
}

}  // namespace tdstore::python
