"""Other formats into a store, and a store out to them: tdstore.import_from and tdstore.export_to.

Sources (format=, detected from the path when None):

- "tensordict": a tensordict memmap directory (what tensordict.TensorDict.memmap_(prefix) writes:
  a meta.json per dict, a raw .memmap file per leaf; tensordict 0.3 on). Parsed by the engine
  (storage/tensordict_memmap.h), the same parser as `tdstore import`.
- "hdf5": an HDF5 file (.h5, .hdf5, .hdf), through h5py: every dataset is a key, groups give
  "/" paths.
- "zarr": a zarr group directory (zarr 2), arrays are keys, groups give "/" paths.
- "npy": a directory of .npy files ("a/b.npy" is key "a/b"), or one .npy file (its stem).

Every key must share dim 0, the batch dim (tdstore.ShapeError naming the key otherwise). Rows
are copied in chunks of about chunk_bytes, appended and committed chunk by chunk, so a killed
import leaves the store at its last commit; run again with the same source, it checks that the
store holds the source's first rows (bit for bit) and copies the rest. Every row written is
read back from the store and compared bit for bit with the source (exact: NaNs and -0.0 too).
"""
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch

from tdstore import _tdstore

__all__ = ["import_from", "export_to", "ImportResult"]

# numpy dtypes tdstore stores, by kind and item size (native byte order after conversion)
_NUMPY_DTYPES = {np.dtype(t) for t in (np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
                                       np.float16, np.float32, np.float64, np.complex64,
                                       np.complex128)}


_PIECE_BYTES = 16 << 20  # rows read, appended and compared at a time


@dataclass
class ImportResult:
    """What import_from did: keys and rows it copied (0 when the store already held them all),
    resumed_from (rows an interrupted import had committed), total_rows (the store's dim 0
    afterwards), the store's generation and the bytes compared with the source."""
    keys: int
    rows: int
    resumed_from: int
    total_rows: int
    generation: int
    verified_bytes: int


class _Column:
    """One key of a source: its torch dtype and shape, and read(a, b, out), which fills out (a
    contiguous tensor of rows a..b) with the source's rows."""

    def __init__(self, key, dtype, shape, read, file=None, offset=0):
        self.key, self.dtype, self.shape, self.read = key, dtype, tuple(shape), read
        # where the rows lie raw in a file, when they do ("" for a key without elements): the
        # engine then copies them file to file (tdstore::import_arrays_chunked)
        self.file, self.offset = file, offset

    @property
    def row_bytes(self):
        n = torch.empty((), dtype=self.dtype).element_size()
        for d in self.shape[1:]:
            n *= d
        return n


def _torch_dtype(dt):
    return torch.from_numpy(np.empty(0, dtype=dt)).dtype


def _native(key, where, dtype):
    """The native-order numpy dtype of a source's, or tdstore.DTypeError naming the key."""
    dt = np.dtype(dtype)
    native = dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt
    if native not in _NUMPY_DTYPES:
        raise _tdstore.DTypeError(
            f"{where}: key '{key}': dtype {dt} is not one tdstore stores (bool, uint8, int8-64, "
            "float16-64, complex64/128)")
    return native


def _numpy_column(key, where, array_like, read_into=None):
    """A column over an array-like with numpy's dtype/shape/slicing (h5py, zarr, np.memmap);
    read_into(a, b, out_ndarray) when the library reads into a buffer itself."""
    native = _native(key, where, array_like.dtype)

    def read(a, b, out):
        if read_into is not None:
            read_into(a, b, out.numpy())
        else:
            out.numpy()[...] = array_like[a:b]  # converts the byte order
    return _Column(key, _torch_dtype(native), array_like.shape, read)


def _file_column(key, file, offset, dtype, shape):
    """A column of raw C-order rows in host byte order at offset of file: read with pread into
    the buffer (no mapping, so no page faults on the source)."""
    col = _Column(key, dtype, shape, None, file, offset)
    row = col.row_bytes

    def read(a, b, out):
        view = memoryview(out.reshape(-1).view(torch.uint8).numpy())
        with open(file, "rb", buffering=0) as f:
            done, at = 0, offset + a * row
            while done < len(view):
                n = os.preadv(f.fileno(), [view[done:]], at + done)
                if n <= 0:
                    raise _tdstore.FormatError(f"{file}: key '{key}': truncated while read (changed "
                                               "since its size was checked?)")
                done += n
    col.read = read
    return col


