"""Compressed keys from Python (docs/FORMAT.md, "Compressed keys"): td.set(..., compression=),
TensorDict.create(..., compression=) recorded in the store, the CLI's import/compact
--compress and its stored/raw listing, and a differential test: random tensors, appends and
reopenings, a compressed store against a raw one and the values themselves."""
import json
import os
import random
import subprocess

import numpy as np
import pytest
import torch

import tdstore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("TDSTORE_CLI", os.path.join(ROOT, "build", "tools", "tdstore"))

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
          torch.complex128]


def cli(*args):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_set_with_compression_round_trips_every_dtype(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[300])
    values = {str(d).split(".")[1]: (torch.arange(300 * 5).reshape(300, 5) % 7).to(d)
              for d in DTYPES}
    for k, v in values.items():
        td.set(k, v, compression="zstd", level=4)
    td.commit()
    r = tdstore.open(tmp_path / "s")
    for k, v in values.items():
        assert same(r[k], v), k
    listing = json.loads(cli("ls", tmp_path / "s", "--json").stdout)
    assert {row["key"]: row["compression"] for row in listing} == {k: "zstd" for k in values}
    assert all(row["raw_bytes"] > 0 for row in listing)


def test_the_store_default_is_recorded_and_td_compression_says_it(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[100], compression="zstd:7")
    assert td.compression == "zstd:7:1048576"
    td["x"] = torch.zeros(100, 1000)
    td["y"] = torch.ones(100)
    td.set("raw", torch.arange(100), compression="none")
    td.commit()
    td.close()
    again = tdstore.open(tmp_path / "s", "r+")
    assert again.compression == "zstd:7:1048576"
    rows = {row["key"]: row for row in json.loads(cli("ls", tmp_path / "s", "--json").stdout)}
    assert rows["x"]["compression"] == "zstd" and rows["raw"]["compression"] is None
    assert rows["x"]["bytes"] * 50 < rows["x"]["raw_bytes"]  # zeros compress


@pytest.mark.parametrize("bad, message", [
    (dict(compression="gzip"), "is not none, zstd"),
    (dict(compression="zstd", level=0), "zstd level 0 is not in [1, 19]"),
    (dict(compression="zstd:3:12"), "block_bytes 12 is not in [4 KiB, 1 GiB]"),
    (dict(compression="none", level=3), "level=3 given with compression \"none\""),
])
def test_bad_compression_arguments_are_value_errors(tmp_path, bad, message):
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[4])
    with pytest.raises(tdstore.ArgumentError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
        td.set("x", torch.zeros(4), **bad)
    assert isinstance(e.value, ValueError)
    assert "x" not in td


def test_compression_is_for_a_tensor_value(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[4])
    with pytest.raises(tdstore.ArgumentError, match="compression= is for a tensor value"):
        td.set("sub", {"a": torch.zeros(4)}, compression="zstd")
    td.set("sub", {"a": torch.zeros(4)})  # without it, a sub-dict as ever
    assert td["sub", "a"].shape == (4,)


def test_cli_import_and_compact_compress_and_report_the_ratio(tmp_path):
    data = (np.arange(20000 * 16) % 11).astype(np.float32).reshape(20000, 16)
    np.save(tmp_path / "x.npy", data)
    r = cli("import", tmp_path / "z", f"x={tmp_path / 'x.npy'}", "--compress", "zstd:3")
    assert r.returncode == 0, r.stderr
    r = cli("import", tmp_path / "raw", f"x={tmp_path / 'x.npy'}")
    assert r.returncode == 0, r.stderr
    z, raw = (json.loads(cli("info", tmp_path / p, "--json").stdout) for p in ("z", "raw"))
    assert z["tensor_raw_bytes"] == raw["tensor_bytes"] == data.nbytes
    assert z["tensor_bytes"] * 4 < raw["tensor_bytes"] and z["compressed_keys"] == 1
    assert "zstd" in cli("ls", tmp_path / "z").stdout and "raw" in cli("du", tmp_path / "z").stdout
    assert np.array_equal(tdstore.open(tmp_path / "z")["x"].numpy(), data)
    # The store's default now: appended rows stay compressed, new keys are compressed.
    assert tdstore.open(tmp_path / "z").compression == "zstd:3:1048576"
    r = cli("compact", tmp_path / "z", "--compress", "none")
    assert r.returncode == 0, r.stderr
    info = json.loads(cli("info", tmp_path / "z", "--json").stdout)
    assert info["compressed_keys"] == 0 and info["tensor_bytes"] == data.nbytes
    assert np.array_equal(tdstore.open(tmp_path / "z")["x"].numpy(), data)
    r = cli("compact", tmp_path / "z", "--compress", "zstd:99")
    assert r.returncode != 0 and "zstd level 99" in r.stderr


def test_bare_zstd_is_level_1_and_a_key_keeps_its_own_level(tmp_path):
    # "zstd" alone is level 1 and 1 MiB blocks (README, docs/CLI.md, TensorDict.create's
    # docstring); a key written at level 3 keeps it through appends and a reopen, and
    # `compact --compress zstd` rewrites it at level 1.
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[100], compression="zstd")
    assert td.compression == "zstd:1:1048576"
    td["a"] = torch.arange(100 * 8, dtype=torch.float32).reshape(100, 8)
    td.set("b", torch.arange(100 * 8, dtype=torch.float32).reshape(100, 8), compression="zstd:3")
    td.commit()
    td.append(tdstore.TensorDict({"a": torch.ones(5, 8), "b": torch.ones(5, 8)}, batch_size=[5]))
    td.commit()
    td.close()
    td = tdstore.open(tmp_path / "s", "r+")
    assert td.compression_of("a") == "zstd:1:1048576"
    assert td.compression_of("b") == "zstd:3:1048576"
    td.close()
    r = cli("compact", tmp_path / "s", "--compress", "zstd")
    assert r.returncode == 0, r.stderr
    td = tdstore.open(tmp_path / "s")
    assert td.compression == td.compression_of("b") == "zstd:1:1048576"
    assert torch.equal(td["b"][100:], torch.ones(5, 8))
    td.close()


