// tensordict's API on TensorDict: row assignment (td[i] = row), shape, device and to(),
// reshaping (split, chunk, unbind, batch_size =), key renaming, comparison (==, all, any).
#include <torch/csrc/Dtype.h>

#include "binding.h"

namespace tdstore::python {
namespace {

// The rows of td[index] = value: a TensorDict or a dict of tensors as they are; a number or a
// tensor for every dense key of td (the engine broadcasts each to its key's rows). Batch size []:
// the engine checks each value against the rows the index selects.
TensorDict rows_of(const TensorDict& td, const py::handle& v) {
  if (py::isinstance<TensorDict>(v)) return v.cast<TensorDict>();
  Leaves leaves;
  if (py::isinstance<py::dict>(v)) {
    collect_leaves("", v, leaves);
  } else {
    const at::Tensor t = tensor_of(v);
    for (const auto& k : td.keys())
      if (!td.is_ragged(k)) leaves.dense.emplace_back(k, t);  // ragged rows are set whole
  }
  return checked(leaves, {});
}

// A tuple with a str in it is a key, even when key_of refuses it (("a", 3) is a TypeError).
bool holds_str(const py::handle& k) {
  if (!py::isinstance<py::tuple>(k)) return false;
  for (const auto& part : k.cast<py::tuple>())
    if (py::isinstance<py::str>(part)) return true;
  return false;
}

[[noreturn]] void throw_not_rows(const TensorDict& td, const py::handle& idx) {
  throw tdstore::IndexError(where_of(td) + "td[index] = rows takes one index along batch dim 0 " +
                            "(an int, a slice, an index tensor or a bool mask), not " +
                            std::string(py::repr(idx)));
}

// td[idx] = v for an index of rows: the engine's set_rows.
void set_rows(TensorDict& td, const py::object& idx, const py::handle& v) {
  TensorDict rows = rows_of(td, v);
  py::object i = idx;
  if (py::isinstance<py::tuple>(i) && py::len(i) == 1) i = i.cast<py::tuple>()[0];
  if (py::isinstance<py::bool_>(i) || i.is_none() || py::isinstance<py::tuple>(i))
    throw_not_rows(td, idx);
  if (py::isinstance<py::int_>(i)) {
    const int64_t row = index_of(td, i);
    py::gil_scoped_release nogil;
    return td.set_rows(row, rows);
  }
  if (py::isinstance<py::slice>(i) || i.ptr() == Py_Ellipsis) {
    if (td.batch_size().empty())
      throw tdstore::ShapeError(where_of(td) + "td[index] = rows on a dict with no batch dims");
    py::ssize_t start = 0, stop = 0, step = 1, n = 0;
    if (py::isinstance<py::slice>(i) &&
        !i.cast<py::slice>().compute(td.batch_size()[0], &start, &stop, &step, &n)) {
      py::error_already_set e;  // a step of 0, or bounds that are not ints
      throw tdstore::ArgumentError(where_of(td) + "td[" + std::string(py::repr(i)) +
                                   "] = rows: " + py::str(e.value()).cast<std::string>());
    }
    if (i.ptr() == Py_Ellipsis) stop = td.batch_size()[0];
    if (step <= 0)
      throw tdstore::ArgumentError(where_of(td) + "TensorDict slices need a positive step, got " +
                                   std::to_string(step));
    py::gil_scoped_release nogil;
    return td.set_rows(start, std::max(start, stop), step, rows);
  }
  const at::Tensor t = index_tensor_of(td, i);
  if (t.dim() == 0 && t.scalar_type() != at::kBool && t.scalar_type() != at::kByte) {
    const int64_t row = t.item<int64_t>();
    py::gil_scoped_release nogil;
    return td.set_rows(row, rows);
  }
  if (t.dim() == 0) throw_not_rows(td, idx);
  py::gil_scoped_release nogil;
  td.set_rows(t, rows);
}

// An int argument: ArgumentTypeError naming `what` for anything else, ArgumentError beyond int64.
int64_t int_arg(const TensorDict& td, const char* what, const py::handle& v) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
    throw ArgumentTypeError(where_of(td) + what + " is an int, not " + type_name(v));
  int overflow = 0;
  const long long n = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow != 0)
    throw tdstore::ArgumentError(where_of(td) + what + " " + std::string(py::repr(v)) +
                                 " is beyond int64");
  return n;
}

// split's argument: an int (the size of each piece) or a list of ints (the pieces' sizes).
std::vector<TensorDict> split(const TensorDict& td, const py::object& size, const py::object& dim) {
  const int64_t d = int_arg(td, "split: dim", dim);
  if (py::isinstance<py::sequence>(size) && !py::isinstance<py::str>(size)) {
    std::vector<int64_t> sizes;
    for (const auto& s : size) sizes.push_back(int_arg(td, "split: each size", s));
    py::gil_scoped_release nogil;
    return td.split(sizes, d);
  }
  const int64_t n = int_arg(td, "split: split_size (or a list of sizes)", size);
  py::gil_scoped_release nogil;
  return td.split(n, d);
}

