"""Datasets from Python: shards written by separate writers, published atomically, read as one;
the Loader over a dataset (ragged keys, row features); cache_in_parallel over torch.distributed."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tdstore


def rows(start, n):
    """Rows [start, start + n): every value names its global row."""
    ids = torch.arange(start, start + n)
    td = tdstore.TensorDict({"id": ids, "x": ids.float().unsqueeze(1) * torch.arange(1.0, 4.0)}, batch_size=[n])
    td.set_ragged("tokens", [torch.arange(10 * i, 10 * i + i % 3) for i in ids.tolist()])
    return td


def dataset_of(path, split):
    ds = tdstore.Dataset.create(path)  # a pathlib.Path or a str
    start = 0
    for s, n in enumerate(split):
        shard = ds.shard(s)
        if n:
            shard.append(rows(start, n))
            shard.commit()
        start += n
        del shard
    ds.publish()
    return ds


def test_shards_are_published_together_and_read_as_one(tmp_path):
    ds = dataset_of(tmp_path / "d", [30, 0, 20])
    assert ds.rows == len(ds) == 50 and ds.shard_rows == [30, 0, 20]
    assert ds.keys() == ["id", "tokens", "x"]
    perm = torch.randperm(50)
    got = ds.index(perm)
    assert torch.equal(got["id"], perm) and torch.equal(got["x"], rows(0, 50)["x"][perm])
    assert torch.equal(ds[10:40:3]["id"], torch.arange(10, 40, 3))
    assert torch.equal(ds[40:10:-7]["id"], torch.arange(40, 10, -7)) and len(ds[7:7]["id"]) == 0
    assert ds[31]["id"].item() == 31 and ds[-1]["id"].item() == 49 and ds[31]["x"].shape == (3,)
    assert torch.equal(ds[[3, 45, 0]]["id"], torch.tensor([3, 45, 0]))
    with pytest.raises(tdstore.ShapeError, match="row 50 out of range"):
        ds[50]
    with pytest.raises(tdstore.KeyError, match="indexed by rows"):
        ds["x"]
    shard = ds.shard(0)
    shard.append(rows(1000, 5))
    shard.commit()
    del shard
    assert tdstore.Dataset.open(tmp_path / "d").rows == 50, "committed, not published"
    assert tdstore.Dataset.open(str(tmp_path / "d")).path == str(tmp_path / "d")
    with pytest.raises(tdstore.ShapeError, match="row 50 out of range"):
        ds.index(torch.tensor([49, 50]))
    assert "rows=50" in repr(ds)


def test_a_shard_that_disagrees_is_refused_naming_it(tmp_path):
    ds = dataset_of(tmp_path / "d", [10])
    bad = ds.shard(1)
    wrong = rows(10, 4)
    wrong["x"] = wrong["x"].double()
    bad.append(wrong)
    bad.commit()
    del bad
    with pytest.raises(tdstore.DTypeError, match="shard 1.*key 'x' is float64"):
        ds.publish()
    assert tdstore.Dataset.open(str(tmp_path / "d")).shard_rows == [10], "nothing published is lost"
    with pytest.raises(tdstore.FormatError, match="not a dataset"):
        tdstore.Dataset.open(str(tmp_path / "nothing"))


def test_a_loader_over_a_dataset_matches_one_over_a_single_shard(tmp_path):
    one, three = dataset_of(tmp_path / "one", [60]), dataset_of(tmp_path / "three", [25, 0, 35])
    a = list(tdstore.Loader(one, batch_size=8, seed=5))
    b = list(tdstore.Loader(three, batch_size=8, seed=5))
    assert len(a) == len(b) == 8
    for x, y in zip(a, b):
        for k in ("id", "x", "tokens", "tokens.lengths"):
            assert torch.equal(x[k], y[k]), k
        for i, n in zip(y["id"].tolist(), y["tokens.lengths"].tolist()):
            assert n == i % 3
    assert torch.equal(torch.sort(torch.cat([y["id"] for y in b])).values, torch.arange(60))
    with pytest.raises(tdstore.Error, match="tdstore.TensorDict or a tdstore.Dataset"):
        tdstore.Loader([1, 2, 3])


def test_a_state_dict_resumes_the_same_rows_after_an_earlier_shard_grew(tmp_path):
    ds = dataset_of(tmp_path / "d", [30, 40])
    want = [b["id"] for b in tdstore.Loader(ds, batch_size=8, seed=3)]
    loader = tdstore.Loader(ds, batch_size=8, seed=3)
    it = iter(loader)
    head = [next(it)["id"] for _ in range(2)]
    state = loader.state_dict()
    assert state["shards"] == [(0, 30), (1, 40)]
    shard = ds.shard(0)
    shard.append(rows(500, 6))
    shard.commit()
    del shard
    ds.publish()
    again = tdstore.Loader(ds, batch_size=8, seed=3)
    again.load_state_dict(state)
    tail = [b["id"] for b in again]
    assert len(head + tail) == len(want) and all(torch.equal(a, b) for a, b in zip(head + tail, want))
    with pytest.raises(tdstore.Error, match="'shards' is not a list"):
        tdstore.Loader(ds, batch_size=8, seed=3).load_state_dict(dict(state, shards=[1, 2]))


def test_row_features_over_a_dataset_are_stored_and_recomputed_when_inputs_change(tmp_path):
    dataset_of(tmp_path / "d", [40, 60])
    calls = []

    def total(r):
        calls.append(len(r))
        return r["x"].sum(1)

    def epoch(version="v1"):
        loader = tdstore.Loader(tdstore.Dataset.open(str(tmp_path / "d")), batch_size=16, num_workers=1)
        found = loader.add_feature("x_sum", ["x"], total, version)
        for b in loader:
            assert torch.equal(b["x_sum"], b["x"].sum(1))
        del loader
        return found

    assert not epoch()
    assert sum(calls) == 100
    assert epoch(), "the next run reads it"
    assert sum(calls) == 100
    assert not epoch("v2")
    assert sum(calls) == 200
    ds = tdstore.Dataset.open(str(tmp_path / "d"))
    shard = ds.shard(1)
    shard["x"] = shard["x"] + 1
    shard.commit()
    del shard
    ds.publish()
    assert not epoch("v2"), "a dep changed in one shard"
    assert sum(calls) == 300
    with pytest.raises(tdstore.KeyError, match="dependency 'nope'"):
        tdstore.Loader(ds).add_feature("f", ["nope"], total)


RANK = """
import os, sys, torch, torch.distributed as dist, tdstore
path, rendezvous, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo", init_method="file://" + rendezvous, rank=rank, world_size=2)
ds = tdstore.Dataset.open(path)
def job(shard, rank, world):
    begin = rank * 500
    for at in range(begin + len(shard), begin + 500, 100):  # resumes where the shard ends
        ids = torch.arange(at, at + 100)
        shard.append(tdstore.TensorDict({"id": ids, "x": ids.float() * 2}, batch_size=[100]))
        shard.commit()
