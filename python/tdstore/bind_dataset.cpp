// tdstore.Dataset, a directory of shard stores read as one, and cache_in_parallel
// (binding.h).
#include "binding.h"

namespace tdstore::python {

void bind_dataset(py::module_& m) {
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
              [](tdstore::Dataset& d, int64_t shard, int64_t key_capacity, int64_t lock_timeout_ms,
                 const std::optional<std::string>& compression, std::optional<int> level) {
                tdstore::StoreOptions o;
                o.key_capacity = key_capacity;
                o.lock_timeout_ms = lock_timeout_ms;
                o.compression = compression_of(compression, level);
                py::gil_scoped_release nogil;
                return d.shard(shard, o);
              },
              py::arg("shard"), py::arg("key_capacity") = tdstore::StoreOptions{}.key_capacity,
              py::arg("lock_timeout_ms") = tdstore::StoreOptions{}.lock_timeout_ms,
              py::arg("compression") = py::none(), py::arg("level") = py::none(),
              "The store of shard `shard`, open for writing (created on first use, reopened to "
              "resume). compression, level: as TensorDict.create's (the shard's default for the "
              "keys its appends create; recorded when the shard is created)",
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
}

}  // namespace tdstore::python