def _detect(source):
    if os.path.isdir(source):
        if os.path.exists(os.path.join(source, "meta.json")):
            return "tensordict"
        if os.path.exists(os.path.join(source, ".zgroup")):
            return "zarr"
        return "npy"
    if os.path.isfile(source):
        lower = source.lower()
        if lower.endswith((".h5", ".hdf5", ".hdf")):
            return "hdf5"
        if lower.endswith(".npy"):
            return "npy"
        with open(source, "rb") as f:
            if f.read(8) == b"\x89HDF\r\n\x1a\n":
                return "hdf5"
        raise _tdstore.FormatError(f"{source}: not a format import_from reads (a tensordict memmap "
                                   "directory, .h5/.hdf5, a zarr group, .npy files or a directory of them)")
    raise _tdstore.IOError(f"{source}: no such file or directory")


class _Source:
    """The columns of one source, and what to close when done."""

    def __init__(self, columns, closer=None):
        self.columns, self._closer = columns, closer

    def close(self):
        if self._closer is not None:
            self._closer()


def _contiguous_offset(ds):
    """The file offset of an HDF5 dataset's raw bytes when they lie there as tdstore stores them:
    contiguous (not chunked, so unfiltered), allocated, in one of tdstore's dtypes in host byte
    order, its type in the file the one h5py makes of that dtype; None otherwise (h5py then
    reads it)."""
    from h5py import h5t
    if ds.chunks is not None or ds.external or ds.size == 0 or ds.dtype not in _NUMPY_DTYPES:
        return None  # (a big-endian dtype is none of _NUMPY_DTYPES, which are native)
    # h5py reports the dtype it converts to: a padded complex compound, an integer of fewer bits
    # than its bytes or a float of another layout differ from it in the file (H5Tequal)
    if ds.id.get_type() != h5t.py_create(ds.dtype, logical=True):
        return None
    return ds.id.get_offset()


def _hdf5_source(path):
    try:
        import h5py
    except ImportError as e:
        raise _tdstore.Error(f"{path}: importing HDF5 needs the h5py package (Debian: python3-h5py)") from e
    try:
        f = h5py.File(path, "r")
    except OSError:
        raise _tdstore.FormatError(f"{path}: not an HDF5 file h5py can open") from None
    datasets = []
    f.visititems(lambda name, obj: datasets.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
    columns = {}
    try:
        for name, ds in datasets:  # checked outside visititems: h5py must not close the file in it
            if ds.dtype.names is not None or ds.dtype.kind in "OSUV":
                raise _tdstore.DTypeError(f"{path}: dataset '/{name}': dtype {ds.dtype} is not a "
                                          "numeric one tdstore stores")
            offset = _contiguous_offset(ds)
            columns[name] = _file_column(name, path, offset, _torch_dtype(ds.dtype), ds.shape) \
                if offset is not None else _numpy_column(
                name, path, ds,
                lambda a, b, out, ds=ds: ds.read_direct(out, np.s_[a:b], np.s_[0:b - a]) if out.size else None)
    except Exception:
        f.close()
        raise
    return _Source(columns, f.close)


def _zarr_source(path):
    try:
        import zarr
    except ImportError as e:
        raise _tdstore.Error(f"{path}: importing zarr needs the zarr package (Debian: python3-zarr)") from e
    try:
        group = zarr.open_group(path, mode="r")
    except Exception:  # zarr's errors for a missing or damaged group are of several types
        raise _tdstore.FormatError(f"{path}: not a zarr group zarr can open (.zgroup)") from None
    columns = {}

    def walk(g, prefix):
        for name, arr in g.arrays():
            columns[prefix + name] = _numpy_column(
                prefix + name, path, arr,
                lambda a, b, out, arr=arr: arr.get_basic_selection(slice(a, b), out=out) if out.size else None)
        for name, sub in g.groups():
            walk(sub, prefix + name + "/")
    walk(group, "")
    return _Source(columns)


def _npy_source(path):
    def load(file, key):
        try:
            m = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as e:
            raise _tdstore.FormatError(f"{file}: not a .npy file numpy reads ({e})") from None
        native = _native(key, file, m.dtype)
        if m.dtype == native and m.flags.c_contiguous and isinstance(m, np.memmap) and m.size:
            return _file_column(key, file, m.offset, _torch_dtype(native), m.shape)
        return _numpy_column(key, file, m)
    if os.path.isfile(path):
        key = os.path.splitext(os.path.basename(path))[0]
        return _Source({key: load(path, key)})
    columns = {}
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".npy"):
                rel = os.path.relpath(os.path.join(root, name), path)[:-4]
                key = rel.replace(os.sep, "/")
                columns[key] = load(os.path.join(root, name), key)
    if not columns:
        raise _tdstore.FormatError(f"{path}: no .npy files under it")
    return _Source(columns)


