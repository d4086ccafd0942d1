"""tdstore: TensorDicts memory-mapped on disk, a shuffling loader and a compile cache.

A thin binding over the C++ engine (libtdstore); see the project's docs/ for the format and
the rules every cache follows.

    import torch, tdstore
    td = tdstore.TensorDict.create("/tmp/s", batch_size=[1000])
    td["obs"] = torch.randn(1000, 84)
    td.commit()
    r = tdstore.open("/tmp/s")            # read-only; mode="r+" to write
    x = r["obs"]                          # zero-copy view of the store
"""
import hashlib as _hashlib
import types as _types

import torch  # noqa: F401  (the extension's tensors need torch loaded first)

from tdstore._tdstore import (  # noqa: F401
    Attrs, CapacityError, CompiledFunction, CompileStats, CorruptionError, Dataset, DTypeError,
    Error, FormatError, IOError, KeyError, Loader, LockError, ReadOnlyError, ShapeError, TensorDict)

__all__ = ["TensorDict", "Dataset", "Loader", "open", "compile", "code_identity",
           "cache_in_parallel", "Error", "KeyError",
           "ShapeError", "DTypeError", "CapacityError", "CorruptionError", "FormatError",
           "LockError", "ReadOnlyError", "IOError"]


def open(path, mode="r", lock_timeout_ms=0):  # noqa: A001  (the module's verb, like h5py.File)
    """Opens the store at path: mode "r" reads, "r+" writes (one writer at a time)."""
    return TensorDict.open(str(path), mode, lock_timeout_ms)


def cache_in_parallel(dataset, job, group=None):
    """Runs a caching job on every rank of a torch.distributed process group (the default
    group unless one is given; Gloo works over loopback or a network), the protocol of the C++
    tdstore::cache_in_parallel: job(shard, rank, world_size) appends the rows this rank caches
    to its shard store and commits as it goes, resuming from the rows the shard already holds
    (len(shard)), so a rerun after a crash loses and repeats nothing; then a barrier, rank 0
    publishes, a second barrier, and every rank refreshes. Which rows a rank caches is the
    job's choice and must be the same on every run. A rank that dies leaves its shard at its
    last commit; the others fail in the barrier without publishing."""
    import torch.distributed as dist
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    shard = dataset.shard(rank)
    try:
        job(shard, rank, world)
        shard.commit()
    finally:
        del shard  # releases this rank's writer lock before the barrier
    dist.barrier(group)
    if rank == 0:
        dataset.publish()
    dist.barrier(group)
    dataset.refresh()


def _to_tensordict(self):
    """This dict as a `tensordict.TensorDict` (same tensors: views of the store for a persistent
    dict), when the tensordict package is importable; it is not a dependency of tdstore."""
    try:
        import tensordict
    except ImportError as e:
        raise ImportError("TensorDict.to_tensordict() needs the 'tensordict' package, which is not "
                          "importable here; to_dict() gives the same tensors as nested dicts") from e
    return tensordict.TensorDict(self.to_dict(), batch_size=self.batch_size)


TensorDict.to_tensordict = _to_tensordict


def _feed(h, value, seen):
    """Hashes what a function's result can depend on besides its tensor inputs."""
    if isinstance(value, _types.CodeType):
        if id(value) in seen:
            return
        seen.add(id(value))
        h.update(value.co_code)
        h.update(repr((value.co_names, value.co_varnames, value.co_freevars, value.co_argcount,
                       value.co_kwonlyargcount, value.co_flags)).encode())
        for c in value.co_consts:
            _feed(h, c, seen)
    elif isinstance(value, _types.FunctionType):
        _feed(h, value.__code__, seen)
        for d in (value.__defaults__ or ()):
            _feed(h, d, seen)
        for k, d in sorted((value.__kwdefaults__ or {}).items()):
            h.update(k.encode())
            _feed(h, d, seen)
        for cell in (value.__closure__ or ()):
            try:
                _feed(h, cell.cell_contents, seen)
            except ValueError:  # an empty cell
                h.update(b"<empty>")
    elif isinstance(value, torch.Tensor):
        h.update(b"<tensor>")  # tensors are graph inputs or constants the first-run check covers
    elif isinstance(value, (int, float, complex, str, bytes, bool, type(None))):
        h.update(type(value).__name__.encode() + b":" + repr(value).encode())
    elif isinstance(value, (tuple, list, frozenset)):
        h.update(type(value).__name__.encode())
        for v in (sorted(value, key=repr) if isinstance(value, frozenset) else value):
            _feed(h, v, seen)
    elif isinstance(value, dict):
        for k in sorted(value, key=repr):
            _feed(h, k, seen)
            _feed(h, value[k], seen)
    else:
        h.update(type(value).__qualname__.encode())


def code_identity(fn):
    """The hash of fn's code: bytecode, constants, names, defaults and the non-tensor values of
    its closure, recursively through nested code. Persisted graphs are keyed by it, so a
    function whose code changed between runs never loads the old graph."""
    h = _hashlib.sha256()
    _feed(h, fn, set())
    return h.hexdigest()[:32]


def compile(fn=None, *, name=None, cache_limit=8, persist=True, store=None,  # noqa: A001
            check_first_run=False, inputs=(), dynamic_batch=True):
    """Compiles a function of a TensorDict: graphs are keyed by what the function reads (the
    specs of the tensors it gets, the answers of contains/keys/attrs), never by how many keys
    the dict holds, and persisted in the store it reads. On a miss the function runs twice:
    eagerly, then under the tracer. dynamic_batch: when two batch sizes trace one graph, one
    entry serves every size (each new size is compared with eager on its first call); False
    keeps sizes exact. Usable as @tdstore.compile or @tdstore.compile(...)."""
    def wrap(f):
        qual = name or f"{f.__module__}.{f.__qualname__}".replace("/", ".").replace("<", "").replace(">", "")
        return CompiledFunction(f, qual, code_identity(f), cache_limit, persist,
                                None if store is None else str(store), check_first_run, list(inputs),
                                dynamic_batch)
    return wrap if fn is None else wrap(fn)
