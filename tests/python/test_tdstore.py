"""The Python contract of tdstore (issue: Python access): stores, zero copy, errors, indexing,
lazy properties, the loader, the compile cache and its persistence across processes."""
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import tdstore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("TDSTORE_CLI", os.path.join(ROOT, "build", "tools", "tdstore"))


def run_python(code):
    """Runs code in a fresh interpreter; returns its stdout (fails the test on error)."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture
def store(tmp_path):
    td = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[1000], key_capacity=256)
    td["obs"] = torch.arange(84000, dtype=torch.float32).reshape(1000, 84)
    td["next", "obs"] = torch.zeros(1000, 84)
    td["label"] = torch.arange(1000) % 10
    td.attrs["source"] = "sim v3"
    td.commit()
    return td


def test_create_open_and_zero_copy(store):
    r = tdstore.open(store.path)
    x = r["obs"]
    assert x.data_ptr() == r["obs"].data_ptr()  # a view of the mapping, the same on every get
    assert torch.equal(x[3], torch.arange(252, 336, dtype=torch.float32))
    assert r.keys() == ["label", "next/obs", "obs"]
    assert "obs" in r and ("next", "obs") in r and "nope" not in r
    assert len(r) == 1000 and r.batch_size == torch.Size([1000])
    assert r.attrs["source"] == "sim v3" and "source" in r.attrs
    assert r.path == store.path and r.is_persistent and not r.is_writable
    assert r.verify() == []
    assert isinstance(r["next"], tdstore.TensorDict) and r["next"].keys() == ["obs"]
    x.add_(1)  # copy-on-write: private to this process, never reaches the store
    assert tdstore.open(store.path)["obs"][0, 0].item() == 0
    assert r.verify() == []


def test_writes_refresh_and_delete(store):
    r = tdstore.open(store.path)
    store["extra"] = np.ones((1000, 2), dtype=np.float64)  # numpy accepted
    del store["label"]
    store.commit()
    assert "extra" not in r and "label" in r
    assert r.refresh()
    assert "label" not in r and r["extra"].dtype == torch.float64
    w = tdstore.open(store.path, mode="r")
    with pytest.raises(tdstore.ReadOnlyError):
        w["x"] = torch.zeros(1000)


def test_errors_map_the_hierarchy(store, tmp_path):
    with pytest.raises(tdstore.KeyError) as e:
        store["nope"]
    assert isinstance(e.value, KeyError) and isinstance(e.value, tdstore.Error)
    assert "nope" in str(e.value) and store.path in str(e.value)
    with pytest.raises(tdstore.ShapeError) as e:
        store["bad"] = torch.zeros(999, 3)
    assert isinstance(e.value, ValueError) and "1000" in str(e.value)
    with pytest.raises(tdstore.LockError):
        tdstore.open(store.path, mode="r+")  # store is the writer
    with pytest.raises(tdstore.FormatError):
        os.makedirs(tmp_path / "plain")
        tdstore.open(str(tmp_path / "plain"))
    with pytest.raises(OSError):
        tdstore.open(str(tmp_path / "missing"))
    with pytest.raises(TypeError):
        store[("a", 3, "b")] = torch.zeros(1000)
    with pytest.raises(ValueError):
        tdstore.open(store.path, mode="x")
    assert store.verify() == []  # nothing committed was lost


def test_indexing_gives_in_memory_dicts(store):
    assert store[0]["obs"].shape == (84,)
    s = store[10:20]
    assert s.batch_size == torch.Size([10]) and not s.is_persistent
    assert torch.equal(s["obs"], store["obs"][10:20])
    g = store[torch.tensor([3, 1])]
    assert torch.equal(g["label"], torch.tensor([3, 1]))
    m = store[store["label"] == 0]
    assert m.batch_size == torch.Size([100])
    mem = tdstore.TensorDict({"a": torch.zeros(8, 4), "b": {"c": torch.ones(8)}}, batch_size=[8])
    assert mem.keys() == ["a", "b/c"]
    d = mem.to_dict()
    assert torch.equal(d["b"]["c"], torch.ones(8))
    back = tdstore.TensorDict.from_dict(d, batch_size=[8])
    assert back.keys() == mem.keys()
    assert torch.equal(tdstore.TensorDict.stack([mem, mem])["a"], torch.zeros(2, 8, 4))


def test_append_and_reserve(tmp_path):
    td = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[0])
    td.reserve(100)
    for i in range(10):
        td.append(tdstore.TensorDict({"x": torch.full((10, 3), float(i))}, batch_size=[10]))
    td.commit()
    r = tdstore.open(td.path)
    assert r.batch_size == torch.Size([100]) and r["x"][95, 0].item() == 9


def test_lazy_property_is_stored_and_reused_by_the_next_process(store):
    calls = []

    def norm(d):
        calls.append(1)
        return d["obs"] / 2

    v = store.get_or_compute("features/half", ["obs"], norm, version="v1")
    assert torch.equal(v, store["obs"] / 2) and len(calls) == 1
    store.get_or_compute("features/half", ["obs"], norm, version="v1")
    assert len(calls) == 1
    out = run_python(f"""
        import tdstore
        td = tdstore.open({store.path!r})
        print(td.lazy_valid("features/half"))
        td.get_or_compute("features/half", ["obs"], lambda d: 1 / 0, version="v1")  # never called
        print("reused")
    """)
    assert out.split() == ["True", "reused"]
    store["obs"] = torch.ones(1000, 84)  # its input changed: recomputed
    store.commit()
    assert not store.lazy_valid("features/half")
    store.get_or_compute("features/half", ["obs"], norm, version="v1")
    assert len(calls) == 2


def test_loader_batches_epochs_and_ranks(store):
    loader = tdstore.Loader(store, batch_size=256, shuffle=True, seed=0, num_workers=2)
    assert len(loader) == 4
    labels = [b["label"] for b in loader]
    assert [len(l) for l in labels] == [256, 256, 256, 232]
    assert sorted(torch.cat(labels).tolist()) == sorted((torch.arange(1000) % 10).tolist())
    again = [b["label"] for b in loader]
    assert all(torch.equal(a, b) for a, b in zip(labels, again))  # same epoch, same order
    loader.set_epoch(1)
    other = [b["label"] for b in loader]
    assert not all(torch.equal(a, b) for a, b in zip(labels, other))
    shards = [tdstore.Loader(store, batch_size=100, rank=r, world_size=2) for r in range(2)]
    rows = torch.cat([b["label"] for s in shards for b in s])
    assert len(rows) == 1000


# The GIL is released while a thread waits for a batch: a row feature's Python fn runs on a
# loader worker and hands over to another Python thread, both while the iterating thread waits
# in next(). A loader holding the GIL there would deadlock, so the check runs in a child
# interpreter whose hang fails the test.
GIL_CHECK = """
import sys, threading, torch, tdstore
td = tdstore.TensorDict.create(sys.argv[1], batch_size=[1000])
td["x"] = torch.randn(1000, 8)
td.commit()
inside, proceed, ran = threading.Event(), threading.Event(), []
def feature(rows):
    inside.set()                      # on a worker thread, while the main thread waits
    assert proceed.wait(300), "the other Python thread never ran"
    return rows["x"].sum(1)
