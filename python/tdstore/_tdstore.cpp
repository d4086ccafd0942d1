// The Python binding: a thin layer over the C++ engine (include/tdstore/). Conversions only;
// every rule (keys, batch sizes, guards, reuse) is the engine's.
//
// Each Python class or concern has its file (bind_*.cpp); what they share is binding.h.
#include <pthread.h>

#include "binding.h"

PYBIND11_MODULE(_tdstore, m) {
  m.doc() = "tdstore: memory-mapped TensorDict stores (binding over the C++ engine)";
  pthread_atfork(nullptr, nullptr, &tdstore::python::EngineLock::after_fork_in_child);
  tdstore::python::bind_errors(m);
  tdstore::python::bind_dict(m);
  tdstore::python::bind_dataset(m);
  tdstore::python::bind_loader(m);
  tdstore::python::bind_compile(m);
  tdstore::python::bind_formats(m);
}