def random_tensor(rng, rows):
    dtype = rng.choice(DTYPES)
    trailing = [rng.randrange(0, 5) for _ in range(rng.randrange(0, 3))]
    if dtype == torch.bool:
        return torch.randint(0, 2, [rows, *trailing], generator=torch.Generator().manual_seed(
            rng.randrange(1 << 30))).bool()
    base = torch.randint(-3, 4, [rows, *trailing],
                         generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    return base.to(dtype)


def differential(seed, steps, tmp_path):
    """A compressed store and the values set into it, after random sets, appends, commits and
    reopenings: every read must equal the values. Returns the steps run, for a reproducer."""
    rng = random.Random(seed)
    log = []
    path = tmp_path / f"d{seed}"
    level = rng.randrange(1, 6)
    block = rng.choice([4096, 8192, 1 << 20])
    td = tdstore.TensorDict.create(path, batch_size=[0], compression=f"zstd:{level}:{block}")
    truth = {}
    rows = 0
    for _ in range(steps):
        op = rng.choice(["append", "append", "set", "reopen", "read"])
        if op == "append" or not truth:
            n = rng.randrange(0, 300)
            if not truth:
                batch = {f"k{i}": random_tensor(rng, n) for i in range(rng.randrange(1, 4))}
            else:
                batch = {}
                for k, v in truth.items():
                    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
                    batch[k] = torch.randint(-3, 4, [n, *v.shape[1:]], generator=g).to(v.dtype)
            log.append(("append", n, {k: (str(v.dtype), tuple(v.shape)) for k, v in batch.items()}))
            td.append(tdstore.TensorDict(batch, batch_size=[n]))
            truth = {k: torch.cat([truth[k], batch[k]]) if k in truth else batch[k]
                     for k in batch}
            rows += n
        elif op == "set":
            k = rng.choice(sorted(truth))
            v = random_tensor(rng, rows)
            own = rng.choice([None, "none", "zstd:1:4096"])
            log.append(("set", k, str(v.dtype), tuple(v.shape), own))
            td.set(k, v, compression=own) if own else td.__setitem__(k, v)
            truth[k] = v
        elif op == "reopen":
            log.append(("reopen",))
            td.commit()
            td.close()
            td = tdstore.open(path, "r+")
        if truth and rows:
            k = rng.choice(sorted(truth))
            i = rng.randrange(rows)
            j = rng.randrange(i, rows + 1)
            log.append(("read", k, i, j))
            assert same(td[k], truth[k]), log
            assert same(td[i:j][k], truth[k][i:j]), log
    td.commit()
    assert tdstore.open(path).verify() == [], log
    return log


def test_a_compressed_store_reads_what_was_written_under_random_appends_and_sets(tmp_path):
    # TDSTORE_FUZZ_SECONDS longer on demand; seeds print with the failing step log.
    import time
    budget = float(os.environ.get("TDSTORE_FUZZ_SECONDS", "8"))
    start, seed = time.monotonic(), 0
    while time.monotonic() - start < budget or seed < 5:
        try:
            differential(seed, 12, tmp_path)
        except AssertionError as e:
            # The shortest prefix of steps that still fails is the reproducer.
            for steps in range(1, 13):
                (tmp_path / f"min{steps}").mkdir()
                try:
                    differential(seed, steps, tmp_path / f"min{steps}")
                except AssertionError as small:
                    pytest.fail(f"seed {seed}, {steps} steps: {small}")
            raise e
        seed += 1


def _pair(tmp_path, rows=700):
    """The same rows in a raw store and a store whose default is zstd (small blocks)."""
    x = torch.randn(rows, 6)
    label = torch.arange(rows) % 10
    out = []
    for name, kw in (("raw", {}), ("zstd", {"compression": "zstd", "level": 1})):
        td = tdstore.TensorDict.create(str(tmp_path / name), batch_size=[rows], **kw)
        td.set("x", x, **({"compression": "zstd:1:4096"} if kw else {}))
        td["label"] = label
        td.commit()
        out.append(td)
    return out


@pytest.mark.parametrize("order", ["random", "sequential", "quasi_random"])
def test_loader_row_features_over_compressed_keys_match_raw(tmp_path, order):
    raw, z = _pair(tmp_path)

    def epoch(td):
        loader = tdstore.Loader(td, batch_size=64, seed=5, order=order, memory_budget=1 << 16)
        loader.add_feature("feat/norm", ["x"], lambda d: d["x"].norm(dim=1), version="v1")
        got = [(b["x"], b["label"], b["feat/norm"]) for b in loader]
        del loader  # stores the feature (compressed in the zstd store: its default)
        return got

    for _ in range(2):  # the second epoch reads the stored feature as a key
        a, b = epoch(raw), epoch(z)
        assert len(a) == len(b) == 11
        for u, v in zip(a, b):
            assert all(same(p, q) for p, q in zip(u, v))
        raw.refresh()
        z.refresh()


def test_torch_dataloader_over_a_compressed_store_matches_raw(tmp_path):
    import tdstore.data
    raw, z = _pair(tmp_path)
    batches = []
    for td in (raw, z):
        ds = tdstore.data.Dataset(td)
        g = torch.Generator().manual_seed(3)
        batches.append(list(torch.utils.data.DataLoader(ds, batch_size=50, shuffle=True, generator=g,
                                                        collate_fn=tdstore.data.collate)))
    assert len(batches[0]) == 14
    for a, b in zip(*batches):
        assert same(a["x"], b["x"]) and same(a["label"], b["label"])
    assert same(z[5]["x"], raw[5]["x"]) and same(z[100:300:7]["x"], raw[100:300:7]["x"])


def test_a_dataset_of_compressed_shards_reads_as_a_raw_one(tmp_path):
    sets = []
    for name, kw in (("raw", {}), ("zstd", {"compression": "zstd"})):
        ds = tdstore.Dataset.create(str(tmp_path / name))
        for s, n in enumerate((300, 0, 450)):
            shard = ds.shard(s, **kw)
            if n:
                rows = tdstore.TensorDict({"x": torch.arange(n * 4.0).reshape(n, 4) + s,
                                           "id": torch.arange(n) + 1000 * s}, batch_size=[n])
                shard.append(rows)
                shard.commit()
        ds.publish()
        sets.append(tdstore.Dataset.open(str(tmp_path / name)))
    raw, z = sets
    idx = torch.tensor([0, 749, 300, 5, 299])
    assert same(z.index(idx)["x"], raw.index(idx)["x"])
    for order in ("random", "quasi_random"):
        a = [b["x"] for b in tdstore.Loader(raw, batch_size=100, order=order, seed=1)]
        b = [b["x"] for b in tdstore.Loader(z, batch_size=100, order=order, seed=1)]
        assert len(a) == len(b) == 8 and all(same(p, q) for p, q in zip(a, b))


def test_a_lazy_property_over_a_compressed_key_is_reused_and_recomputed_when_it_changes(tmp_path):
    _, z = _pair(tmp_path)
    calls = []

    def half(d):
        calls.append(1)
        return d["x"] / 2

    v = z.get_or_compute("features/half", ["x"], half, version="v1")
    assert same(v, z["x"] / 2) and len(calls) == 1
    z.commit()
    again = tdstore.open(str(tmp_path / "zstd"))
    assert same(again.get_or_compute("features/half", ["x"], half, version="v1"), z["x"] / 2)
    assert len(calls) == 1  # stored with its provenance, reused by the next handle
    again.close()
    z.set("x", torch.ones(700, 6), compression="zstd")  # the compressed input changes
    z.commit()
    assert same(z.get_or_compute("features/half", ["x"], half, version="v1"), torch.full((700, 6), 0.5))
    assert len(calls) == 2


def test_row_reads_of_a_property_recomputed_in_memory_see_it_not_the_stale_stored_one(tmp_path):
    # Found by review: row reads of a compressed key bypassed get(), which gives a read-only
    # handle's recomputed property.
    td = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[50], compression="zstd:1:4096")
    td["x"] = torch.arange(50.).reshape(50, 1).repeat(1, 4)
    td.get_or_compute("f", ["x"], lambda d: d["x"] * 2, version="v1")
    td.commit()
    td["x"] = -torch.ones(50, 4)  # f is stale now
    td.commit()
    td.close()
    r = tdstore.open(str(tmp_path / "s"))  # read-only: f is recomputed in memory
    want = -2 * torch.ones(50, 4)
    assert same(r.get_or_compute("f", ["x"], lambda d: d["x"] * 2, version="v1"), want)
    assert same(r[3]["f"], want[3]) and same(r[0:5]["f"], want[0:5])
    assert same(r[torch.tensor([1, 2])]["f"], want[[1, 2]])
    for order in ("sequential", "quasi_random"):
        batch = next(iter(tdstore.Loader(r, batch_size=50, order=order, shuffle=order != "sequential",
                                         keys=["f"])))
        assert same(batch["f"].sort(0).values, want)


