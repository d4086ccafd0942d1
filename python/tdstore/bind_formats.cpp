// The file formats the Python importers (python/tdstore/importers.py) read through the engine
// rather than a Python library: tensordict memmap directories (tdstore/io.h), so that the
// torch-free CLI and Python share one parser of meta.json.
#include <cstring>

#include "binding.h"
#include "tdstore/admin.h"
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
      "_import_files",
      [](const std::filesystem::path& store, const py::list& leaves, bool append,
         std::optional<std::string> compression, std::optional<int> level, uint64_t chunk_bytes,
         py::object progress) {
        std::map<std::string, tdstore::Array> arrays;
        for (const auto& item : leaves) {
          const auto [key, file, offset, dtype, shape] =
              item.cast<std::tuple<std::string, std::filesystem::path, uint64_t, std::string,
                                   std::vector<int64_t>>>();
          const auto d = tdstore::dtype_from_name(dtype);
          if (!d) throw tdstore::DTypeError(file.string() + ": key '" + key + "': dtype " + dtype);
          if (file.empty()) {  // a leaf without elements: nothing to map
            tdstore::Array a;
            a.dtype = *d;
            a.shape = shape;
            a.owner = std::make_shared<char>(0);
            a.data = a.owner.get();
            arrays[key] = std::move(a);
          } else {
            arrays[key] = tdstore::map_file_array(file, offset, *d, shape);
          }
        }
        tdstore::ImportOptions options;
        options.append = append;
        options.compression = compression_of(compression, level);
        options.chunk_bytes = chunk_bytes;
        options.refuse_other = true;
        if (!progress.is_none())
          options.progress = [&progress](int64_t done, int64_t total) {
            py::gil_scoped_acquire gil;
            progress(done, total);
          };
        tdstore::ChunkedImportResult r;
        {
          py::gil_scoped_release release;
          r = tdstore::import_arrays_chunked(store, arrays, options);
        }
        return py::make_tuple(r.keys, r.rows, r.resumed_from, r.total_rows, r.generation,
                              r.verified_bytes);
      },
      py::arg("store"), py::arg("leaves"), py::arg("append"), py::arg("compression"),
      py::arg("level"), py::arg("chunk_bytes"), py::arg("progress"),
      "tdstore.import_from of sources whose keys are raw bytes in files: leaves [(key, file, "
      "offset, dtype name, shape)] (file empty for a key without elements) imported by "
      "tdstore::import_arrays_chunked (copied in the kernel, compared as they land, resumable; "
      "another store refused); progress(done, total) after each commit. Returns (keys, rows, "
      "resumed_from, total_rows, generation, verified_bytes)");
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
