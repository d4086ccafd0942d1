"""What Python users expect of a storage package: close() and `with` on every handle, a clear
error after close, __version__, tdstore.data importable, __repr__, DataLoader's default
collation with workers started by fork and by spawn."""
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.utils.data

import tdstore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_store(path, n=100):
    with tdstore.TensorDict.create(path, batch_size=[n]) as td:
        td["image"] = torch.arange(n * 6, dtype=torch.float32).reshape(n, 2, 3)
        td["label"] = torch.arange(n) % 10
        td["meta/id"] = torch.arange(n) * 7
    return str(path)


def test_with_commits_closes_and_releases_the_writer_lock(tmp_path):
    p = str(tmp_path / "s")
    with tdstore.TensorDict.create(p, batch_size=[4]) as td:
        td["x"] = torch.arange(4)
        td["n/y"] = torch.ones(4, 2)
        sub = td["n"]
        view = td["x"]
    assert td.closed and sub.closed
    assert torch.equal(view, torch.arange(4))  # views handed out stay valid
    # The writer lock is free now, though `td`, `sub` and `view` are alive: no del, no gc.
    w = tdstore.open(p, "r+")
    assert w.keys() == ["n/y", "x"]  # committed on leaving the block
    try:
        with w:
            w["z"] = torch.zeros(4)
            raise RuntimeError("the block fails")
    except RuntimeError:
        pass
    assert w.closed and tdstore.open(p).keys() == ["n/y", "x"]  # nothing staged was committed


def test_a_closed_handle_raises_closed_error_naming_the_store(tmp_path):
    p = make_store(tmp_path / "s")
    td = tdstore.open(p)
    sub, attrs = td["meta"], td.attrs
    td.close()
    td.close()  # idempotent
    for call in (lambda: td["image"], lambda: td.keys(), lambda: sub["id"], lambda: len(td),
                 lambda: attrs.keys(), lambda: td.refresh(), lambda: td.batch_size):
        with pytest.raises(tdstore.ClosedError, match=re.escape(p)) as e:
            call()
        assert isinstance(e.value, ValueError) and isinstance(e.value, tdstore.Error)
    assert "closed" in repr(td) and p in repr(td)


def test_close_releases_the_lock_for_another_process(tmp_path):
    p = make_store(tmp_path / "s")
    w = tdstore.open(p, "r+")
    script = f"import tdstore; tdstore.open({p!r}, 'r+'); print('ok')"
    busy = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ)
    assert busy.returncode != 0 and "LockError" in busy.stderr
    w.close()
    free = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ)
    assert free.returncode == 0 and free.stdout.strip() == "ok", free.stderr


def test_loader_and_dataset_close(tmp_path):
    ds = tdstore.Dataset.create(str(tmp_path / "d"))
    shard = ds.shard(0)
    shard.append(tdstore.TensorDict({"x": torch.arange(10)}, batch_size=[10]))
    shard.commit()
    shard.close()
    ds.publish()
    with tdstore.Dataset.open(str(tmp_path / "d")) as d:
        assert len(d) == 10 and "rows=10" in repr(d)
        with tdstore.Loader(d, batch_size=4, shuffle=False) as loader:
            assert "batches=3" in repr(loader)
            assert torch.equal(torch.cat([b["x"] for b in loader]), torch.arange(10))
        assert loader.closed and repr(loader) == "tdstore.Loader(closed)"
        with pytest.raises(tdstore.ClosedError):
            len(loader)
    assert d.closed and repr(d) == "tdstore.Dataset(closed)"
    with pytest.raises(tdstore.ClosedError, match="d"):
        d.keys()
    # A loader reading a dict that is closed under it says so at its next epoch.
    td = tdstore.open(make_store(tmp_path / "s"))
    loader = tdstore.Loader(td, batch_size=4)
    td.close()
    with pytest.raises(tdstore.ClosedError, match="s"):
        loader.set_epoch(1)


def test_version_and_data_module_after_import_tdstore():
    version = re.search(r"version\s*:\s*'([^']+)'", open(os.path.join(ROOT, "meson.build")).read()).group(1)
    assert tdstore.__version__ == version
    r = subprocess.run([sys.executable, "-c", "import tdstore; print(tdstore.data.Dataset.__name__, tdstore.__version__)"],
                       capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0 and r.stdout.split() == ["Dataset", version], r.stderr


def test_every_public_object_has_its_own_repr(tmp_path):
    p = make_store(tmp_path / "s")
    td = tdstore.open(p)
    loader = tdstore.Loader(td, batch_size=8)
    step = tdstore.compile(lambda d: d["image"] * 2, name="repr_probe", persist=False)
    step(td[0:8])
    objects = [td, td.attrs, loader, iter(loader), tdstore.data.Dataset(p), step, step.stats(),
               tdstore.TensorDict({"a": torch.ones(2)}, batch_size=[2])]
    for o in objects:
        assert " object at 0x" not in repr(o), repr(o)
    loader.close()


def _expected_batch(p, idx):
    r = tdstore.open(p)
    return {"image": r["image"][idx], "label": r["label"][idx], "meta": {"id": r["meta/id"][idx]}}


def _assert_batches(batches, p, order):
    got = {"image": torch.cat([b["image"] for b in batches]), "label": torch.cat([b["label"] for b in batches]),
           "id": torch.cat([b["meta"]["id"] for b in batches])}
    want = _expected_batch(p, order)
    assert torch.equal(got["image"], want["image"]) and torch.equal(got["label"], want["label"])
    assert torch.equal(got["id"], want["meta"]["id"])


@pytest.mark.parametrize("context", [None, "fork", "spawn"])
def test_dataloader_default_collation(tmp_path, context):
    p = make_store(tmp_path / "s")
    ds = tdstore.data.Dataset(p)
    workers = 0 if context is None else 2
    g = torch.Generator().manual_seed(3)
    dl = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True, generator=g, num_workers=workers,
                                     multiprocessing_context=context)
    batches = list(dl)
    assert all(isinstance(b, dict) and b["image"].shape[1:] == (2, 3) for b in batches)
    labels = torch.cat([b["label"] for b in batches])
    ids = torch.cat([b["meta"]["id"] for b in batches])
    # Every row once, each item's keys from the same row.
    assert torch.equal(labels, ids // 7 % 10) and sorted(ids.tolist()) == [7 * i for i in range(100)]
    # tdstore.data.loader: the gathered batch is handed out as is, equal to default collation.
    fast = list(tdstore.data.loader(p, batch_size=16, shuffle=False, num_workers=workers,
                                    multiprocessing_context=context))
    _assert_batches(fast, p, torch.arange(100))
    plain = list(torch.utils.data.DataLoader(ds, batch_size=16, num_workers=workers,
                                             multiprocessing_context=context))
    _assert_batches(plain, p, torch.arange(100))


def test_collate_falls_back_when_items_come_from_getitem(tmp_path):
    p = make_store(tmp_path / "s", n=20)
    ds = tdstore.data.Dataset(p, keys=["label"])
    rows = [ds[i] for i in (5, 2, 9)]
    assert torch.equal(tdstore.data.collate(rows)["label"], torch.tensor([5, 2, 9]))
    part = ds.__getitems__([4, 6, 8])[1:]  # a slice of a gathered batch is not the batch
    assert torch.equal(tdstore.data.collate(part)["label"], torch.tensor([6, 8]))
    with pytest.raises(tdstore.DTypeError, match="got int"):
        tdstore.data.Dataset(3)
