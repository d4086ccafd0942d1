// tdstore.TensorDict and its attributes (tdstore.Attrs) (binding.h).
#include <set>

#include "binding.h"

namespace tdstore::python {

namespace {

// The attributes of a dict, as a mapping of str to str.
struct Attrs {
  TensorDict td;
};

}  // namespace

void bind_dict(py::module_& m) {
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
                 int64_t alignment, bool reuse_space, const std::optional<std::string>& compression,
                 std::optional<int> level) {
                tdstore::StoreOptions o;
                o.key_capacity = key_capacity;
                o.alignment = alignment;
                o.reuse_space = reuse_space;
                o.compression = compression_of(compression, level);
                return TensorDict::create(path, sizes_of(batch_size), o);
              },
              py::arg("path"), py::arg("batch_size") = py::list(),
              py::arg("key_capacity") = tdstore::StoreOptions{}.key_capacity,
              py::arg("alignment") = tdstore::StoreOptions{}.alignment,
              py::arg("reuse_space") = tdstore::StoreOptions{}.reuse_space,
              py::arg("compression") = py::none(), py::arg("level") = py::none(),
              R"doc(Creates a store at path (a directory that must not exist or be empty), open for writing.

batch_size: the leading dims every tensor shares. key_capacity: how many keys the fixed-size
key directory holds (CapacityError beyond). alignment: byte alignment of every tensor in the
arena (a power of two). reuse_space: whether space freed by overwritten keys is reused once
no reader can see it. compression: the store's default for keys set without one of their own,
"zstd" (level 1, 1 MiB blocks), "zstd:LEVEL", "zstd:LEVEL:BLOCK_BYTES" or "none" (level: the
zstd level, overriding the text's); recorded in the store with the first commit, so later handles use it too.)doc",
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
              "__repr__", &TensorDict::to_string,
              R"doc(The batch size, the store and generation, then every key with its dtype and shape
(a stored key's from its entry: nothing read), nested by '/' groups.)doc",
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
              [](TensorDict& td, const py::object& k, const py::object& v,
                 const std::optional<std::string>& compression, std::optional<int> level) {
                auto c = compression_of(compression, level);
                if (!c) return assign(td, key_of(k), v);
                if (py::isinstance<py::dict>(v) || py::isinstance<TensorDict>(v))
                  throw tdstore::ArgumentError(
                      where_of(td) + "key '" + key_of(k) +
                      "': compression= is for a tensor value; a sub-dict's leaves take the "
                      "handle's default (TensorDict.create(..., compression=)) or are set one by "
                      "one");
                const std::string key = key_of(k);
                at::Tensor t = tensor_of(v);
                py::gil_scoped_release nogil;
                td.set(key, t, *c);
              },
              py::arg("key"), py::arg("value"), py::arg("compression") = py::none(),
              py::arg("level") = py::none(),
              R"doc(td.set(key, value) is td[key] = value.

compression: this key's, instead of the handle's default (td.compression): "zstd",
"zstd:LEVEL", "zstd:LEVEL:BLOCK_BYTES" or "none"; level overrides the text's zstd level. A
compressed key is stored in independently compressed blocks of whole rows; reading it returns
a new tensor (not a view of the file), decompressed whole.)doc",
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
          .def_property_readonly("path", locked<TensorDict>([](const TensorDict& td) -> py::object {
                                   return td.is_persistent() ? py::cast(td.path().string())
                                                             : py::none();
                                 }),
                                 R"doc(The store directory, or None for an in-memory dict.)doc")
          .def_property_readonly(
              "compression",
              locked<TensorDict>([](const TensorDict& td) { return td.compression().text(); }),
              R"doc(What td[key] = value compresses new keys with: "none" or "zstd:LEVEL:BLOCK_BYTES".)doc")
          .def(
              "compression_of",
              [](const TensorDict& td, const py::object& k) {
                return td.compression_of(key_of(k)).text();
              },
              py::arg("key"),
              R"doc(How key is stored: "none" (raw, or in memory) or "zstd:LEVEL:BLOCK_BYTES".)doc",
              py::call_guard<EngineLock>())
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

  bind_dict_api(td_class);
  install_fast_getitem(td_class);
}

}  // namespace tdstore::python