def _tensordict_source(path):
    _, leaves = _tdstore._tensordict_layout(path)  # meta.json and file sizes checked by the engine
    columns = {}
    for key, file, dtype, shape in leaves:
        columns[key] = (_file_column(key, file, 0, getattr(torch, dtype), shape) if file else
                        _Column(key, getattr(torch, dtype), shape, lambda a, b, out: None, ""))
    return _Source(columns)


_SOURCES = {"tensordict": _tensordict_source, "hdf5": _hdf5_source, "zarr": _zarr_source,
            "npy": _npy_source}


def _same_bits(a, b):
    """Whether two tensors of one dtype and shape hold the same bytes (memcmp)."""
    return a.dtype == b.dtype and a.shape == b.shape and _tdstore._same_bytes(a, b)


def _stored_rows(td, key, a, b):
    """Rows a..b of key as stored: a view of a raw key, the blocks holding them of a compressed one."""
    return td[key][a:b] if td.compression_of(key) == "none" else td[a:b][key]


class _Bar:
    """tqdm over bytes when importable (and progress is True), else a one-line counter on stderr;
    a callable progress(rows_done, rows_total) is called instead after every commit."""

    def __init__(self, progress, total_rows, row_bytes, desc):
        self.callback = progress if callable(progress) else None
        self.row_bytes, self.bar, self.line = row_bytes, None, None
        if progress is True:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total_rows * row_bytes, desc=desc, unit="B", unit_scale=True,
                                leave=False, file=sys.stderr)
            except ImportError:
                self.line = desc
        self.total = total_rows

    def update(self, done, new_rows):
        if self.bar is not None:
            self.bar.update(new_rows * self.row_bytes)
        elif self.line is not None:
            print(f"\r{self.line}: {done}/{self.total} rows", end="", file=sys.stderr, flush=True)
        if self.callback is not None:
            self.callback(done, self.total)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        elif self.line is not None:
            print(file=sys.stderr)


def _check_shapes(columns, where):
    rows = None
    for key, c in sorted(columns.items()):
        if len(c.shape) == 0:
            raise _tdstore.ShapeError(f"{where}: key '{key}' is 0-d; imported arrays share batch dim 0")
        if rows is not None and c.shape[0] != rows[1]:
            raise _tdstore.ShapeError(f"{where}: key '{key}' has {c.shape[0]} rows (dim 0), key "
                                      f"'{rows[0]}' has {rows[1]}; imported arrays share batch dim 0")
        rows = rows or (key, c.shape[0])
    return rows[1]