def test_the_loader_never_reuses_rows_decompressed_from_staged_bytes_after_a_rollback(tmp_path):
    # Found by review: an append staged in an extent's spare room, read by one epoch, rolled
    # back and staged again with other rows of the same size, was served from the first epoch.
    td = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[100])
    g = torch.Generator().manual_seed(0)
    rows = lambda n: torch.randint(0, 256, (n, 64), dtype=torch.uint8, generator=g)  # noqa: E731
    x = rows(100)
    td.set("x", x, compression="zstd:1:4096")
    td.commit()
    more = rows(20)
    td.append(tdstore.TensorDict({"x": more}, batch_size=[20]))
    td.commit()
    a, b = rows(10), rows(10)
    td.append(tdstore.TensorDict({"x": a}, batch_size=[10]))
    loader = tdstore.Loader(td, batch_size=1000, shuffle=False)
    assert same(next(iter(loader))["x"], torch.cat([x, more, a]))
    td.rollback()
    td.append(tdstore.TensorDict({"x": b}, batch_size=[10]))
    loader.set_epoch(1)
    assert same(next(iter(loader))["x"], torch.cat([x, more, b]))


def test_many_small_decompressed_reads_do_not_split_the_heap_into_mappings(tmp_path):
    # Found by review: huge-page advice on every decompressed tensor split the malloc heap into
    # a mapping per read, up to vm.max_map_count.
    td = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[256], compression="zstd:1")
    td["x"] = torch.arange(256 * 64, dtype=torch.float32).reshape(256, 64)  # 64 KiB
    td.commit()

    def mappings():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    before = mappings()
    kept = [td["x"] for _ in range(3000)]
    assert mappings() - before < 100
    assert same(kept[-1], td["x"])


