"""The main job in Python: cache Fashion-MNIST into two stores (train, test), train an MLP with
tdstore.Loader and a compiled training step, evaluate on the test set. A second run reuses
everything: no import (the stores are checked against the source files' digests), no traces
(graphs loaded from the train store), the normalized images read from the stores. Over a copy
of the stores this user cannot write (another user's, read-only media), the second run traces
nothing either: the graphs come from this user's graph cache (README, "Sharing a dataset").

    .venv/bin/python examples/fashion_mnist.py [--epochs 10] [--store DIR] [--compress zstd[:LEVEL]]
"""
import argparse
import gzip
import hashlib
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import tdstore

try:
    from tqdm import tqdm
except ImportError:  # the package's own one-line progress
    tqdm = None


def progress(iterable, total, desc):
    if tqdm is not None:
        return tqdm(iterable, total=total, desc=desc, unit="batch", leave=False, file=sys.stderr)

    def one_line():
        for n, item in enumerate(iterable, 1):
            if n % 50 == 0 or n == total:
                print(f"\r{desc}: {n}/{total}", end="", file=sys.stderr, flush=True)
            yield item
        print(file=sys.stderr)
    return one_line()


def read_idx(path):
    with gzip.open(path) as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def digest(*paths):
    h = hashlib.blake2b(digest_size=16)
    for p in paths:
        with open(p, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def cache_split(data, prefix, path, compression=None):
    """The store at path holding the split, imported unless it already holds these files' rows.
    Returns (store, reused): opened for writing, or read-only when this user cannot write it (a
    shared copy: features and graphs stored there are reused; graphs traced here go to this
    user's graph cache)."""
    images = os.path.join(data, f"{prefix}-images-idx3-ubyte.gz")
    labels = os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz")
    source = digest(images, labels) + (f" {compression}" if compression else "")  # another: made again
    if os.path.exists(path):
        writable = os.access(path, os.W_OK)
        try:
            td = tdstore.open(path, "r+" if writable else "r")
            if td.attrs.get("source") == source and not td.verify():
                return td, True
            td.close()
        except tdstore.Error:
            pass
        if not writable:
            sys.exit(f"{path}: not a valid copy of {data}, and not writable by this user")
        import shutil
        shutil.rmtree(path)
    x, y = read_idx(images), read_idx(labels)
    with tdstore.TensorDict.create(path, batch_size=[len(y)], compression=compression) as td:
        td["images"] = torch.from_numpy(x.reshape(len(y), 784).copy())
        td["labels"] = torch.from_numpy(y.astype(np.int64))
        td.attrs["source"] = source
    return tdstore.open(path, "r+"), False


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--store", default=os.path.join(os.environ.get("TMPDIR", "/var/tmp"), "tdstore-fashion-mnist-py"))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compress", default=None, metavar="zstd[:LEVEL]",
                   help="store the keys (features included) compressed")
    args = p.parse_args()
    torch.manual_seed(args.seed)

    t0 = time.perf_counter()
    train, train_reused = cache_split(args.data, "train", os.path.join(args.store, "train"), args.compress)
    test, test_reused = cache_split(args.data, "t10k", os.path.join(args.store, "test"), args.compress)
    how = "reused the cached stores, no import" if train_reused and test_reused else f"imported into {args.store}"
    print(f"dataset: train {len(train)} rows, test {len(test)} rows ({how}; {time.perf_counter() - t0:.2f} s)")

    model = torch.nn.Sequential(torch.nn.Linear(784, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))
    for layer in (model[0], model[2]):  # He initialization, as the C++ main job
        torch.nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
        torch.nn.init.zeros_(layer.bias)
    graphs = os.path.join(args.store, "train")  # batches are in memory: graphs go to the train store
    step = tdstore.compile(lambda b: F.cross_entropy(model(b["images_f32"]), b["labels"]),
                           name="fmnist_py_train_step", store=graphs)
    predict = tdstore.compile(lambda b: model(b["images_f32"]).argmax(1), name="fmnist_py_predict", store=graphs)

    def normalized(rows):
        return rows["images"].to(torch.float32) / 255

    train_loader = tdstore.Loader(train, batch_size=args.batch, seed=args.seed, keys=["labels"])
    stored = {"train": train_loader.add_feature("images_f32", ["images"], normalized, version="v1")}
    test_loader = tdstore.Loader(test, batch_size=1000, shuffle=False, keys=["labels"])
    stored["test"] = test_loader.add_feature("images_f32", ["images"], normalized, version="v1")

    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * len(train_loader))
    rows, train_time = 0, 0.0
    for epoch in range(args.epochs):
        train_loader.set_epoch(epoch)
        t = time.perf_counter()
        total = 0.0
        for batch in progress(train_loader, len(train_loader), f"epoch {epoch + 1}/{args.epochs}"):
            loss = step(batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(batch)
            rows += len(batch)
        train_time += time.perf_counter() - t
        print(f"epoch {epoch + 1}: loss {total / len(train):.4f}")
    print(f"training: {rows / train_time:,.0f} rows/s over {args.epochs} epochs")

    with torch.no_grad():
        correct = sum(int((predict(b) == b["labels"]).sum()) for b in progress(test_loader, len(test_loader), "test"))
    print(f"test accuracy: {correct / len(test):.4f}")
    for f in (step, predict):
        s = f.stats()
        print(f"{f.name}: {s.compiles} traced, {s.loads} loaded from the store, {s.hits} calls served by graphs, "
              f"{s.fallbacks} eager")
    for name, loader in (("train", train_loader), ("test", test_loader)):
        how = "read from the store" if stored[name] else "computed"
        print(f"feature images_f32 ({name}): {how}, {loader.feature_rows_done('images_f32')} rows")
    for h in (train_loader, test_loader, train, test):
        h.close()


if __name__ == "__main__":
    main()
