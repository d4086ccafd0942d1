// tdstore.Loader (shuffled batches of a dict's or a dataset's rows) and its iterator
// (binding.h).
#include <memory>
#include <set>

#include "binding.h"

namespace tdstore::python {

namespace {

// The Loader's defaults are the C++ LoaderOptions' (one owner).
const tdstore::LoaderOptions kLoaderDefaults{};

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

}  // namespace

void bind_loader(py::module_& m) {
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    // Closing one may free Python objects and so destroy other loaders (erased from live()):
    // iterate a copy and close only those still alive.
    const std::set<PyLoader*> loaders = PyLoader::live();
    for (PyLoader* l : loaders)
      if (PyLoader::live().count(l)) l->close();
  }));

  // Registered first: Loader.__iter__'s signature names it.
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
}

}  // namespace tdstore::python
