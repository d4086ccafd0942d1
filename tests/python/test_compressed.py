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