def other():
    assert inside.wait(300), "the feature never ran"
    ran.append(threading.get_ident())
    proceed.set()
t = threading.Thread(target=other)
t.start()
loader = tdstore.Loader(td, batch_size=100, num_workers=1)
loader.add_feature("f", ["x"], feature)
n = sum(len(b) for b in loader)
t.join()
assert n == 1000 and len(ran) == 1
print("gil released")
"""


def test_the_gil_is_released_while_the_loader_waits(tmp_path):
    r = subprocess.run([sys.executable, "-c", GIL_CHECK, str(tmp_path / "big")], capture_output=True,
                       text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0 and "gil released" in r.stdout, r.stderr


def seed_scenario():
    @tdstore.compile(persist=False)
    def fn(td):
        td["new"] = torch.ones(4)
        return td["new"]
    for n in range(10):
        out = fn(tdstore.TensorDict({f"k{i}": torch.randn(4) for i in range(n)}, batch_size=[4]))
        assert torch.equal(out, torch.ones(4))
    return fn


def test_compile_seed_scenario_compiles_once():
    fn = seed_scenario()
    assert fn.stats().compiles == 1  # torch.compile on tensordict: 9, then the recompile limit
    assert fn.stats().hits == 9


def test_compile_guards_what_the_function_reads():
    @tdstore.compile(persist=False)
    def opt(td):
        return td["x"] * 2 + (td["bias"] if "bias" in td else 0)
    a = tdstore.TensorDict({"x": torch.ones(3)}, batch_size=[3])
    b = tdstore.TensorDict({"x": torch.ones(3), "bias": torch.ones(3)}, batch_size=[3])
    assert torch.equal(opt(a), torch.full((3,), 2.0))
    assert torch.equal(opt(b), torch.full((3,), 3.0))
    assert torch.equal(opt(a), torch.full((3,), 2.0))
    assert opt.stats().compiles == 2  # one per answer of `"bias" in td`
    assert "bias" in opt.explain()


SCRIPT = """
import torch, tdstore
td = tdstore.open({path!r})
@tdstore.compile
def step(td):
    return td["obs"][:, :4].sum(1) * {scale}
