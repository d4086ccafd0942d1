// Directories of arrays (tdstore/formats.h): tensordict memmap directories (meta.json parsed
// by storage/tensordict_memmap.cpp) and directories of .npy files. Files are mapped, not read:
// an import copies them row chunk by row chunk (import_arrays_chunked) from the page cache.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "storage/formats.h"
#include "storage/messages.h"
#include "storage/tensordict_memmap.h"
#include "tdstore/errors.h"
#include "tdstore/formats.h"
#include "tdstore/keys.h"

namespace tdstore {
using storage::in_quotes;
namespace fs = std::filesystem;
namespace {

constexpr int kMaxDepth = 64;  // nested dicts; deeper (a symlink loop) is refused

std::string read_text(const fs::path& file, uint64_t limit) {
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec) throw IOError(file.string() + ": cannot open: " + ec.message());
  if (size > limit)
    throw FormatError(file.string() + ": " + std::to_string(size) + " bytes, more than the " +
                      std::to_string(limit) + " a meta.json may hold");
  std::ifstream in(file, std::ios::binary);
  if (!in) storage::throw_os_error(file, "cannot open", errno);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The file mapped read-only: `offset` + `nbytes` bytes of it (checked by the caller against
// its size), kept mapped while the returned owner lives.
std::shared_ptr<const void> map_file(const fs::path& file, uint64_t size) {
  if (size == 0) return std::make_shared<char>(0);
  int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) storage::throw_os_error(file, "cannot open", errno);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) storage::throw_os_error(file, "mmap failed", err);
  return std::shared_ptr<const void>(
      p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
}

// The entry's file or directory: the robust name, else the raw key (older tensordict).
fs::path entry_path(const fs::path& dir, const std::string& key, const char* suffix) {
  fs::path robust = dir / (storage::tensordict_file_key(key) + suffix);
  std::error_code ec;
  if (fs::exists(robust, ec)) return robust;
  fs::path legacy = dir / (key + suffix);
  return fs::exists(legacy, ec) ? legacy : robust;
}

void walk_tensordict(const fs::path& dir, const std::string& prefix, int depth,
                     TensorDictLayout& out, const std::vector<int64_t>* parent_batch) {
  const fs::path meta_file = dir / "meta.json";
  std::error_code ec;
  if (!fs::exists(meta_file, ec)) {
    if (fs::exists(dir / "meta.pt", ec))
      throw FormatError(dir.string() +
                        ": a memmap directory of tensordict < 0.3 (meta.pt, a pickle), which "
                        "tdstore does not read: load it and memmap_() it with a newer tensordict");
    throw FormatError(dir.string() + ": not a tensordict memmap directory: no meta.json");
  }
  if (depth > kMaxDepth)
    throw FormatError(dir.string() + ": sub-dicts nested deeper than " + std::to_string(kMaxDepth) +
                      " levels");
  const std::string name = meta_file.string();
  const auto meta = storage::parse_tensordict_meta(read_text(meta_file, 64 << 20), name);
  if (parent_batch) {
    if (meta.batch_size.size() < parent_batch->size() ||
        !std::equal(parent_batch->begin(), parent_batch->end(), meta.batch_size.begin()))
      throw FormatError(name + ": field 'shape' " + storage::shape_text(meta.batch_size) +
                        " does not begin with the parent dict's batch size " +
                        storage::shape_text(*parent_batch));
  } else {
    out.batch_size = meta.batch_size;
  }
  for (const auto& l : meta.leaves) {
    TensorDictLeaf leaf;
    leaf.key = prefix + l.key;
    leaf.file = entry_path(dir, l.key, ".memmap");
    leaf.dtype = l.dtype;
    leaf.shape = l.shape;
    leaf.nbytes = l.nbytes;
    struct stat st {};
    if (::stat(leaf.file.c_str(), &st) != 0) {
      // tensordict writes no file for a tensor without elements
      if (l.nbytes == 0) {
        leaf.file.clear();
        out.leaves.push_back(std::move(leaf));
        continue;
      }
      throw FormatError(name + ": entry " + in_quotes(l.key) + ": its data file " +
                        leaf.file.string() + " is missing");
    }
    if (!S_ISREG(st.st_mode))
      throw FormatError(name + ": entry " + in_quotes(l.key) + ": " + leaf.file.string() +
                        " is not a regular file");
    if (static_cast<uint64_t>(st.st_size) != l.nbytes)
      throw FormatError(name + ": entry " + in_quotes(l.key) + ": field 'shape' " +
                        storage::shape_text(l.shape) + " of " + std::string(dtype_name(l.dtype)) +
                        " needs " + std::to_string(l.nbytes) + " bytes, " + leaf.file.string() +
                        " holds " + std::to_string(st.st_size));
    out.leaves.push_back(std::move(leaf));
  }
  std::vector<std::string> children = meta.children;
  if (children.empty()) {  // tensordict 0.3-0.4: sub-dicts are the subdirectories with a meta.json
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_directory(ec) && fs::exists(e.path() / "meta.json", ec))
        children.push_back(e.path().filename().string());
    std::sort(children.begin(), children.end());
  }
  for (const auto& c : children) {
    const fs::path sub = entry_path(dir, c, "");
    if (!fs::is_directory(sub, ec))
      throw FormatError(name + ": entry " + in_quotes(c) + " is a sub-dict, but " + sub.string() +
                        " is not a directory");
    walk_tensordict(sub, prefix + c + "/", depth + 1, out, &meta.batch_size);
  }
}

Array mapped_array(const fs::path& file, DType dtype, const std::vector<int64_t>& shape,
                   uint64_t offset, uint64_t nbytes, uint64_t file_size) {
  Array a;
  a.dtype = dtype;
  a.shape = shape;
  a.nbytes = nbytes;
  if (nbytes == 0) {
    a.owner = std::make_shared<char>(0);
    a.data = a.owner.get();
    return a;
  }
  auto map = map_file(file, file_size);
  a.data = static_cast<const uint8_t*>(map.get()) + offset;
  a.owner = std::move(map);
  a.file = file;
  a.file_offset = offset;
  return a;
}

}  // namespace

