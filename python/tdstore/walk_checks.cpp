// tdstore._walk's reuse test in C: whether every place a walk read still holds the identical
// object it found there (Walk.still_holds). The checks are Python lists built by the walk; this
// only compares pointers, so a walk of a few hundred places is re-proved in microseconds.
#include "walk_checks.h"

#include <Python.h>

namespace tdstore::python {
namespace {

// Borrowed `what` and `expected`; an attribute that raises AttributeError reads as `missing`.
// Any other error leaves the check failed (the new walk raises it where it belongs).
bool attr_is(PyObject* o, PyObject* name, PyObject* expected, PyObject* missing) {
  PyObject* v = PyObject_GetAttr(o, name);
  if (!v) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
      PyErr_Clear();
      return false;
    }
    PyErr_Clear();
    return expected == missing;
  }
  const bool same = v == expected;
  Py_DECREF(v);
  return same;
}

// The elements `iterable` yields now are `expected` (a tuple), object for object, in order.
bool yields(PyObject* iterable, PyObject* expected) {
  const Py_ssize_t n = PyTuple_GET_SIZE(expected);
  if (PyList_CheckExact(iterable)) {
    if (PyList_GET_SIZE(iterable) != n) return false;
    for (Py_ssize_t i = 0; i < n; ++i)
      if (PyList_GET_ITEM(iterable, i) != PyTuple_GET_ITEM(expected, i)) return false;
    return true;
  }
  PyObject* it = PyObject_GetIter(iterable);
  if (!it) {
    PyErr_Clear();
    return false;
  }
  Py_ssize_t i = 0;
  bool same = true;
  while (PyObject* x = PyIter_Next(it)) {
    same = i < n && x == PyTuple_GET_ITEM(expected, i);
    Py_DECREF(x);
    ++i;
    if (!same) break;
  }
  Py_DECREF(it);
  if (PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return same && i == n;
}

// A dict's keys and values now are `keys` and `values`, in iteration order. An exact dict is
// read in place; a subclass (an OrderedDict keeps its own order) through keys() and values().
bool dict_holds(PyObject* d, PyObject* keys, PyObject* values) {
  const Py_ssize_t n = PyTuple_GET_SIZE(keys);
  if (PyDict_CheckExact(d)) {
    if (PyDict_GET_SIZE(d) != n) return false;
    Py_ssize_t pos = 0, i = 0;
    PyObject *k, *v;
    while (PyDict_Next(d, &pos, &k, &v)) {
      if (k != PyTuple_GET_ITEM(keys, i) || v != PyTuple_GET_ITEM(values, i)) return false;
      ++i;
    }
    return i == n;
  }
  const Py_ssize_t now = PyObject_Length(d);
  if (now != n) {
    PyErr_Clear();
    return false;
  }
  if (n == 0) return true;
  bool same = true;
  for (const char* view : {"keys", "values"}) {
    PyObject* items = PyObject_CallMethod(d, view, nullptr);
    if (!items) {
      PyErr_Clear();
      return false;
    }
    same = yields(items, view[0] == 'k' ? keys : values);
    Py_DECREF(items);
    if (!same) break;
  }
  return same;
}

// Each element of `checks` (a list) is a tuple; `holds` tests one.
template <typename Holds>
bool all_hold(PyObject* checks, Holds holds) {
  const Py_ssize_t n = PyList_GET_SIZE(checks);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!holds(PyList_GET_ITEM(checks, i))) return false;
  return true;
}

#define AT(t, i) PyTuple_GET_ITEM(t, i)

}  // namespace

bool walk_checks_hold(py::list attrs, py::list globals, py::list cells, py::list dicts,
                      py::list lists, py::object missing) {
  PyObject* m = missing.ptr();
  return all_hold(attrs.ptr(),
                  [&](PyObject* c) { return attr_is(AT(c, 0), AT(c, 1), AT(c, 2), m); }) &&
         all_hold(globals.ptr(),
                  [&](PyObject* c) {
                    PyObject* v = PyDict_GetItemWithError(AT(c, 0), AT(c, 1));  // borrowed
                    if (!v && PyErr_Occurred()) {
                      PyErr_Clear();
                      return false;
                    }
                    return (v ? v : m) == AT(c, 2);
                  }) &&
         all_hold(cells.ptr(),
                  [&](PyObject* c) {
                    PyObject* v = PyCell_GET(AT(c, 0));  // borrowed; null: an empty cell
                    return (v ? v : m) == AT(c, 1);
                  }) &&
         all_hold(dicts.ptr(),
                  [](PyObject* c) { return dict_holds(AT(c, 0), AT(c, 1), AT(c, 2)); }) &&
         all_hold(lists.ptr(), [](PyObject* c) { return yields(AT(c, 0), AT(c, 1)); });
}

}  // namespace tdstore::python
