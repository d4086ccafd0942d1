// The C side of tdstore._walk (Walk.still_holds). Internal to the extension.
#pragma once

#include <pybind11/pybind11.h>

namespace tdstore::python {

namespace py = pybind11;

// True when every check still finds the identical object: `attrs` holds (object, name,
// expected) for getattr(object, name, missing); `globals` (dict, name, expected) for
// dict.get(name, missing); `cells` (cell, expected) for the cell's contents (missing when
// empty); `dicts` (dict, keys, values) and `lists` (iterable, elements), tuples in iteration
// order. Needs the GIL; reads only, never raises (an error reading a place fails its check).
bool walk_checks_hold(py::list attrs, py::list globals, py::list cells, py::list dicts,
                      py::list lists, py::object missing);

}  // namespace tdstore::python
