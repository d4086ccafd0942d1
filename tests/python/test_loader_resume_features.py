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
