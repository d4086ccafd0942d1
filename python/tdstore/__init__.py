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
import torch  # noqa: F401  (the extension's tensors need torch loaded first)

from tdstore import _tdstore

from tdstore._tdstore import (  # noqa: F401
    ArgumentError, ArgumentTypeError, Attrs, CapacityError, ClosedError, CompileStats,
    CorruptionError, Dataset, DTypeError,
    Error, FormatError, IndexError, IOError, KeyError, Loader, LoaderIterator, LockError,
    ReadOnlyError, ShapeError, TensorDict, create_key_file, keyring_info,
    user_graph_cache)
from tdstore._compile import CompiledFunction, code_identity, compile  # noqa: F401,A004
from tdstore._version import __version__  # noqa: F401
from tdstore import _tensordict_api

__all__ = ["TensorDict", "Dataset", "Loader", "LoaderIterator", "Attrs", "CompileStats", "CompiledFunction",
           "open", "compile", "code_identity", "keyring_info", "create_key_file", "user_graph_cache",
           "cache_in_parallel", "data", "Error", "ArgumentError", "ArgumentTypeError", "KeyError",
           "ShapeError", "IndexError", "DTypeError", "CapacityError", "CorruptionError", "FormatError",
           "LockError", "ReadOnlyError", "IOError", "ClosedError", "__version__", "import_from",
           "export_to", "importers"]


def open(path, mode="r", lock_timeout_ms=0):  # noqa: A001  (the module's verb, like h5py.File)
    """Opens the store at path (str or os.PathLike): mode "r" reads (any number of readers),
    "r+" writes (one writer at a time: tdstore.LockError for a second one, after waiting up to
    lock_timeout_ms). Any other mode is a tdstore.ArgumentError (a ValueError); "w" too, which
    h5py reads as create-or-truncate: TensorDict.create(path, batch_size) creates a store. The handle is a TensorDict; `with tdstore.open(p, "r+") as td:` commits
    what the block staged when it ends without an exception, then closes the store."""
    return TensorDict.open(path, mode, lock_timeout_ms)


def cache_in_parallel(dataset, job, group=None):
    """Runs a caching job on every rank of a torch.distributed process group (the default
    group unless one is given; Gloo works over loopback or a network), the protocol of the C++
    tdstore::cache_in_parallel: job(shard, rank, world_size) appends the rows this rank caches
    to its shard store and commits as it goes, resuming from the rows the shard already holds
    (len(shard)), so a rerun after a crash loses and repeats nothing; then a barrier, rank 0
    publishes, a second barrier, and every rank refreshes. Which rows a rank caches is the
    job's choice and must be the same on every run. A rank that dies leaves its shard at its
    last commit; the others fail in the barrier without publishing. Other threads' tdstore calls
    wait until it returns."""
    import torch.distributed as dist
    _tdstore._cache_in_parallel(dataset, dist.get_rank(group), dist.get_world_size(group),
                                lambda: dist.barrier(group), job)


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
_tensordict_api.install()

from tdstore import data  # noqa: E402,F401  (imports torch.utils.data; after the names it uses)
from tdstore.importers import export_to, import_from  # noqa: E402,F401  (other formats in and out)