def test_compression_of_says_how_each_key_is_stored(tmp_path):
    td = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[10])
    td.set("a", torch.zeros(10, 3), compression="zstd", level=5)
    td.set("b/c", torch.zeros(10), compression="zstd:2:8192")
    td["raw"] = torch.zeros(10)
    td.set_ragged("r", [torch.zeros(i) for i in range(10)])
    assert td.compression_of("a") == "zstd:5:1048576"
    assert td["b"].compression_of("c") == "zstd:2:8192"
    assert td.compression_of("raw") == "none" and td.compression_of("r") == "none"
    with pytest.raises(KeyError, match="'nope' not found"):
        td.compression_of("nope")
    with pytest.raises(KeyError):
        td.compression_of("b")  # a sub-dict, not a key
    assert tdstore.TensorDict({"a": torch.zeros(2)}, batch_size=[2]).compression_of("a") == "none"


def test_the_torch_dataset_decompresses_once_and_its_batches_match_raw(tmp_path):
    import pickle
    import tdstore.data
    raw, z = _pair(tmp_path)
    ds = tdstore.data.Dataset(str(tmp_path / "zstd"))
    assert ds._rows is not None and tdstore.data.Dataset(str(tmp_path / "raw"))._rows is None
    again = pickle.loads(pickle.dumps(ds))  # as a spawned worker gets it: reopened, decompressed
    for d in (ds, again):
        rows = d.__getitems__([5, 0, 699, 5])
        assert same(torch.stack([r["x"] for r in rows]), raw["x"][[5, 0, 699, 5]])
        assert same(d[17]["label"], raw["label"][17])
    ds.close()
    again.close()
    assert ds._rows is None