Array map_file_array(const fs::path& file, uint64_t offset, DType dtype,
                     const std::vector<int64_t>& shape) {
  const auto nbytes = shape_bytes(shape.data(), shape.size(), dtype_size(dtype));
  if (!nbytes)
    throw ShapeError(file.string() + ": shape " + storage::shape_text(shape) +
                     " has a negative dimension or a byte count past 64 bits");
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec) throw IOError(file.string() + ": cannot open: " + ec.message());
  if (offset > size || size - offset < *nbytes)
    throw FormatError(file.string() + ": " + std::to_string(size) + " bytes, fewer than the " +
                      std::to_string(offset) + " + " + std::to_string(*nbytes) + " shape " +
                      storage::shape_text(shape) + " needs");
  return mapped_array(file, dtype, shape, offset, *nbytes, size);
}

Array map_npy_array(const fs::path& p) {
  const std::string name = p.string();
  std::error_code ec;
  const uint64_t size = fs::file_size(p, ec);
  if (ec) throw IOError(name + ": cannot open: " + ec.message());
  std::string head(std::min<uint64_t>(size, 12), '\0');
  {
    std::ifstream in(p, std::ios::binary);
    if (!in) storage::throw_os_error(p, "cannot open", errno);
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(std::min<uint64_t>(size, storage::npy_header_size(head, name)));
    in.seekg(0);
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
  }
  const auto l = storage::parse_npy(head, size, name);  // data checked to lie in the file
  const bool swap = l.big_endian && dtype_size(l.dtype) > 1;
  // C order in host (little-endian) order is mapped; others are converted in memory.
  return (l.fortran || swap) ? read_npy_array(p)
                             : mapped_array(p, l.dtype, l.shape, l.offset, l.nbytes, size);
}

TensorDictLayout read_tensordict_layout(const fs::path& dir) {
  TensorDictLayout out;
  walk_tensordict(dir, "", 0, out, nullptr);
  std::sort(out.leaves.begin(), out.leaves.end(),
            [](const auto& a, const auto& b) { return a.key < b.key; });
  return out;
}

