// The file formats the Python importers (python/tdstore/importers.py) read through the engine
// rather than a Python library: tensordict memmap directories (tdstore/io.h), so that the
// torch-free CLI and Python share one parser of meta.json.
#include "binding.h"
#include "tdstore/io.h"

namespace tdstore::python {

void bind_formats(py::module_& m) {
  m.def(
      "_read_tensordict_dir",
      [](const std::filesystem::path& dir) {
        std::vector<int64_t> batch;
        std::map<std::string, at::Tensor> tensors;
        {
          py::gil_scoped_release release;
          tensors = tdstore::read_tensordict(dir, &batch);
        }
        return py::make_tuple(batch, tensors);
      },
      py::arg("dir"),
      "(batch_size, {key: tensor}) of a tensordict memmap directory, every meta.json checked "
      "(tdstore.FormatError naming the file and field); the tensors map the files read-only");
  m.def(
      "_write_tensordict_dir",
      [](const std::filesystem::path& dir, const std::map<std::string, at::Tensor>& tensors,
         const std::vector<int64_t>& batch_size) {
        py::gil_scoped_release release;
        tdstore::write_tensordict(dir, tensors, batch_size);
      },
      py::arg("dir"), py::arg("tensors"), py::arg("batch_size"),
      "Writes {key: tensor} as a tensordict memmap directory (meta.json as tensordict writes it)");
}

}  // namespace tdstore::python