out = step(td)
s = step.stats()
print(s.compiles, s.loads, out[1].item())
"""


def test_compiled_graphs_persist_and_changed_code_traces_anew(store):
    path = store.path  # read-only handles persist graphs too (cache records need no writer)
    first = run_python(SCRIPT.format(path=path, scale=2)).split()
    second = run_python(SCRIPT.format(path=path, scale=2)).split()
    changed = run_python(SCRIPT.format(path=path, scale=3)).split()
    want = (84 + 85 + 86 + 87)
    assert first == ["1", "0", str(float(want * 2))]
    assert second == ["0", "1", str(float(want * 2))]  # loaded, not traced
    assert changed == ["1", "0", str(float(want * 3))]  # new code: never the old graph


def test_pickle_reopens_by_path(store):
    r = tdstore.open(store.path)
    again = pickle.loads(pickle.dumps(r))
    assert again.path == r.path and torch.equal(again["obs"], r["obs"])
    mem = tdstore.TensorDict({"a": torch.arange(4)}, batch_size=[4])
    assert torch.equal(pickle.loads(pickle.dumps(mem))["a"], torch.arange(4))


def test_dataloader_with_forked_workers(store):
    ds = tdstore.data.Dataset(store.path)
    assert len(ds) == 1000
    rows = ds.__getitems__([3, 1, 999])  # one gather per batch (DataLoader calls it)
    assert [r["label"].item() for r in rows] == [3, 1, 9] and ds[7]["label"].item() == 7
    assert torch.equal(tdstore.data.collate(rows)["label"], torch.tensor([3, 1, 9]))
    dl = torch.utils.data.DataLoader(ds, batch_size=100, num_workers=2, multiprocessing_context="fork")
    labels = torch.cat([b["label"] for b in dl])
    assert torch.equal(labels, torch.arange(1000) % 10)


def test_stores_cross_between_python_and_cpp(store, tmp_path):
    r = subprocess.run([CLI, "ls", "--json", store.path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "next/obs" in r.stdout
    assert subprocess.run([CLI, "verify", store.path], capture_output=True).returncode == 0
    npy = tmp_path / "w.npy"
    np.save(npy, np.arange(12, dtype=np.int32).reshape(4, 3))
    made = str(tmp_path / "from_cli")
    r = subprocess.run([CLI, "import", made, f"w={npy}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    td = tdstore.open(made)  # written by the C++ tool, read here
    assert torch.equal(td["w"], torch.arange(12, dtype=torch.int32).reshape(4, 3))


def test_paths_may_be_pathlib_paths(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "p", batch_size=[2])
    td["x"] = torch.ones(2)
    td.commit()
    assert torch.equal(tdstore.TensorDict.open(tmp_path / "p")["x"], torch.ones(2))
    assert tdstore.open(tmp_path / "p").path == str(tmp_path / "p")