def _committed_prefix(td, columns, rows, chunk_rows):
    """Rows of the store that an earlier import of these columns committed (compared bit for bit
    with the source's first rows), or None when the store holds anything else."""
    if len(td.batch_size) == 1 and len(td) == 0 and not td.keys():
        return 0  # created, killed before its first rows were committed
    if sorted(td.keys()) != sorted(columns) or len(td.batch_size) != 1 or len(td) > rows:
        return None
    have = len(td)
    for key, c in columns.items():
        stored = td.get(key)
        if not isinstance(stored, torch.Tensor) or stored.dtype != c.dtype or tuple(stored.shape[1:]) != c.shape[1:]:
            return None
    buffers = _buffers(columns, chunk_rows)
    for a in range(0, have, chunk_rows):
        b = min(have, a + chunk_rows)
        for k, c in columns.items():
            out = buffers[k][:b - a]
            c.read(a, b, out)
            if not _same_bits(_stored_rows(td, k, a, b), out):
                return None
    return have


def _buffers(columns, rows):
    """One reusable buffer per key of `rows` rows: the chunks are read into them."""
    return {k: torch.empty((rows,) + c.shape[1:], dtype=c.dtype) for k, c in columns.items()}


def import_from(source, store_path, *, format=None, append=False, compression=None, level=None,
                chunk_bytes=64 << 20, progress=True):
    """Imports a tensordict memmap directory, an HDF5 file, a zarr group, or .npy files (a
    directory of them, or one) into the store at store_path, created when absent. Returns an
    ImportResult.

    format: "tensordict", "hdf5", "zarr" or "npy"; None detects it from the path. Every key
    must share dim 0 (tdstore.ShapeError naming the key). Rows are copied in chunks of about
    chunk_bytes, appended (read back from the store and compared bit for bit with the source
    piece by piece) and committed (tdstore.CorruptionError naming the key if they differ). Resumable: run again after
    an interruption (a kill, an exception), it finds the rows committed so far equal to the
    source's first rows and copies the rest; a store that holds anything else is refused
    (tdstore.Error) unless append=True, which appends the source's rows to the store's keys (the
    same keys, dtypes and trailing dims; no resume). compression/level: of the keys a new store
    creates ("zstd", "zstd:LEVEL", "none"), as TensorDict.create. progress: True draws a bar
    (tqdm when importable), False none, a callable is called as progress(rows_done, rows_total)
    after every commit (raising from it stops the import at that commit).
    """
    source, store_path = os.fspath(source), os.fspath(store_path)
    fmt = format or _detect(source)
    if fmt not in _SOURCES:
        raise _tdstore.ArgumentError(f"import_from: format {fmt!r} is none of {sorted(_SOURCES)}")
    if not os.path.exists(source):
        raise _tdstore.IOError(f"{source}: no such file or directory")
    src = _SOURCES[fmt](source)
    try:
        return _copy(src.columns, source, store_path, append, compression, level, chunk_bytes, progress)
    finally:
        src.close()