py::object compare(const TensorDict& td, const py::object& other, bool equal) {
  if (py::isinstance<TensorDict>(other)) {
    const auto& o = other.cast<const TensorDict&>();
    return py::cast(equal ? td.eq(o) : td.ne(o));
  }
  if (py::isinstance<py::dict>(other)) {
    Leaves leaves;
    collect_leaves("", other, leaves);
    const TensorDict o = checked(leaves, {});
    return py::cast(equal ? td.eq(o) : td.ne(o));
  }
  if (py::isinstance<py::str>(other) || other.is_none())
    return py::reinterpret_borrow<py::object>(Py_NotImplemented);
  const at::Tensor t = tensor_of(other, "the value compared");
  return py::cast(equal ? td.eq(t) : td.ne(t));
}

}  // namespace

void bind_dict_api(py::class_<TensorDict>& c) {
  c.def(
       "__setitem__",
       [](TensorDict& td, const py::object& k, const py::object& v) {
         if (is_key(k) || holds_str(k)) return assign(td, key_of(k), v);  // key_of: TypeError
         set_rows(td, k, v);
       },
       py::arg("key"), py::arg("value"),
       R"doc(td[key] = value sets a key: a tensor (or numpy array) whose leading dims are the batch
size; a dict or TensorDict replaces the sub-dict under key with its leaves, as in tensordict. On a
store the bytes are written now and the keys staged until commit().

td[index] = rows writes rows (index: an int, a slice, an index tensor or a bool mask along batch
dim 0; rows: a TensorDict, a dict of tensors, or a number or tensor for every key), as
t[index] = value does for each of rows' keys, cast to the key's dtype and broadcast to its rows.
In memory the leaves are written in place. On a store each key is rewritten whole, staged until
commit() (the cost is the key's size: assign many rows at once); tensors read before keep their
values. tdstore.ReadOnlyError on a read-only store.)doc",
       py::call_guard<EngineLock>())
      .def_property(
          "batch_size",
          locked<TensorDict>([](const TensorDict& td) { return torch_size(td.batch_size()); }),
          [](TensorDict& td, const py::object& b) {
            EngineLock lock;
            td.set_batch_size(sizes_of(b));
          },
          R"doc(The leading dims every tensor shares, as a torch.Size. Settable on an in-memory dict
to any leading dims its leaves share; a store's is its rows (tdstore.ArgumentError).)doc")
      .def_property_readonly("shape", locked<TensorDict>([](const TensorDict& td) {
                               return torch_size(td.batch_size());
                             }),
                             R"doc(The batch size (tensordict's td.shape).)doc")
      .def_property_readonly(
          "device", locked<TensorDict>([](const TensorDict& td) -> py::object {
            auto d = td.device();
            return d ? py::cast(*d) : py::none();
          }),
          R"doc(The device every leaf is on (cpu for a store); None for an in-memory dict whose leaves
are on several devices, or that has none.)doc")
      .def(
          "to",
          [](const py::object& self, const py::object& dest, const py::object& dtype_arg,
             const py::object& device_arg) -> py::object {
            const auto& td = self.cast<const TensorDict&>();
            std::optional<at::ScalarType> dtype;
            std::optional<at::Device> device;
            auto device_of = [&](const py::object& d) {
              if (py::isinstance<TensorDict>(d)) {
                device = d.cast<const TensorDict&>().device();
                if (!device)
                  throw tdstore::ArgumentError(where_of(td) +
                                               "to(other): other's leaves are on several devices");
                return;
              }
              try {
                device = py::module_::import("torch").attr("device")(d).cast<at::Device>();
              } catch (py::error_already_set&) {
                throw ArgumentTypeError(where_of(td) +
                                        "to(): a torch.dtype, a device (torch.device or str) or "
                                        "a TensorDict, not " +
                                        std::string(py::repr(d)));
              }
            };
            auto dtype_of = [&](const py::object& d) {
              if (!THPDtype_Check(d.ptr()))
                throw ArgumentTypeError(where_of(td) + "to(dtype=): a torch.dtype, not " +
                                        std::string(py::repr(d)));
              dtype = reinterpret_cast<THPDtype*>(d.ptr())->scalar_type;
            };
            if (THPDtype_Check(dest.ptr()))
              dtype_of(dest);
            else if (!dest.is_none())
              device_of(dest);
            if (!dtype_arg.is_none()) dtype_of(dtype_arg);
            if (!device_arg.is_none()) device_of(device_arg);
            if (!dtype && !device)
              throw ArgumentTypeError(where_of(td) + "to(): give a torch.dtype or a device");
            if (device && device->is_cpu()) device = at::Device(at::kCPU);  // cpu:0 is the cpu
            py::object out = self;  // already there: td itself
            if (device && td.device() != device) out = py::cast(td.to(*device));
            if (dtype) out = py::cast(out.cast<const TensorDict&>().to(*dtype));
            return out;
          },
          py::arg("dest") = py::none(), py::kw_only(), py::arg("dtype") = py::none(),
          py::arg("device") = py::none(),
          R"doc(td.to(torch.float16) (or dtype=) casts every leaf (an in-memory dict; ragged keys'
values); td.to("cpu") (or device=, or another TensorDict's device) moves every leaf there, and is
td itself when they are there already (a store is on the cpu). tdstore.DTypeError for a dtype a
store cannot hold, tdstore.ArgumentError for a device this torch cannot reach.)doc",
          py::call_guard<EngineLock>())
      .def("split", &split, py::arg("split_size"), py::arg("dim") = 0,
           R"doc(Pieces along batch dim `dim`, as torch.split: split_size rows each (the last one
shorter), or a list of sizes summing to the dim's size. Along dim 0 each piece is td[a:b].)doc",
           py::call_guard<EngineLock>())
      .def(
          "chunk",
          [](const TensorDict& td, const py::object& chunks, const py::object& dim) {
            return td.chunk(int_arg(td, "chunk: chunks", chunks), int_arg(td, "chunk: dim", dim));
          },
          py::arg("chunks"), py::arg("dim") = 0,
          R"doc(chunks pieces along batch dim `dim` (fewer when it is short), as torch.chunk.)doc",
          py::call_guard<EngineLock>())
      .def(
          "unbind",
          [](const TensorDict& td, const py::object& dim) {
            return td.unbind(int_arg(td, "unbind: dim", dim));
          },
          py::arg("dim") = 0,
          R"doc(One dict per index along batch dim `dim`, without that dim, as torch.unbind.)doc",
          py::call_guard<EngineLock>())
      .def("flatten_keys", &TensorDict::flatten_keys, py::arg("separator") = ".",
           R"doc(An in-memory dict whose keys are this one's with '/' replaced by separator
("a/b" -> "a.b"), tensordict's flat keys.)doc",
           py::call_guard<EngineLock>())
      .def("unflatten_keys", &TensorDict::unflatten_keys, py::arg("separator") = ".",
           R"doc(An in-memory dict whose keys are this one's with separator replaced by '/'
("a.b" -> "a/b").)doc",
           py::call_guard<EngineLock>())
      .def(
          "rename_key_",
          [](TensorDict& td, const py::object& from, const py::object& to) -> TensorDict& {
            const std::string f = key_of(from), t = key_of(to);
            py::gil_scoped_release nogil;
            td.rename_key(f, t);
            return td;
          },
          py::arg("old_key"), py::arg("new_key"), py::return_value_policy::reference_internal,
          R"doc(Moves a key to a new name (returns td): KeyError when old_key is absent or new_key
exists. On a store the key's bytes are written under the new name and the old one erased,
staged until commit(). A lazy property renamed becomes a plain key.)doc",
          py::call_guard<EngineLock>())
      .def(
          "__eq__", [](const TensorDict& td, const py::object& o) { return compare(td, o, true); },
          py::arg("other"),
          R"doc(Leafwise ==, as tensordict: an in-memory dict of bool tensors. other: a TensorDict or
dict with the same keys, or a tensor or number compared with every leaf. (td == o).all() is True
when they are equal everywhere.)doc",
          py::call_guard<EngineLock>())
      .def(
          "__ne__", [](const TensorDict& td, const py::object& o) { return compare(td, o, false); },
          py::arg("other"), R"doc(Leafwise !=: an in-memory dict of bool tensors.)doc",
          py::call_guard<EngineLock>())
      .def(
          "all", &TensorDict::all,
          R"doc(True when every element of every leaf is nonzero (True for a dict without keys).)doc",
          py::call_guard<EngineLock>())
      .def("any", &TensorDict::any, R"doc(True when some element of some leaf is nonzero.)doc",
           py::call_guard<EngineLock>())
      .def(
          "__bool__",
          [](const TensorDict& td) -> bool {
            throw tdstore::ArgumentError(
                where_of(td) +
                "the truth value of a TensorDict is ambiguous: use td.all() or td.any() for a "
                "comparison's result, len(td) for its rows, td.keys() for its keys");
          },
          R"doc(Refused (tdstore.ArgumentError), as for tensordict and multi-element tensors.)doc");
  c.attr("__hash__") = py::none();  // == is leafwise: a TensorDict is not a dict key
}

}  // namespace tdstore::python