std::map<std::string, Array> read_tensordict_arrays(const fs::path& dir,
                                                    std::vector<int64_t>* batch_size) {
  const TensorDictLayout layout = read_tensordict_layout(dir);
  if (batch_size) *batch_size = layout.batch_size;
  std::map<std::string, Array> out;
  for (const auto& l : layout.leaves)
    out[l.key] = mapped_array(l.file, l.dtype, l.shape, 0, l.nbytes, l.nbytes);
  return out;
}

std::map<std::string, Array> read_npy_directory(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw IOError(dir.string() + ": not a directory");
  std::map<std::string, Array> out;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    const fs::path& p = it->path();
    if (!it->is_regular_file(ec) || p.extension() != ".npy") continue;
    fs::path rel = p.lexically_relative(dir);
    rel.replace_extension();
    out[rel.generic_string()] = map_npy_array(p);
  }
  if (ec) throw IOError(dir.string() + ": cannot list: " + ec.message());
  if (out.empty()) throw FormatError(dir.string() + ": no .npy files under it");
  return out;
}

void write_tensordict_arrays(const fs::path& dir, const std::map<std::string, Array>& arrays,
                             const std::vector<int64_t>& batch_size) {
  // One meta.json per dict: its leaves and sub-dicts, every dict of the same batch size.
  struct Level {
    std::vector<storage::TensorDictLeafMeta> leaves;
    std::vector<std::string> children;
  };
  std::map<std::string, Level> levels;  // "" is the root, "a/b" a sub-dict
  levels[""];
  for (const auto& [key, a] : arrays) {
    const size_t slash = key.rfind('/');
    const std::string parent = slash == std::string::npos ? "" : key.substr(0, slash);
    const std::string leaf = slash == std::string::npos ? key : key.substr(slash + 1);
    if (a.shape.size() < batch_size.size() ||
        !std::equal(batch_size.begin(), batch_size.end(), a.shape.begin()))
      throw ShapeError(dir.string() + ": key " + in_quotes(key) + " of shape " +
                       storage::shape_text(a.shape) + " does not begin with the batch size " +
                       storage::shape_text(batch_size));
    levels[parent].leaves.push_back({leaf, a.dtype, a.shape, a.nbytes});
    for (std::string p = parent; !p.empty();) {  // every ancestor lists its child dict
      const size_t s = p.rfind('/');
      const std::string up = s == std::string::npos ? "" : p.substr(0, s);
      auto& kids = levels[up].children;
      const std::string child = s == std::string::npos ? p : p.substr(s + 1);
      if (std::find(kids.begin(), kids.end(), child) != kids.end()) break;
      kids.push_back(child);
      p = up;
    }
  }
  for (const auto& [path, level] : levels) {
    fs::path d = dir;
    if (!path.empty())
      for (const auto& part : split_key(path)) d /= storage::tensordict_file_key(part);
    fs::create_directories(d);
    for (const auto& l : level.leaves) {
      const std::string key = path.empty() ? l.key : path + "/" + l.key;
      const Array& a = arrays.at(key);
      const fs::path file = d / (storage::tensordict_file_key(l.key) + ".memmap");
      std::ofstream f(file, std::ios::binary | std::ios::trunc);
      if (!f) storage::throw_os_error(file, "cannot create", errno);
      f.write(static_cast<const char*>(a.data), static_cast<std::streamsize>(a.nbytes));
      f.flush();
      if (!f) storage::throw_io_error(file, "write");
    }
    std::string text;
    try {
      text = storage::tensordict_meta_json(batch_size, level.leaves, level.children);
    } catch (const FormatError& e) {
      throw FormatError(d.string() + ": " + e.what());
    }
    const fs::path meta = d / "meta.json";
    std::ofstream f(meta, std::ios::binary | std::ios::trunc);
    if (!f) storage::throw_os_error(meta, "cannot create", errno);
    f << text;
    f.flush();
    if (!f) storage::throw_io_error(meta, "write");
  }
}

}  // namespace tdstore
