// tdstore.Error and its subclasses, each also the matching builtin, and the translation of
// the engine's exceptions into them (binding.h).
#include "binding.h"

namespace tdstore::python {

namespace {

// Python exception classes mirroring tdstore::Error's hierarchy, with the matching builtin
// as a second base (KeyError, ValueError, OSError, ...), so `except KeyError` works.
struct Exceptions {
  PyObject *error, *argument, *argument_type, *key, *shape, *index, *dtype, *capacity, *corruption,
      *format, *lock, *readonly, *io, *closed;
};
Exceptions exc;

PyObject* make_exception(py::module_& m, const char* name, PyObject* base, PyObject* builtin,
                         const char* doc) {
  std::string full = std::string("tdstore.") + name;
  PyObject* bases = builtin ? PyTuple_Pack(2, base, builtin) : PyTuple_Pack(1, base);
  PyObject* cls = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  Py_DECREF(bases);
  m.add_object(name, py::handle(cls));
  return cls;
}

}  // namespace

void bind_errors(py::module_& m) {
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
}

}  // namespace tdstore::python
