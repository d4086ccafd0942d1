// Python values to the engine's and back: keys, tensors (from numpy arrays and sequences),
// nested dicts of leaves, sizes and modes (binding.h).
#include "binding.h"

namespace tdstore::python {

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
at::Tensor tensor_of(const py::handle& v, const std::string& what) {
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
  auto refuse = [&]() -> std::vector<int64_t> {
    throw ArgumentTypeError(
        "batch_size is a sequence of ints (a list, a tuple or a torch.Size), "
        "not " +
        std::string(py::repr(b)));
  };
  if (!py::isinstance<py::sequence>(b) || py::isinstance<py::str>(b)) return refuse();
  std::vector<int64_t> out;
  for (const auto& d : b) {
    if (!py::isinstance<py::int_>(d) || py::isinstance<py::bool_>(d)) return refuse();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(d.ptr(), &overflow);
    if (overflow != 0)
      throw tdstore::ArgumentError("batch_size " + std::string(py::repr(b)) +
                                   ": a dim beyond int64");
    out.push_back(v);
  }
  return out;
}

py::object torch_size(const std::vector<int64_t>& s) {
  return py::module_::import("torch").attr("Size")(py::cast(s));
}
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

std::optional<tdstore::Compression> compression_of(const std::optional<std::string>& text,
                                                   std::optional<int> level) {
  if (!text && !level) return std::nullopt;
  tdstore::Compression c = tdstore::Compression::parse(text.value_or("zstd"));
  if (level) {
    if (!c.enabled())
      throw tdstore::ArgumentError("level=" + std::to_string(*level) +
                                   " given with compression \"none\"");
    c = tdstore::Compression::parse("zstd:" + std::to_string(*level) + ":" +
                                    std::to_string(c.block_bytes));
  }
  return c;
}

}  // namespace tdstore::python
