"""The Loader from Python: resuming by state_dict, row features computed by Python functions on
the loader's worker threads, and what the features' cache depends on."""
import threading

import pytest
import torch

import tdstore


@pytest.fixture
def rows(tmp_path):
    td = tdstore.TensorDict.create(str(tmp_path / "rows"), batch_size=[500])
    td["x"] = torch.arange(500 * 3, dtype=torch.float32).reshape(500, 3)
    td["id"] = torch.arange(500)
    td.commit()
    return td


def test_state_dict_resumes_exactly(rows):
    full = [b["id"] for b in tdstore.Loader(rows, batch_size=64, seed=7)]
    loader = tdstore.Loader(rows, batch_size=64, seed=7)
    it = iter(loader)
    head = [next(it)["id"] for _ in range(3)]
    state = loader.state_dict()
    assert state["step"] == 3 and state["seed"] == 7 and state["batch_size"] == 64
    again = tdstore.Loader(rows, batch_size=64, seed=7)
    again.load_state_dict(state)
    tail = [b["id"] for b in again]
    assert all(torch.equal(a, b) for a, b in zip(head + tail, full)) and len(head + tail) == len(full)


def test_state_dict_is_refused_by_another_stream(rows):
    loader = tdstore.Loader(rows, batch_size=64, seed=7)
    state = loader.state_dict()
    with pytest.raises(tdstore.Error, match="seed"):
        tdstore.Loader(rows, batch_size=64, seed=8).load_state_dict(state)
    with pytest.raises(tdstore.Error, match="batch_size"):
        tdstore.Loader(rows, batch_size=32, seed=7).load_state_dict(state)
    del state["epoch"]
    with pytest.raises(tdstore.Error, match="'epoch'"):
        tdstore.Loader(rows, batch_size=64, seed=7).load_state_dict(state)


def test_row_feature_from_python_runs_on_workers_and_is_stored(rows):
    calls, threads = [], set()

    def norm(d):
        calls.append(len(d))
        threads.add(threading.get_ident())
        return d["x"].sum(1)

    loader = tdstore.Loader(rows, batch_size=50, num_workers=2)
    assert loader.add_feature("feat/sum", ["x"], norm, version="v1") is False  # not stored yet
    for b in loader:
        assert torch.equal(b["feat/sum"], b["x"].sum(1))
    assert sum(calls) == 500 and loader.feature_rows_done("feat/sum") == 500
    assert threading.get_ident() not in threads  # computed on the loader's worker threads
    for b in loader:  # the second epoch reads what the first computed
        assert torch.equal(b["feat/sum"], b["x"].sum(1))
    assert sum(calls) == 500
    del loader  # stores the feature beside the source (teardown joins workers without the GIL)
    rows.refresh()
    assert torch.equal(rows["feat/sum"], rows["x"].sum(1))
    again = tdstore.Loader(rows, batch_size=50)
    assert again.add_feature("feat/sum", ["x"], norm, version="v1") is True  # found complete
    list(again)
    assert sum(calls) == 500
    # Each thing the feature depends on, changed: its version, then its input.
    bumped = tdstore.Loader(rows, batch_size=50)
    assert bumped.add_feature("feat/sum", ["x"], lambda d: d["x"].sum(1) * 2, version="v2") is False
    assert all(torch.equal(b["feat/sum"], b["x"].sum(1) * 2) for b in bumped)
    del bumped
    rows["x"] = torch.ones(500, 3)
    rows.commit()
    changed = tdstore.Loader(rows, batch_size=50)
    assert changed.add_feature("feat/sum", ["x"], lambda d: d["x"].sum(1) * 2, version="v2") is False
    assert all(torch.equal(b["feat/sum"], torch.full((len(b),), 6.0)) for b in changed)


def test_row_feature_errors_reach_the_iterating_thread(rows):
    def broken(d):
        raise RuntimeError("feature fn failed on purpose")

    loader = tdstore.Loader(rows, batch_size=50, num_workers=2)
    loader.add_feature("feat/bad", ["x"], broken)
    with pytest.raises(RuntimeError, match="on purpose"):
        list(loader)
    wrong = tdstore.Loader(rows, batch_size=50, num_workers=0)
    wrong.add_feature("feat/wrong", ["x"], lambda d: torch.zeros(3))
    with pytest.raises(tdstore.ShapeError, match="feat/wrong"):
        list(wrong)