def test_a_missing_key_error_names_the_close_keys(tmp_path):
    td = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[2])
    td["images"] = torch.zeros(2)
    td["labels"] = torch.zeros(2)
    with pytest.raises(KeyError, match=r"key 'imgs' not found; did you mean 'images'\?"):
        td["imgs"]
    with pytest.raises(tdstore.Error, match=r"\(keys: 'images', 'labels'\)"):
        td["zzzz"]


@pytest.mark.parametrize("change", ["replace", "append", "erase_and_set", "refresh_reader"])
def test_the_loader_decompresses_again_whatever_changes_the_key_between_epochs(tmp_path, change):
    # The Loader keeps a compressed key decompressed for later epochs only while they read the
    # same committed bytes: each way of changing the key between two epochs is seen.
    td = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[300])
    td.set("x", torch.arange(300 * 4.0).reshape(300, 4), compression="zstd:1:4096")
    td.commit()
    source = tdstore.open(str(tmp_path / "s")) if change == "refresh_reader" else td
    loader = tdstore.Loader(source, batch_size=1000, shuffle=False)
    assert same(next(iter(loader))["x"], td["x"])
    if change == "append":
        td.append(tdstore.TensorDict({"x": -torch.ones(20, 4)}, batch_size=[20]))
    elif change == "erase_and_set":
        del td["x"]
        td.set("x", torch.full((300, 4), 7.0), compression="zstd:1:4096")
    else:
        td.set("x", torch.full((300, 4), 5.0), compression="zstd:1:4096")
    td.commit()
    if change == "refresh_reader":
        source.refresh()
    loader.set_epoch(1)
    assert same(next(iter(loader))["x"], td["x"])


def test_the_torch_dataset_sees_a_refreshed_reader_and_a_writers_staged_rows(tmp_path):
    import tdstore.data
    td = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[50], compression="zstd")
    td["x"] = torch.zeros(50, 3)
    td.commit()
    reader = tdstore.data.Dataset(str(tmp_path / "s"))
    writer = tdstore.data.Dataset(td)
    assert same(reader[3]["x"], torch.zeros(3)) and reader._rows is not None and writer._rows is None
    td["x"] = torch.ones(50, 3)  # staged: the writer's dataset reads it, the reader not yet
    assert same(writer[3]["x"], torch.ones(3)) and same(reader[3]["x"], torch.zeros(3))
    td.commit()
    reader.td.refresh()
    assert same(reader.__getitems__([3, 4])[1]["x"], torch.ones(3))  # decompressed again
