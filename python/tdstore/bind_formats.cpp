// The file formats the Python importers (python/tdstore/importers.py) read through the engine
// rather than a Python library: tensordict memmap directories (tdstore/io.h), so that the
// torch-free CLI and Python share one parser of meta.json.
#include <cstring>

#include "binding.h"
#include "tdstore/formats.h"
#include "tdstore/io.h"

namespace tdstore::python {

void bind_formats(py::module_& m) {
  m.def(
      "_tensordict_layout",
      [](const std::filesystem::path& dir) {
        tdstore::TensorDictLayout layout;
        {
          py::gil_scoped_release release;
          layout = tdstore::read_tensordict_layout(dir);
        }
        py::list leaves;
        for (const auto& l : layout.leaves)
          leaves.append(
              py::make_tuple(l.key, l.file, std::string(tdstore::dtype_name(l.dtype)), l.shape));
        return py::make_tuple(layout.batch_size, leaves);
      },
      py::arg("dir"),
      "(batch_size, [(key, file, dtype name, shape)]) of a tensordict memmap directory, every "
      "meta.json and file size checked (tdstore.FormatError naming the file and field); file is "
      "empty for a leaf without elements");
  m.def(
      "_same_bytes",
      [](const at::Tensor& a, const at::Tensor& b) {
        const at::Tensor x = a.contiguous(), y = b.contiguous();
        const size_t n = static_cast<size_t>(x.numel()) * x.element_size();
        if (!x.device().is_cpu() || !y.device().is_cpu() ||
            n != static_cast<size_t>(y.numel()) * y.element_size())
          return false;
        py::gil_scoped_release release;
        return n == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), n) == 0;
      },
      py::arg("a"), py::arg("b"),
      "Whether two CPU tensors hold the same bytes (memcmp; the importers' exactness check)");
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
