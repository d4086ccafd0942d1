"""Handles keep what they are: a sub-dict stays a sub-dict through a Loader and pickling, an
in-memory dict keeps its ragged keys and attributes through pickling and deepcopy, iter() of a
Loader starts a pass as DataLoader's does, and Dataset indexing follows TensorDict indexing."""
import copy
import pickle

import pytest
import torch

import tdstore


def test_a_loader_over_a_sub_dict_loads_its_keys(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[10])
    td["next/obs"] = torch.arange(10.0)
    td["obs"] = torch.zeros(10)
    td.commit()
    batches = list(tdstore.Loader(td["next"], batch_size=4, shuffle=False))
    assert [b.keys() for b in batches] == [["obs"]] * 3
    assert torch.equal(torch.cat([b["obs"] for b in batches]), torch.arange(10.0))


def test_a_pickled_sub_dict_comes_back_as_the_sub_dict(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[3])
    td["train/x"] = torch.ones(3)
    td["test/x"] = torch.zeros(3)
    td.commit()
    back = pickle.loads(pickle.dumps(tdstore.open(tmp_path / "s")["train"]))
    assert back.keys() == ["x"] and torch.equal(back["x"], torch.ones(3))


def test_pickle_and_deepcopy_keep_ragged_keys_and_attributes():
    td = tdstore.TensorDict({"x": torch.arange(3.0)}, batch_size=[3])
    td.set_ragged("tok", [torch.ones(1), torch.ones(2), torch.ones(3)])
    td.attrs["note"] = "kept"
    for back in (pickle.loads(pickle.dumps(td)), copy.deepcopy(td)):
        assert back.is_ragged("tok")
        values, offsets = back.get_ragged("tok")
        assert torch.equal(offsets, torch.tensor([0, 1, 3, 6]))
        assert back.attrs["note"] == "kept"
        assert torch.equal(back["x"], torch.arange(3.0))


def test_iter_of_a_loader_starts_a_pass_and_an_iterator_continues():
    td = tdstore.TensorDict({"id": torch.arange(40)}, batch_size=[40])
    loader = tdstore.Loader(td, batch_size=10, shuffle=False)
    it = iter(loader)
    first = next(it)["id"]
    rest = [b["id"] for b in it]  # iterating an iterator continues it
    assert len(rest) == 3 and torch.equal(torch.cat([first] + rest), torch.arange(40))
    a = iter(loader)
    next(a)
    b = iter(loader)  # a new pass; the older iterator is refused, never interleaved
    assert torch.equal(next(b)["id"], torch.arange(10))
    with pytest.raises(tdstore.Error):
        next(a)
    assert len(list(b)) == 3


def test_batch_memory_is_reused_only_once_nothing_reads_it():
    n = 2000
    td = tdstore.TensorDict({"id": torch.arange(n), "x": torch.arange(n * 8.0).reshape(n, 8)}, batch_size=[n])
    loader = tdstore.Loader(td, batch_size=50, seed=5)
    kept_tensors, kept_arrays = [], []
    for epoch in range(3):
        loader.set_epoch(epoch)
        for i, b in enumerate(loader):
            if i % 4 == 0:
                kept_tensors.append((b["id"], b["x"][:, 1:]))  # a view keeps its batch's memory
            elif i % 4 == 1:
                kept_arrays.append((b["id"].numpy(), b["x"].numpy()))  # so does a numpy array
    loader.close()
    del loader
    for ids, x in kept_tensors:
        assert torch.equal(x, td["x"][ids][:, 1:])
    for ids, x in kept_arrays:
        assert (x == td["x"].numpy()[ids]).all()


def test_dataset_indexing_follows_tensordict_indexing(tmp_path):
    ds = tdstore.Dataset.create(tmp_path / "d")
    shard = ds.shard(0)
    shard.append(tdstore.TensorDict({"id": torch.arange(5)}, batch_size=[5]))
    shard.commit()
    ds.publish()
    mask = torch.tensor([True, False, True, False, True])
    assert torch.equal(ds[mask]["id"], torch.tensor([0, 2, 4]))
    assert torch.equal(ds[torch.tensor([-1, 0])]["id"], torch.tensor([4, 0]))
    with pytest.raises((tdstore.Error, TypeError)):
        ds[torch.tensor([0.5, 1.0])]


def test_a_read_only_property_built_on_a_recomputed_dependency_is_recomputed(tmp_path):
    w = tdstore.TensorDict.create(tmp_path / "s", batch_size=[4])
    w["x"] = torch.ones(4)
    w.commit()
    a = w.get_or_compute("a", ["x"], lambda d: d["x"] * 2, version="v1")
    b = w.get_or_compute("b", ["a"], lambda d: d["a"] + 1, version="v1")
    assert torch.equal(b, torch.full((4,), 3.0))
    w["x"] = torch.full((4,), 5.0)  # a and b are stale now, and not recomputed by the writer
    w.commit()
    del w, a, b
    r = tdstore.open(tmp_path / "s")
    assert not r.lazy_valid("a") and not r.lazy_valid("b")
    a = r.get_or_compute("a", ["x"], lambda d: d["x"] * 2, version="v1")  # in memory
    assert torch.equal(a, torch.full((4,), 10.0)) and r.lazy_valid("a")
    assert not r.lazy_valid("b")  # built on the stored a, which is not the current a
    b = r.get_or_compute("b", ["a"], lambda d: d["a"] + 1, version="v1")
    assert torch.equal(b, torch.full((4,), 11.0))
    assert r.lazy_valid("b")
    calls = []
    again = r.get_or_compute("b", ["a"], lambda d: calls.append(1) or d["a"] + 1, version="v1")
    assert torch.equal(again, b) and calls == []  # reused, in memory


def test_a_script_ending_mid_epoch_with_a_python_row_feature_exits_cleanly(tmp_path):
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent(f"""
        import torch, tdstore
        td = tdstore.TensorDict.create({str(tmp_path / 's')!r}, batch_size=[20000])
        td["x"] = torch.randn(20000, 16)
        td.commit()
        loader = tdstore.Loader(td, batch_size=64, num_workers=2)
        loader.add_feature("f", ["x"], lambda rows: rows["x"].sum(1))
        it = iter(loader)
        next(it), next(it)
        print("mid-epoch", flush=True)
    """)
    for round_ in range(8):  # the abort depended on where the workers were: several rounds
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0 and "mid-epoch" in r.stdout, (round_, r.returncode, r.stderr)
        assert tdstore.open(tmp_path / "s").verify() == []
        import shutil
        shutil.rmtree(tmp_path / "s")


def test_a_closed_loader_says_so(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[100])
    td["x"] = torch.arange(100.0)
    td.commit()
    with tdstore.Loader(td, batch_size=10, num_workers=2) as loader:
        it = iter(loader)
        next(it)
    with pytest.raises(tdstore.Error, match="closed"):
        next(it)
    with pytest.raises(tdstore.Error, match="closed"):
        len(loader)
    loader.close()  # idempotent