tdstore.cache_in_parallel(ds, job)
assert ds.rows == 1000, ds.rows
sys.exit(86)  # ran to the end
"""


def test_cache_in_parallel_over_gloo(tmp_path):
    path = str(tmp_path / "d")
    tdstore.Dataset.create(path)
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK))
    for run in range(2):  # the second run finds every shard complete and repeats nothing
        rendezvous = str(tmp_path / f"rendezvous{run}")
        procs = [subprocess.Popen([sys.executable, str(script), path, rendezvous, str(r)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env=dict(os.environ)) for r in range(2)]
        for p in procs:
            out, _ = p.communicate(timeout=300)
            assert p.returncode == 86, out
        ds = tdstore.Dataset.open(path)
        assert ds.shard_rows == [500, 500]
        got = ds.index(torch.arange(1000))
        assert torch.equal(got["id"], torch.arange(1000)) and torch.equal(got["x"], torch.arange(1000).float() * 2)


def test_the_caching_protocol_is_the_engine_s_one(tmp_path):
    """tdstore.cache_in_parallel runs the C++ protocol (tdstore::cache_in_parallel) with
    torch.distributed's barrier: the job's rows committed, two barriers, rank 0 publishes; a job
    that raises leaves the shard at its last commit, unlocked, and nothing published."""
    ds = tdstore.Dataset.create(tmp_path / "d")
    steps = []

    def job(shard, rank, world):
        steps.append(("job", rank, world, len(shard)))
        shard.append(rows(len(shard), 10))  # committed by the protocol

    tdstore._tdstore._cache_in_parallel(ds, 0, 1, lambda: steps.append("barrier"), job)
    assert steps == [("job", 0, 1, 0), "barrier", "barrier"]
    assert ds.rows == 10, "published by rank 0 and refreshed"

    def failing(shard, rank, world):
        shard.append(rows(10, 5))
        shard.commit()
        shard.append(rows(15, 5))  # staged, never committed
        raise ValueError("the job failed")

    steps.clear()
    with pytest.raises(ValueError, match="the job failed"):
        tdstore._tdstore._cache_in_parallel(ds, 0, 1, lambda: steps.append("barrier"), failing)
    assert steps == [], "no barrier, no publish"
    assert ds.rows == 10
    shard = ds.shard(0, lock_timeout_ms=0)  # the writer lock was released
    assert len(shard) == 15, "the last commit stays; what was staged is gone"