def test_a_quasi_random_order_mixes_a_class_sorted_store_and_resumes(tmp_path):
    n = 100_000
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[n])
    td["label"] = torch.arange(n) * 20 // n  # 20 classes in runs, as cached class by class
    td["x"] = torch.zeros(n, 14)  # 64 bytes a row with the label
    td.commit()
    # The defaults' proportions (windows of 64 blocks) for 64-byte rows.
    opts = dict(batch_size=256, order="quasi_random", block_bytes=8 << 10, memory_budget=1 << 20,
                seed=3)
    batches = [b["label"] for b in tdstore.Loader(td, **opts)]
    assert torch.equal(torch.cat(batches).sort().values, td["label"].sort().values)
    classes = [len(set(b.tolist())) for b in batches if len(b) == 256]
    assert sum(classes) / len(classes) >= 18, sum(classes) / len(classes)
    loader = tdstore.Loader(td, **opts)
    it = iter(loader)
    for _ in range(10):
        next(it)
    state = loader.state_dict()
    assert state["block_rows"] == 128 and state["window_blocks"] == 64, state  # 128: a power of two
    resumed = tdstore.Loader(td, **opts)
    resumed.load_state_dict(state)
    rest = [b["label"] for b in resumed]
    assert all(torch.equal(a, b) for a, b in zip(rest, batches[10:])) and len(rest) == len(batches) - 10
    # A position saved under quasi-random scheme 2 (blocks of block_bytes / row bytes rows) would
    # replay other rows under scheme 4 (blocks of a power of two): refused, naming both.
    assert state["order"] == 4
    with pytest.raises(ValueError, match="permutation scheme 2.*4"):
        tdstore.Loader(td, **opts).load_state_dict(dict(state, order=2))
    with pytest.raises(tdstore.Error, match="order 'shuffled'"):
        tdstore.Loader(td, order="shuffled")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_over_the_memory_budget_batches_hold_what_the_views_hold(tmp_path, num_workers):
    n = 20_000
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[n])
    td["id"] = torch.arange(n)
    td["x"] = torch.arange(n, dtype=torch.float32).unsqueeze(1).repeat(1, 14)
    td.commit()
    x = td["x"]
    x[[3, 7_000, 19_999]] = -1.0  # in place: this process's copy of the pages, not the file's
    opts = dict(batch_size=100, order="quasi_random", block_bytes=4 << 10, memory_budget=32 << 10,
                num_workers=num_workers)  # 1.4 MB of rows, windows of 4 blocks
    seen = []
    for b in tdstore.Loader(td, **opts):
        assert torch.equal(b["x"], x[b["id"]])
        seen.append(b["id"])
    assert torch.equal(torch.cat(seen).sort().values, torch.arange(n))


def test_state_dict_and_a_saved_position_hold_the_same_fields(rows, tmp_path):
    """One list of position fields (tdstore/loader_position.h) serves both forms: every field
    of the saved record is in state_dict() with the same value, and the rest are None."""
    import json

    loader = tdstore.Loader(rows, batch_size=64, seed=7, order="quasi_random")
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    keep = tdstore.TensorDict.create(str(tmp_path / "keep"), batch_size=[0])
    loader.save(keep, "run")
    keep.commit()
    record = json.loads(keep.attrs["loader/run"])
    assert {"seed", "epoch", "step", "batch_size", "order", "block_rows", "window_blocks"} <= set(record)
    assert set(record) <= set(state)
    assert all(state[k] == v for k, v in record.items())
    assert all(state[k] is None for k in set(state) - set(record))
    again = tdstore.Loader(rows, batch_size=64, seed=7, order="quasi_random")
    again.load_state_dict(json.loads(json.dumps(state)))  # through JSON: lists for tuples
    assert again.state_dict() == state
