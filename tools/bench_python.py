"""tdstore's Python benchmark: one line per case, each beside a peer measured in the same run,
with the ratio and its target. Machines are shared and noisy: read the ratios.

    PYTHONPATH=build/python /usr/bin/python3 tools/bench_python.py [--dir=PATH] [--cases=get,loader,compile]
"""
import argparse
import gzip
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.utils.data

import tdstore

FMNIST = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"


def line(case, ours, peer, ratio, target):
    print(f"{case:<34} : {ours:>16} | {peer:<44} | ratio {ratio:7.2f} | target {target}", flush=True)


def per_call(fn, n, reps=7):
    """Median over reps of the time per call of fn over n calls, in seconds."""
    times = []
    for _ in range(reps):
        a = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - a) / n)
    return statistics.median(times)


def bench_get(root):
    td = tdstore.TensorDict.create(os.path.join(root, "get"), batch_size=[64])
    for i in range(16):
        td[f"k{i}"] = torch.randn(64, 8)
    td["obs"] = torch.randn(64, 84)
    td.commit()
    r = tdstore.open(td.path)
    d = {k: r[k] for k in r.keys()}
    r["obs"]  # first access maps the entry: the case measures warm gets
    ours = per_call(lambda: r["obs"], 200_000)
    peer = per_call(lambda: d["obs"], 200_000)
    line("td[key] on a persistent store", f"{ours * 1e9:.0f} ns", f"dict[key] of a tensor {peer * 1e9:.0f} ns",
         ours / peer, "<= 5")


def images():
    with gzip.open(FMNIST) as f:
        raw = f.read()
    n = int.from_bytes(raw[4:8], "big")
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, 784).astype(np.float32) / 255)


class MemmapRows(torch.utils.data.Dataset):
    """The map-style dataset most users write over a memmap: one row per item, default collation."""

    def __init__(self, path):
        self.path, self.a = path, None

    def __len__(self):
        return np.load(self.path, mmap_mode="r").shape[0]

    def __getitem__(self, i):
        if self.a is None:  # opened lazily per worker, as users of memmaps learn to
            self.a = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(np.array(self.a[i]))


def bench_loader(root):
    x = images() if os.path.exists(FMNIST) else torch.rand(60000, 784)
    n, batch = x.shape[0], 256
    td = tdstore.TensorDict.create(os.path.join(root, "fmnist"), batch_size=[n])
    td["image"] = x
    td.commit()
    npy = os.path.join(root, "fmnist.npy")
    np.save(npy, x.numpy())
    del x
    r = tdstore.open(td.path)

    def epoch_tdstore(e):
        loader = tdstore.Loader(r, batch_size=batch, shuffle=True, seed=0, num_workers=2)
        loader.set_epoch(e)
        rows = 0
        for b in loader:
            rows += b["image"].shape[0]
        return rows

    a = np.load(npy, mmap_mode="r")

    def epoch_numpy(e):
        order = np.random.default_rng(e).permutation(n)
        rows = 0
        for s in range(0, n, batch):
            rows += torch.from_numpy(a[order[s:s + batch]]).shape[0]
        return rows

    def epoch_dataloader(e):
        dl = torch.utils.data.DataLoader(MemmapRows(npy), batch_size=batch, shuffle=True, num_workers=2,
                                         generator=torch.Generator().manual_seed(e))
        rows = 0
        for b in dl:
            rows += b.shape[0]
        return rows

    def rate(epoch_fn, epochs):
        epoch_fn(0)  # warm: page cache, threads
        best = 0.0
        for e in range(1, epochs + 1):
            t = time.perf_counter()
            rows = epoch_fn(e)
            best = max(best, rows / (time.perf_counter() - t))
        return best

    ours = rate(epoch_tdstore, 5)
    np_rate = rate(epoch_numpy, 5)
    dl_rate = rate(epoch_dataloader, 2)
    line("Loader, 256 x 784 float32, shuffled", f"{ours:,.0f} rows/s", f"numpy memmap fancy-index {np_rate:,.0f} rows/s",
         ours / np_rate, ">= 1")
    line("same, against DataLoader", f"{ours:,.0f} rows/s",
         f"DataLoader, 2 workers, memmap rows {dl_rate:,.0f} rows/s", ours / dl_rate, ">= 10")


def bench_compile():
    def fn(td):
        return td["a"] + td["b"] * td["c"] - td["d"]

    step = tdstore.compile(fn, name="bench_py_four_keys", persist=False)
    for keys in (4, 100, 10_000):
        src = {k: torch.randn(4) for k in "abcd"}
        src.update({f"x{i}": torch.zeros(4) for i in range(keys - 4)})
        td = tdstore.TensorDict(src, batch_size=[4])
        step(td)
        compiled = per_call(lambda: step(td), 20_000)
        eager = per_call(lambda: fn(td), 20_000)
        line(f"compiled call, 4 keys of {keys}", f"{compiled * 1e6:.2f} us", f"eager Python function {eager * 1e6:.2f} us",
             compiled / eager, f"reported (+{(compiled - eager) * 1e6:.2f} us per call)")
    assert step.stats().compiles == 1, step.explain()  # the guard ignores the unread keys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    p.add_argument("--cases", default="get,loader,compile")
    args = p.parse_args()
    root = tempfile.mkdtemp(prefix="tdstore-pybench-", dir=args.dir)
    torch.set_num_threads(1)
    try:
        cases = args.cases.split(",")
        if "get" in cases:
            bench_get(root)
        if "loader" in cases:
            bench_loader(root)
        if "compile" in cases:
            bench_compile()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
