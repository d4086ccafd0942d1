"""tdstore.import_from / tdstore.export_to (python/tdstore/importers.py): tensordict memmap
directories, HDF5, zarr and .npy files into a store, bit for bit, resumably; a store out to a
tensordict memmap directory and .npy files."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import tdstore

h5py = pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")

ROWS = 64


def columns(rows=ROWS, seed=0):
    """Nested '/' keys of several dtypes, floats with NaN payloads and -0.0 (bit-exact only)."""
    g = np.random.default_rng(seed)
    f32 = g.standard_normal((rows, 3)).astype(np.float32)
    f32[0, 0], f32[1, 1] = -0.0, np.nan
    f32.view(np.uint32)[2, 2] = 0x7FC00123  # a NaN with a payload
    return {
        "obs": f32,
        "reward": g.standard_normal(rows),  # float64
        "action": g.integers(-2**40, 2**40, (rows,)),  # int64
        "next/pixels": g.integers(0, 256, (rows, 2, 4), dtype=np.uint8),
        "next/done": g.integers(0, 2, rows).astype(bool),
        "next/deep/half": g.standard_normal((rows, 2)).astype(np.float16),
        "next/deep/small": g.integers(-128, 128, (rows,), dtype=np.int8),
    }


def assert_store_equals(path, cols):
    td = tdstore.open(path)
    try:
        assert sorted(td.keys()) == sorted(cols)
        for k, v in cols.items():
            got = td[k].numpy()
            assert got.dtype == v.dtype and got.shape == v.shape, k
            assert got.tobytes() == np.ascontiguousarray(v).tobytes(), f"{k} differs"
    finally:
        td.close()


# --- sources written as their libraries write them -------------------------------------------

def write_tensordict(dir, cols, layout="v0.5", batch=None):
    """A tensordict memmap directory as tensordict's _memmap_ writes it (tensordict/_td.py,
    _td_memmap.py): v0.5 lists sub-dicts as {"type": "TensorDict"}; v0.3 does not (its loader
    scans the subdirectories) and has no is_nested."""
    batch = [ROWS] if batch is None else batch
    levels = {}
    for k, v in cols.items():
        parts = k.split("/")
        levels.setdefault(tuple(parts[:-1]), {})[parts[-1]] = v
        for i in range(len(parts) - 1):
            levels.setdefault(tuple(parts[:i]), {})
    for path, leaves in levels.items():
        d = os.path.join(dir, *path)
        os.makedirs(d, exist_ok=True)
        meta = {}
        for name, v in leaves.items():
            np.ascontiguousarray(v).tofile(os.path.join(d, name.replace(" ", "%20") + ".memmap"))
            meta[name] = {"device": "cpu", "shape": list(v.shape), "dtype": f"torch.{v.dtype}"}
            if layout == "v0.5":
                meta[name]["is_nested"] = False
        if layout == "v0.5":
            for child in {p[len(path)] for p in levels if len(p) > len(path) and p[:len(path)] == path}:
                meta[child] = {"type": "TensorDict"}
        meta.update({"shape": batch, "device": "None" if layout == "v0.5" else "cpu",
                     "_type": "<class 'tensordict._td.TensorDict'>"})
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)


def write_h5(file, cols):
    with h5py.File(file, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v, chunks=True if v.ndim else None)


def write_h5_contiguous(file, cols):
    """Contiguous datasets (h5py's default): the importer copies them from the file itself."""
    with h5py.File(file, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)


def write_zarr(dir, cols):
    g = zarr.open_group(dir, mode="w")
    for k, v in cols.items():
        g.create_dataset(k, data=v, chunks=(16,) + v.shape[1:])


def write_npy_dir(dir, cols):
    for k, v in cols.items():
        f = os.path.join(dir, k + ".npy")
        os.makedirs(os.path.dirname(f), exist_ok=True)
        np.save(f, v)


WRITERS = {"tensordict": write_tensordict, "hdf5": write_h5, "hdf5-contiguous": write_h5_contiguous,
           "zarr": write_zarr, "npy": write_npy_dir}
NAMES = {"tensordict": "td", "hdf5": "data.h5", "hdf5-contiguous": "flat.h5", "zarr": "data.zarr",
         "npy": "npys"}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_round_trip_every_format_bit_exact(tmp_path, fmt):
    cols = columns()
    src = tmp_path / NAMES[fmt]
    WRITERS[fmt](str(src), cols)
    r = tdstore.import_from(src, tmp_path / "s", progress=False, chunk_bytes=1000)
    assert (r.keys, r.rows, r.resumed_from, r.total_rows) == (len(cols), ROWS, 0, ROWS)
    assert r.verified_bytes == sum(v.nbytes for v in cols.values())
    assert r.generation > 2, "copied in several chunks, a commit each"
    assert_store_equals(tmp_path / "s", cols)


def test_tensordict_layouts_bfloat16_complex_and_robust_names(tmp_path):
    cols = {"a b": np.arange(8, dtype=np.complex64).reshape(4, 2), "sub/x": np.arange(4, dtype=np.int16)}
    write_tensordict(str(tmp_path / "v3"), cols, layout="v0.3", batch=[4])
    tdstore.import_from(tmp_path / "v3", tmp_path / "s3", progress=False)
    assert_store_equals(tmp_path / "s3", cols)
    # bfloat16: numpy has none, so the file is written from torch
    bf = torch.randn(4, 3).to(torch.bfloat16)
    os.makedirs(tmp_path / "bf")
    bf.view(torch.int16).numpy().tofile(tmp_path / "bf" / "w.memmap")
    (tmp_path / "bf" / "meta.json").write_text(json.dumps({
        "w": {"device": "cpu", "shape": [4, 3], "dtype": "torch.bfloat16", "is_nested": False},
        "shape": [4], "device": "None", "_type": "<class 'tensordict._td.TensorDict'>"}))
    tdstore.import_from(tmp_path / "bf", tmp_path / "sb", progress=False)
    assert torch.equal(tdstore.open(tmp_path / "sb")["w"].view(torch.int16), bf.view(torch.int16))


def test_export_tensordict_then_import_back_equal(tmp_path):
    cols = columns()
    write_h5(str(tmp_path / "d.h5"), cols)
    tdstore.import_from(tmp_path / "d.h5", tmp_path / "s", progress=False)
    assert sorted(tdstore.export_to(tmp_path / "s", tmp_path / "out")) == sorted(cols)
    # meta.json as tensordict's _load_memmap reads it: "_type", batch "shape", per leaf "dtype"
    # (str(torch.dtype)) and "shape"; sub-dicts listed with "type" and stored in directories.
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["_type"] == "<class 'tensordict._td.TensorDict'>" and meta["shape"] == [ROWS]
    assert meta["device"] == "None" and meta["next"] == {"type": "TensorDict"}
    assert meta["obs"] == {"device": "cpu", "shape": [ROWS, 3], "dtype": "torch.float32", "is_nested": False}
    assert json.loads((tmp_path / "out" / "next" / "deep" / "meta.json").read_text())["half"]["dtype"] == "torch.float16"
    assert os.path.getsize(tmp_path / "out" / "next" / "pixels.memmap") == cols["next/pixels"].nbytes
    tdstore.import_from(tmp_path / "out", tmp_path / "back", progress=False)
    assert_store_equals(tmp_path / "back", cols)
    # .npy too, from an open handle
    with tdstore.open(tmp_path / "s") as td:
        tdstore.export_to(td, tmp_path / "npys", format="npy")
    assert np.load(tmp_path / "npys" / "next" / "deep" / "small.npy").tobytes() == cols["next/deep/small"].tobytes()
    tdstore.import_from(tmp_path / "npys", tmp_path / "back2", progress=False)
    assert_store_equals(tmp_path / "back2", cols)


class Stop(Exception):
    pass


@pytest.mark.parametrize("fmt", ["zarr", "tensordict", "hdf5-contiguous"])  # through memory; from files
def test_interrupted_import_resumes_and_completes(tmp_path, fmt):
    cols = columns()
    WRITERS[fmt](str(tmp_path / "z"), cols)
    row_bytes = sum(v.nbytes // ROWS for v in cols.values())
    seen = []

    def stop_after_two_commits(done, total):
        seen.append(done)
        if len(seen) == 3:  # 0, then two chunks committed
            raise Stop

    with pytest.raises(Stop):
        tdstore.import_from(tmp_path / "z", tmp_path / "s", chunk_bytes=10 * row_bytes,
                            progress=stop_after_two_commits)
    assert len(tdstore.open(tmp_path / "s")) == 20, "the store is at its last commit"
    r = tdstore.import_from(tmp_path / "z", tmp_path / "s", chunk_bytes=10 * row_bytes, progress=False)
    assert (r.resumed_from, r.rows, r.total_rows) == (20, ROWS - 20, ROWS)
    assert_store_equals(tmp_path / "s", cols)
    again = tdstore.import_from(tmp_path / "z", tmp_path / "s", progress=False)
    assert (again.rows, again.resumed_from) == (0, ROWS)


def test_hdf5_datasets_in_the_file_are_copied_from_it_and_others_read_through_h5py(tmp_path):
    """Contiguous datasets of native dtypes are copied from the file by the engine; a file that
    also holds a compressed (chunked) or big-endian dataset is read through h5py. Both exact."""
    from tdstore import importers
    cols = columns()
    write_h5_contiguous(str(tmp_path / "flat.h5"), cols)
    src = importers._hdf5_source(str(tmp_path / "flat.h5"))
    try:
        assert all(c.file == str(tmp_path / "flat.h5") and c.offset > 0 for c in src.columns.values())
    finally:
        src.close()
    mixed = dict(cols, big=np.arange(ROWS, dtype=">f4"), packed=np.arange(ROWS * 3).reshape(ROWS, 3))
    with h5py.File(tmp_path / "mixed.h5", "w") as f:
        for k, v in mixed.items():
            f.create_dataset(k, data=v, compression="gzip" if k == "packed" else None)
    src = importers._hdf5_source(str(tmp_path / "mixed.h5"))
    try:
        assert src.columns["big"].file is None and src.columns["packed"].file is None
    finally:
        src.close()
    seen = []
    r = tdstore.import_from(tmp_path / "flat.h5", tmp_path / "a", progress=lambda d, t: seen.append((d, t)),
                            chunk_bytes=2000)
    step = 2000 // sum(v.nbytes // ROWS for v in cols.values())  # rows per commit
    assert seen == [(0, ROWS), (step, ROWS), (ROWS, ROWS)], "after each commit"
    assert r.verified_bytes == sum(v.nbytes for v in cols.values())
    assert_store_equals(tmp_path / "a", cols)
    tdstore.import_from(tmp_path / "mixed.h5", tmp_path / "b", progress=False, chunk_bytes=2000)
    mixed["big"] = mixed["big"].astype("<f4")  # stored in host order
    assert_store_equals(tmp_path / "b", mixed)


KILLED_CHILD = """
import sys, tdstore
def report(done, total):
    print(done, flush=True)
    if done >= 16:
        sys.stdin.readline()   # acknowledged; wait here to be killed
tdstore.import_from(sys.argv[1], sys.argv[2], chunk_bytes=int(sys.argv[3]), progress=report)
"""


def test_killed_import_resumes(tmp_path):
    cols = columns()
    write_h5(str(tmp_path / "d.h5"), cols)
    row_bytes = sum(v.nbytes // ROWS for v in cols.values())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(tmp_path / "d.h5"), str(tmp_path / "s"),
                              str(8 * row_bytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    try:
        for line in child.stdout:
            if int(line) >= 16:
                break
        child.kill()
    finally:
        child.wait()
    assert len(tdstore.open(tmp_path / "s")) == 16
    r = tdstore.import_from(tmp_path / "d.h5", tmp_path / "s", progress=False)
    assert r.resumed_from == 16 and r.total_rows == ROWS
    assert_store_equals(tmp_path / "s", cols)


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_mismatched_dim0_is_a_shape_error_naming_the_key(tmp_path, fmt):
    cols = {"a": np.zeros((4, 2), np.float32), "g/b": np.zeros(5, np.int64)}
    src = tmp_path / NAMES[fmt]
    if fmt == "tensordict":  # its own meta.json refuses a leaf outside the batch size
        write_tensordict(str(src), cols, batch=[])
    else:
        WRITERS[fmt](str(src), cols)
    with pytest.raises(tdstore.ShapeError, match="'g/b'|'a'") as e:
        tdstore.import_from(src, tmp_path / "s", progress=False)
    assert isinstance(e.value, ValueError)
    assert not os.path.exists(tmp_path / "s")


def meta(**leaves):
    m = {"shape": [4], "device": "None", "_type": "<class 'tensordict._td.TensorDict'>"}
    m.update(leaves)
    return m


LEAF = {"device": "cpu", "shape": [4, 2], "dtype": "torch.float32", "is_nested": False}
CRAFTED = [
    ("wrong size", meta(x=dict(LEAF, shape=[4, 3])), "field 'shape'"),
    ("missing file", meta(y=LEAF), "missing"),
    ("bad dtype", meta(x=dict(LEAF, dtype="torch.uint16")), "field 'dtype'"),
    ("not a dtype", meta(x=dict(LEAF, dtype=7)), "field 'dtype'"),
    ("negative", meta(x=dict(LEAF, shape=[4, -2])), "negative"),
    ("overflow", meta(x=dict(LEAF, shape=[4, 2**62, 2**62])), "field 'shape'"),
    ("escape leaf", meta(**{"../x": LEAF}), "'../x'"),
    ("escape dir", meta(**{"..": {"type": "TensorDict"}}), "'..'"),
    ("nested tensor", meta(x=dict(LEAF, is_nested=True)), "is_nested"),
    ("batch", dict(meta(x=LEAF), shape=[5]), "batch size"),
    ("no type", {"shape": [4], "x": LEAF}, "_type"),
    ("non-tensor", dict(meta(x=LEAF), _type="<class 'tensordict.tensorclass.NonTensorData'>"), "_type"),
    ("sub-dict file", meta(x=LEAF, sub={"type": "TensorDict"}), "not a directory"),
]


@pytest.mark.parametrize("case,m,field", CRAFTED, ids=[c[0] for c in CRAFTED])
def test_crafted_meta_json_is_a_typed_error_naming_file_and_field(tmp_path, case, m, field):
    d = tmp_path / "td"
    d.mkdir()
    np.zeros((4, 2), np.float32).tofile(d / "x.memmap")
    (d / "sub").write_text("not a directory")
    (d / "meta.json").write_text(json.dumps(m))
    with pytest.raises(tdstore.FormatError) as e:
        tdstore.import_from(d, tmp_path / "s", progress=False)
    assert "meta.json" in str(e.value) and field in str(e.value), str(e.value)
    assert not os.path.exists(tmp_path / "s")


def test_bad_sources_are_typed_errors(tmp_path):
    (tmp_path / "td").mkdir()
    (tmp_path / "td" / "meta.json").write_text("{not json")
    with pytest.raises(tdstore.FormatError, match="meta.json.*not JSON"):
        tdstore.import_from(tmp_path / "td", tmp_path / "s", progress=False)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "meta.pt").write_bytes(b"\x80")
    with pytest.raises(tdstore.FormatError, match="meta.pt"):
        tdstore.import_from(tmp_path / "old", tmp_path / "s", format="tensordict", progress=False)
    (tmp_path / "x.h5").write_bytes(b"not hdf5")
    with pytest.raises(tdstore.FormatError, match="x.h5"):
        tdstore.import_from(tmp_path / "x.h5", tmp_path / "s", progress=False)
    with h5py.File(tmp_path / "str.h5", "w") as f:
        f["names"] = np.array([b"a", b"b"])
    with pytest.raises(tdstore.DTypeError, match="names"):
        tdstore.import_from(tmp_path / "str.h5", tmp_path / "s", progress=False)
    with pytest.raises(tdstore.IOError):
        tdstore.import_from(tmp_path / "absent.h5", tmp_path / "s", progress=False)
    write_npy_dir(str(tmp_path / "n"), {"a": np.zeros(3, np.uint64)})
    with pytest.raises(tdstore.DTypeError, match="'a'"):
        tdstore.import_from(tmp_path / "n", tmp_path / "s", progress=False)
    # a store of other data is not overwritten
    write_npy_dir(str(tmp_path / "m"), {"a": np.zeros(3, np.int64)})
    write_npy_dir(str(tmp_path / "m2"), {"a": np.ones(3, np.int64)})
    tdstore.import_from(tmp_path / "m", tmp_path / "s", progress=False)
    with pytest.raises(tdstore.Error, match="holds other data"):
        tdstore.import_from(tmp_path / "m2", tmp_path / "s", progress=False)
    r = tdstore.import_from(tmp_path / "m2", tmp_path / "s", append=True, progress=False)
    assert r.total_rows == 6
    assert not os.path.exists(tmp_path / "s" / "a")


def test_relative_paths_from_a_scratch_cwd_and_compression(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cols = columns(rows=32)
    write_tensordict("td", cols, batch=[32])
    r = tdstore.import_from("td", "s", compression="zstd", level=5, progress=False, chunk_bytes=2000)
    assert r.total_rows == 32
    with tdstore.open("s") as td:
        assert td.compression_of("obs").startswith("zstd:5")
    assert_store_equals("s", cols)
    tdstore.export_to("s", "again")
    tdstore.import_from("again", "s2", progress=False)
    assert_store_equals("s2", cols)


def test_python_cli_imports_hdf5_and_prints_one_line_errors(tmp_path):
    cols = columns(rows=16)
    write_h5(str(tmp_path / "d.h5"), cols)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = [sys.executable, "-m", "tdstore"]
    r = subprocess.run(run + ["import", str(tmp_path / "s"), str(tmp_path / "d.h5"), "--no-progress"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "imported 7 key(s), 16 rows" in r.stdout
    assert_store_equals(tmp_path / "s", cols)
    (tmp_path / "bad.h5").write_bytes(b"\0" * 64)
    r = subprocess.run(run + ["import", str(tmp_path / "s2"), str(tmp_path / "bad.h5")], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("tdstore: ") and "bad.h5" in r.stderr


def test_hdf5_contiguous_datasets_whose_file_type_is_not_the_numpy_one_are_read_through_h5py(tmp_path):
    """h5py converts some contiguous datasets whose bytes in the file are not those of the numpy
    dtype it reports: a complex compound with padding (16 bytes an element, complex64), a signed
    integer of 24 bits' precision in 4 bytes (sign-extended into int32), a 4-byte float of
    another exponent bias (float64). Copied raw from the file they were stored wrong and counted
    as verified; they must be imported as h5py reads them."""
    padded = np.dtype({"names": ["r", "i"], "formats": ["<f4", "<f4"], "offsets": [0, 8], "itemsize": 16})
    with h5py.File(tmp_path / "odd.h5", "w") as f:
        a = np.zeros(4, padded)
        a["r"], a["i"] = [1, 2, 3, 4], [10, 20, 30, 40]
        f.create_dataset("cx", data=a)
        space = h5py.h5s.create_simple((4,))
        i24 = h5py.h5t.STD_I32LE.copy()
        i24.set_precision(24)
        h5py.h5d.create(f.id, b"i24", i24, space).write(h5py.h5s.ALL, h5py.h5s.ALL,
                                                        np.array([-1, 5, -100, 7], np.int32))
        biased = h5py.h5t.IEEE_F32LE.copy()
        biased.set_ebias(100)
        h5py.h5d.create(f.id, b"f", biased, space).write(h5py.h5s.ALL, h5py.h5s.ALL,
                                                         np.array([1, 2, 3, 4], np.float32))
    with h5py.File(tmp_path / "odd.h5") as f:
        want = {k: f[k][:] for k in f}
    assert want["cx"].dtype == np.complex64 and want["i24"][0] == -1, "h5py converts them"
    tdstore.import_from(tmp_path / "odd.h5", tmp_path / "s", progress=False)
    assert_store_equals(tmp_path / "s", want)


@pytest.mark.parametrize("fmt", ["npy", "zarr"])  # copied by the engine; read through Python
def test_an_import_into_a_store_of_other_data_is_an_os_error(tmp_path, fmt):
    """Refused as TensorDict.create over an existing store is (tdstore.IOError, an OSError),
    not with a bare tdstore.Error that no builtin except catches."""
    WRITERS[fmt](str(tmp_path / "a"), {"x": np.zeros(3, np.int64)})
    WRITERS[fmt](str(tmp_path / "b"), {"x": np.ones(3, np.int64)})
    tdstore.import_from(tmp_path / "a", tmp_path / "s", format=fmt, progress=False)
    with pytest.raises(OSError, match="holds other data"):
        tdstore.import_from(tmp_path / "b", tmp_path / "s", format=fmt, progress=False)


CUT_CHILD = """
import os, sys, tdstore
def cut(done, total):  # after the first commit, the source is cut short
    if done:
        os.truncate(sys.argv[3], 4096)
try:
    tdstore.import_from(sys.argv[1], sys.argv[2], compression="zstd", chunk_bytes=1 << 16, progress=cut)
except OSError as e:
    print("OSError", e)
"""


def test_a_source_cut_short_during_a_compressed_import_is_an_os_error_not_a_sigbus(tmp_path):
    """The engine compresses rows of file-backed arrays: read through the source's mapping, a
    source truncated meanwhile killed the process with SIGBUS (the Python path reads with pread
    and raised an error)."""
    write_npy_dir(str(tmp_path / "n"), {"x": np.arange(1 << 18, dtype=np.float32).reshape(-1, 16)})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", CUT_CHILD, str(tmp_path / "n"), str(tmp_path / "s"),
                        str(tmp_path / "n" / "x.npy")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, f"returncode {r.returncode}: {r.stderr[-500:]}"
    assert r.stdout.startswith("OSError") and "x.npy" in r.stdout, r.stdout