def _copy(columns, source, store_path, append, compression, level, chunk_bytes, progress):
    if not columns:
        raise _tdstore.ArgumentError(f"{source}: nothing to import (no arrays)")
    rows = _check_shapes(columns, source)
    row_bytes = sum(c.row_bytes for c in columns.values())
    if all(c.file is not None for c in columns.values()):
        return _copy_files(columns, source, store_path, append, compression, level, chunk_bytes,
                           progress, rows, row_bytes)
    step = max(1, int(chunk_bytes) // max(row_bytes, 1))
    exists = os.path.isdir(store_path) and bool(os.listdir(store_path))
    resumed = 0
    if exists:
        td = _tdstore.TensorDict.open(store_path, "r+")
        if not append:
            prefix = _committed_prefix(td, columns, rows, step)
            if prefix is None:
                td.close()
                raise _tdstore.IOError(
                    f"{store_path}: holds other data than {source} (or another import of it): "
                    "import into a new store, or pass append=True to append the rows")
            resumed = prefix
    else:
        td = _tdstore.TensorDict.create(store_path, batch_size=[0], compression=compression, level=level)
        td.commit()  # records the compression, so that a resumed import keeps it
    base = len(td) - resumed  # rows of the store before this source's
    bar = _Bar(progress, rows, row_bytes, f"import {os.path.basename(source.rstrip('/'))}")
    verified = 0
    try:
        bar.update(resumed, resumed)
        td.reserve(len(td) + rows - resumed)  # keys laid out once: no append moves them
        # Rows go through small reused buffers (fresh memory is what costs most on a VM: its
        # first touch faults page by page), appended piece by piece, each read back from the
        # store and compared with the source; a commit every `step` rows.
        piece = max(1, min(step, _PIECE_BYTES // max(row_bytes, 1)))
        buffers = _buffers(columns, min(piece, rows))
        for a in range(resumed, rows, step):
            b = min(rows, a + step)
            for p in range(a, b, piece):
                q = min(b, p + piece)
                part = {k: buffers[k][:q - p] for k in columns}
                for k, c in columns.items():
                    c.read(p, q, part[k])
                td.append(_tdstore.TensorDict.from_dict(_nest(part), batch_size=[q - p]))
                for k, t in part.items():
                    if not _same_bits(_stored_rows(td, k, base + p, base + q), t):
                        raise _tdstore.CorruptionError(
                            f"{store_path}: key '{k}': rows {p}-{q} read back differ from {source}")
                    verified += t.numel() * t.element_size()
            td.commit()
            bar.update(b, b - a)
        result = ImportResult(keys=len(columns) if rows > resumed else 0, rows=rows - resumed,
                              resumed_from=resumed, total_rows=len(td), generation=td.generation,
                              verified_bytes=verified)
    finally:
        bar.close()
        td.close()
    return result


def _copy_files(columns, source, store_path, append, compression, level, chunk_bytes, progress,
                rows, row_bytes):
    """_copy of columns that all lie raw in files, by the engine: copied file to file in the
    kernel and compared with the files as they land (tdstore::import_arrays_chunked)."""
    bar = _Bar(progress, rows, row_bytes, f"import {os.path.basename(source.rstrip('/'))}")
    last = [None]

    def report(done, total):  # the first call gives the rows an interrupted import committed
        bar.update(done, done - last[0] if last[0] is not None else done)
        last[0] = done
    leaves = [(k, c.file, c.offset, str(c.dtype).replace("torch.", ""), list(c.shape))
              for k, c in sorted(columns.items())]
    try:
        keys, copied, resumed, total, generation, verified = _tdstore._import_files(
            store_path, leaves, append, compression, level, int(chunk_bytes), report)
    finally:
        bar.close()
    return ImportResult(keys=keys, rows=copied, resumed_from=resumed, total_rows=total,
                        generation=generation, verified_bytes=verified)


def _nest(flat):
    out = {}
    for key, t in flat.items():
        d = out
        parts = key.split("/")
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = t
    return out


def export_to(td_or_path, dir, format="tensordict", keys=None):  # noqa: A002
    """Writes a store (a path, opened read-only, or a TensorDict) to dir as a tensordict memmap
    directory (format="tensordict": tensordict.TensorDict.load_memmap(dir) reads it, and
    import_from imports it) or as .npy files (format="npy": key "a/b" as dir/a/b.npy). keys:
    the keys to write (default: all). Returns the keys written."""
    if format not in ("tensordict", "npy"):
        raise _tdstore.ArgumentError(f"export_to: format {format!r} is neither 'tensordict' nor 'npy'")
    own = not isinstance(td_or_path, _tdstore.TensorDict)
    td = _tdstore.TensorDict.open(os.fspath(td_or_path), "r") if own else td_or_path
    try:
        names = list(td.keys()) if keys is None else list(keys)
        tensors = {k: td[k] for k in names}
        dir = os.fspath(dir)  # noqa: A001
        if format == "tensordict":
            _tdstore._write_tensordict_dir(dir, tensors, list(td.batch_size))
        else:
            root = os.path.abspath(dir)
            for k, t in tensors.items():
                file = os.path.normpath(os.path.join(root, k + ".npy"))
                if os.path.commonpath([root, file]) != root:
                    raise _tdstore.Error(f"export_to: key '{k}' would write {file}, outside {root}")
                if t.dtype == torch.bfloat16:
                    raise _tdstore.DTypeError(f"{file}: key '{k}': bfloat16 has no .npy equivalent")
                os.makedirs(os.path.dirname(file), exist_ok=True)
                np.save(file, t.contiguous().numpy(), allow_pickle=False)
        return names
    finally:
        if own:
            td.close()
