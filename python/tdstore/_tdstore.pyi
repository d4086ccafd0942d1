"""Type stubs of tdstore._tdstore, the C++ extension (written by tools/gen_stubs.py)."""
import builtins
import os
from typing import Any, Callable, Iterator, List, Tuple, Union

import torch


class Error(builtins.Exception):
    """Base of every error tdstore raises; messages name the store path, key or field."""
    ...


class ArgumentError(Error, builtins.ValueError):
    """An argument's value is outside what the call accepts: a non-positive batch_size, a rank outside world_size, an empty list to stack (also a ValueError)."""
    ...


class ArgumentTypeError(Error, builtins.TypeError):
    """An argument of a type the call does not take: a plain dict as a Loader's source, a str where a bool is expected (also a TypeError)."""
    ...


class CapacityError(Error):
    """The key directory is full, or the arena's reserved range is exhausted."""
    ...


class ClosedError(Error, builtins.ValueError):
    """A call on a handle after close() (also a ValueError, as for a closed file)."""
    ...


class CorruptionError(Error):
    """Stored bytes fail a checksum or a structural check."""
    ...


class DTypeError(Error, builtins.TypeError):
    """A value's type or dtype cannot be stored (also a TypeError)."""
    ...


class FormatError(Error):
    """The path is not a tdstore store, or its format is newer than this build reads."""
    ...


class IOError(Error, builtins.OSError):
    """An operating-system call failed: disk full, permissions, ... (also an OSError)."""
    ...


class IndexError(ShapeError, builtins.IndexError):
    """A row index outside a batch dimension (also a ShapeError and an IndexError)."""
    ...


class KeyError(Error, builtins.KeyError):
    """A key is absent, empty, not valid text, or too long for a directory slot (also a KeyError)."""
    ...


class LockError(Error, builtins.BlockingIOError):
    """Another writer holds the store's write lock (also a BlockingIOError)."""
    ...


class ReadOnlyError(Error, builtins.PermissionError):
    """A write through a handle opened read-only (also a PermissionError)."""
    ...


class ShapeError(Error, builtins.ValueError):
    """A tensor's leading dims differ from the batch size, or an index is out of range (also a ValueError)."""
    ...


class Attrs:
    """A dict's attributes: str -> str, committed with the data"""
    def __contains__(self, key: str) -> bool:
        """True when the attribute exists."""
        ...
    def __delitem__(self, key: str) -> None:
        """Removes an attribute (staged like a set); KeyError when absent."""
        ...
    def __getitem__(self, key: str) -> str:
        """The attribute's value; KeyError when absent."""
        ...
    def __iter__(self) -> Iterator[str]:
        """The attribute names, sorted."""
        ...
    def __len__(self) -> int:
        """The number of attributes."""
        ...
    def __repr__(self) -> str:
        """tdstore.Attrs({...}) with every attribute."""
        ...
    def __setitem__(self, key: str, value: str) -> None:
        """Stages an attribute (str -> str); committed with the dict's next commit()."""
        ...
    def get(self, key: str, default: Any = ...) -> Any:
        """The attribute's value, or default when absent."""
        ...
    def keys(self) -> List[str]:
        """The attribute names, sorted."""
        ...


class CompileStats:
    """What a compiled function's calls did (CompiledFunction.stats())"""
    def __init__(self) -> None:
        """All counts zero"""
        ...
    def __repr__(self) -> str:
        """CompileStats(compiles=..., loads=..., hits=..., fallbacks=..., entries=...)."""
        ...
    @property
    def compiles(self) -> int:
        """Graphs traced in this process"""
        ...
    @property
    def entries(self) -> int:
        """Graphs cached now"""
        ...
    @property
    def fallbacks(self) -> int:
        """Calls run eagerly (limit reached, untraceable function)"""
        ...
    @property
    def hits(self) -> int:
        """Calls served by a cached graph"""
        ...
    @property
    def loads(self) -> int:
        """Graphs loaded from a store's catalog instead of traced"""
        ...


class Dataset:
    """A directory of shard stores, each written by one writer, plus a
manifest that publish() commits atomically; read as one dataset of the published rows.

    ds = tdstore.Dataset.create("/data/fmnist")
    shard = ds.shard(rank)            # a persistent TensorDict of batch size [rows]
    shard.append(rows); shard.commit()
    ds.publish()                      # readers see these rows from their next refresh()
    loader = tdstore.Loader(ds, batch_size=256)
    """
    def __enter__(self) -> Dataset:
        """Returns the dataset (for `with`)."""
        ...
    def __exit__(self, *args) -> None:
        """Leaving a `with` block closes the dataset"""
        ...
    def __getitem__(self, index: Any) -> Any:
        """ds[i]: global row i (negative from the end) without the row dim; ds[a:b:c], ds[rows]: those rows"""
        ...
    def __len__(self) -> int:
        """Published rows over all shards."""
        ...
    def __repr__(self) -> str:
        """tdstore.Dataset('path', rows=..., shards=...)."""
        ...
    def close(self) -> None:
        """Closes the dataset's manifest and the shard stores it reads, now; shard handles from
shard() stay open. Later calls raise tdstore.ClosedError (a ValueError). Idempotent.
        """
        ...
    @property
    def closed(self) -> bool:
        """True once close() was called"""
        ...
    @staticmethod
    def create(path: Union[str, os.PathLike[str]], row_shape: List[int] = ...) -> Dataset:
        """Creates the dataset directory (a manifest with no shards), or opens it when it exists"""
        ...
    def index(self, rows: torch.Tensor) -> TensorDict:
        """Global rows (int64, 1-d) gathered across shards in the order given"""
        ...
    def keys(self) -> List[str]:
        """Keys of the published rows, sorted."""
        ...
    @staticmethod
    def open(path: Union[str, os.PathLike[str]]) -> Dataset:
        """Opens an existing dataset directory; FormatError when path is not one."""
        ...
    @property
    def path(self) -> str:
        """The dataset directory."""
        ...
    def publish(self) -> None:
        """Publishes every shard's committed rows at once; a shard that disagrees is refused"""
        ...
    def refresh(self) -> None:
        """Moves to the newest publish (and the shards it names)."""
        ...
    @property
    def rows(self) -> int:
        """Published rows over all shards"""
        ...
    def shard(self, shard: int, key_capacity: int = ..., lock_timeout_ms: int = ..., compression: Optional[str] = ..., level: Optional[int] = ...) -> TensorDict:
        """The store of shard `shard`, open for writing (created on first use, reopened to resume). compression, level: as TensorDict.create's (the shard's default for the keys its appends create; recorded when the shard is created)"""
        ...
    @property
    def shard_rows(self) -> List[int]:
        """Published rows per shard"""
        ...


class Loader:
    """Shuffled batches of a TensorDict's or a Dataset's rows (batch dim 0).

Each epoch visits an order drawn from (seed, epoch), identical in every process; rank r of
world_size takes every world_size-th position. order: "random" (a permutation of all rows, the
default), "sequential" (also shuffle=False), or "quasi_random" for data larger than memory
(blocks of block_bytes, default 8 MiB, in random order, rows shuffled within windows of half
of memory_budget, default 1 GiB, read ahead). Batches are in-memory TensorDicts, gathered by
num_workers threads without the GIL.
    """
    def __enter__(self) -> Loader:
        """Returns the loader (for `with`)."""
        ...
    def __exit__(self, *args) -> None:
        """Leaving a `with` block closes the loader"""
        ...
    def __init__(self, source: Any, batch_size: int = ..., shuffle: bool = ..., seed: int = ..., drop_last: bool = ..., rank: int = ..., world_size: int = ..., num_workers: int = ..., prefetch: int = ..., keys: Any = ..., order: str = ..., block_bytes: int = ..., memory_budget: int = ...) -> None:
        """Batches of source's rows (a tdstore.TensorDict or tdstore.Dataset; batch dim 0).

batch_size: rows per batch. shuffle: False reads in order. seed: with the epoch (set_epoch),
what the order is drawn from, identical in every process. drop_last: drop this rank's last
batch when it is smaller. rank, world_size: this process's share (every world_size-th batch
position). num_workers: gathering threads (0: on the iterating thread). prefetch: batches
gathered ahead. keys: the keys (or '/' prefixes) to load, every key when None. order:
"random", "sequential" or "quasi_random". block_bytes, memory_budget: quasi_random's block
size and the memory its window and read-ahead may use.
        """
        ...
    def __iter__(self) -> LoaderIterator:
        """A new pass over the epoch's batches (as DataLoader's iter()); an older iterator of this Loader stops with an Error"""
        ...
    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        ...
    def __repr__(self) -> str:
        """tdstore.Loader(rows=..., batches=..., batch_size=..., epoch=..., step=...)."""
        ...
    def add_feature(self, key: Any, deps: List[str], fn: Callable[..., Any], version: str = ...) -> bool:
        """Adds a row-wise lazy feature: fn(rows) gets the deps of some rows and returns one value
per row. Computed the first time a batch visits a row, stored beside the source with its
provenance, read by later epochs and runs; True when the source already holds it complete.
        """
        ...
    def close(self) -> None:
        """Stops the pass in progress, stores computed row features and releases the source; later calls raise tdstore.ClosedError (a ValueError). Also called at interpreter exit."""
        ...
    @property
    def closed(self) -> bool:
        """True once close() was called"""
        ...
    def feature_rows_done(self, key: Any) -> int:
        """Rows of the row feature `key` computed and stored so far."""
        ...
    def flush_features(self) -> None:
        """Stores the row features computed so far (also done at the end of each epoch and at close())."""
        ...
    def load(self, store: TensorDict, name: str) -> bool:
        """Continues from the position saved under name in store; False when there is none."""
        ...
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from state_dict(): the remaining batches of that epoch, exactly"""
        ...
    @property
    def rows(self) -> int:
        """Rows per epoch for this rank."""
        ...
    def save(self, store: TensorDict, name: str) -> None:
        """Saves the loader's position into store (a writable TensorDict) under name; committed with it."""
        ...
    def set_epoch(self, epoch: int) -> None:
        """Reshuffles from (seed, epoch) and restarts at the epoch's first batch; takes the source's
rows (appended, committed or refreshed since) anew.
        """
        ...
    def state_dict(self) -> dict[str, Any]:
        """The loader's position and what its stream depends on (PyTorch's resume convention)"""
        ...


class LoaderIterator:
    """One pass over a Loader's batches (iter(loader))"""
    def __iter__(self) -> Any:
        """Returns the iterator."""
        ...
    def __next__(self) -> TensorDict:
        """The next batch, an in-memory TensorDict; StopIteration at the end of the epoch."""
        ...
    def __repr__(self) -> str:
        """tdstore.LoaderIterator(pass=...)."""
        ...


class TensorDict:
    """Named tensors sharing leading batch dimensions.

In memory: TensorDict({"obs": t}, batch_size=[8]). Persistent: TensorDict.create(path, ...)
or tdstore.open(path). A handle shares its state, like a tensor: copies see the same dict.
    """
    def __bool__(self) -> bool:
        """Refused (tdstore.ArgumentError), as for tensordict and multi-element tensors."""
        ...
    def __contains__(self, key: Any) -> bool:
        """True when key names a leaf or a prefix of leaves."""
        ...
    def __delitem__(self, key: Any) -> None:
        """Removes a key, or the sub-dict under a prefix (staged on a store until commit());
KeyError when key names neither.
        """
        ...
    def __enter__(self) -> TensorDict:
        """Returns the dict (for `with`)."""
        ...
    def __eq__(self, other: Any) -> Any:
        """Leafwise ==, as tensordict: an in-memory dict of bool tensors. other: a TensorDict or
dict with the same keys, or a tensor or number compared with every leaf. (td == o).all() is True
when they are equal everywhere.
        """
        ...
    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        """Leaving a `with` block: commits what is staged when the block ended without an
exception (a writable store), then closes; after an exception nothing staged is committed.
        """
        ...
    def __getitem__(self, key: Any) -> Any:
        """td["a/b"] or td["a", "b"]: the tensor (a zero-copy view of the store), or the sub-dict
under that prefix. td[i], td[a:b:c], td[index_tensor], td[bool_mask]: the rows selected along
batch dim 0, as an in-memory dict. KeyError naming the key when absent.
        """
        ...
    def __init__(self, source: Any = ..., batch_size: Any = ...) -> None:
        """An in-memory dict.

source: a dict of tensors or numpy arrays (nested dicts give '/' paths), or None: empty.
batch_size: the leading dims every tensor shares (a list or torch.Size); [] when None.
        """
        ...
    def __iter__(self) -> Any:
        """Iterates over the rows along batch dim 0: td[0], td[1], ... (len(td) of them), as
tensordict and torch.Tensor do; td.keys() gives the keys, and `key in td` tests one.
        """
        ...
    def __len__(self) -> int:
        """The first batch dim (0 for a dict without batch dims)."""
        ...
    def __ne__(self, other: Any) -> Any:
        """Leafwise !=: an in-memory dict of bool tensors."""
        ...
    def __repr__(self) -> str:
        """The batch size, the store and generation, then every key with its dtype and shape
(a stored key's from its entry: nothing read), nested by '/' groups.
        """
        ...
    def __setitem__(self, key: Any, value: Any) -> None:
        """td[key] = value sets a key: a tensor (or numpy array) whose leading dims are the batch
size; a dict or TensorDict replaces the sub-dict under key with its leaves, as in tensordict. On a
store the bytes are written now and the keys staged until commit().

td[index] = rows writes rows (index: an int, a slice, an index tensor or a bool mask along batch
dim 0; rows: a TensorDict, a dict of tensors, or a number or tensor for every key), as
t[index] = value does for each of rows' keys, cast to the key's dtype and broadcast to its rows.
In memory the leaves are written in place. On a store each key is rewritten whole, staged until
commit() (the cost is the key's size: assign many rows at once); tensors read before keep their
values. tdstore.ReadOnlyError on a read-only store.
        """
        ...
    def all(self) -> bool:
        """True when every element of every leaf is nonzero (True for a dict without keys)."""
        ...
    def any(self) -> bool:
        """True when some element of some leaf is nonzero."""
        ...
    def append(self, rows: TensorDict) -> None:
        """Appends rows (a TensorDict with the same keys, dtypes and trailing shapes) along batch
dim 0; staged until commit(). KeyError/DTypeError/ShapeError naming the key that differs.
        """
        ...
    def apply(self, fn, *others, batch_size = ...) -> Any:
        """A new in-memory TensorDict holding fn(td[key], *(other[key] for other in others)) for
every key (tensordict's apply with inplace=False). batch_size: the result's (default: this
dict's); a result whose leading dims differ is a tdstore.ShapeError naming the key, as for
any set. A key missing from one of others is its KeyError.
        """
        ...
    @property
    def attrs(self) -> Attrs:
        """The dict's attributes (str -> str), a mutable mapping committed with the data."""
        ...
    @property
    def batch_size(self) -> Any:
        """The leading dims every tensor shares, as a torch.Size. Settable on an in-memory dict
to any leading dims its leaves share; a store's is its rows (tdstore.ArgumentError).
        """
        ...
    @staticmethod
    def cat(dicts: List[TensorDict], dim: int = ...) -> TensorDict:
        """Dicts with the same keys joined along batch dim `dim`."""
        ...
    def chunk(self, chunks: Any, dim: Any = ...) -> List[TensorDict]:
        """chunks pieces along batch dim `dim` (fewer when it is short), as torch.chunk."""
        ...
    def clone(self) -> TensorDict:
        """An in-memory copy"""
        ...
    def close(self) -> None:
        """Closes the dict for every handle on it (copies, sub-dicts, loaders reading it): a store
is unmapped and its writer lock released now; changes not committed are discarded. Tensors
already read stay valid. Later calls raise tdstore.ClosedError (a ValueError). Idempotent.
        """
        ...
    @property
    def closed(self) -> bool:
        """True once close() was called on this dict or a handle sharing it"""
        ...
    def commit(self) -> None:
        """Makes every staged change durable and visible to readers at once (fsync before the
new generation is published). A process killed at any instant leaves the last commit.
        """
        ...
    @property
    def compression(self) -> str:
        """What td[key] = value compresses new keys with: "none" or "zstd:LEVEL:BLOCK_BYTES"."""
        ...
    def compression_of(self, key: Any) -> str:
        """How key is stored: "none" (raw, or in memory) or "zstd:LEVEL:BLOCK_BYTES"."""
        ...
    @staticmethod
    def create(path: Union[str, os.PathLike[str]], batch_size: Any = ..., key_capacity: int = ..., alignment: int = ..., reuse_space: bool = ..., compression: Optional[str] = ..., level: Optional[int] = ...) -> TensorDict:
        """Creates a store at path (a directory that must not exist or be empty), open for writing.

batch_size: the leading dims every tensor shares. key_capacity: how many keys the fixed-size
key directory holds (CapacityError beyond). alignment: byte alignment of every tensor in the
arena (a power of two). reuse_space: whether space freed by overwritten keys is reused once
no reader can see it. compression: the store's default for keys set without one of their own,
"zstd" (level 1, 1 MiB blocks), "zstd:LEVEL", "zstd:LEVEL:BLOCK_BYTES" or "none" (level: the
zstd level, overriding the text's); recorded in the store with the first commit, so later handles use it too.
        """
        ...
    @property
    def device(self) -> Any:
        """The device every leaf is on (cpu for a store); None for an in-memory dict whose leaves
are on several devices, or that has none.
        """
        ...
    def empty(self) -> Any:
        """An in-memory TensorDict with this one's batch size and no keys."""
        ...
    def exclude(self, *args) -> TensorDict:
        """An in-memory dict without the given keys or '/' prefixes."""
        ...
    def flatten_keys(self, separator: str = ...) -> TensorDict:
        """An in-memory dict whose keys are this one's with '/' replaced by separator
("a/b" -> "a.b"), tensordict's flat keys.
        """
        ...
    @staticmethod
    def from_dict(source: dict[str, Any], batch_size: Any = ...) -> TensorDict:
        """An in-memory dict from a dict of tensors (nested dicts give '/' paths) and a batch size."""
        ...
    @property
    def generation(self) -> int:
        """The commit this handle reads (0 before the first commit)."""
        ...
    def get(self, key: Any, default: Any = ...) -> Any:
        """What td[key] gives (the tensor, or the sub-dict under a prefix), or default when key
names neither.
        """
        ...
    def get_or_compute(self, key: Any, deps: List[str], fn: Callable[..., Any], version: str = ...) -> torch.Tensor:
        """A lazy property: the tensor stored under key when it is still valid (its deps unchanged
since it was computed, the same version string), else fn(td), stored under key with its
provenance (committed on a writable store) and returned. deps: the keys fn reads.
        """
        ...
    def get_ragged(self, key: Any) -> Tuple[Any, ...]:
        """A ragged key as (values, offsets): row i is values[offsets[i]:offsets[i+1]]."""
        ...
    def invalidate(self, key: Any) -> bool:
        """Forgets a lazy property's provenance (the next get_or_compute recomputes); False when none."""
        ...
    @property
    def is_persistent(self) -> bool:
        """True for a dict in a store."""
        ...
    def is_ragged(self, key: Any) -> bool:
        """True when key is ragged (set_ragged)."""
        ...
    @property
    def is_writable(self) -> bool:
        """True for an in-memory dict or a store opened with mode 'r+'."""
        ...
    def items(self) -> List[Any]:
        """(key, tensor) pairs, in key order."""
        ...
    def keys(self) -> List[str]:
        """Every leaf key, full '/' paths, sorted"""
        ...
    def lazy_valid(self, key: Any) -> bool:
        """True when the lazy property under key is stored and still valid."""
        ...
    def numpy(self) -> Any:
        """Nested dicts of numpy arrays (views of the store's bytes for a raw stored key, as
torch.Tensor.numpy() is of the tensor).
        """
        ...
    @staticmethod
    def open(path: Union[str, os.PathLike[str]], mode: str = ..., lock_timeout_ms: int = ...) -> TensorDict:
        """Opens an existing store (tdstore.open is the same).

path: the store directory (str or os.PathLike). mode: "r" (read-only, any number of readers)
or "r+" (read-write, one writer at a time). lock_timeout_ms: how long to wait for another
writer to release the store before tdstore.LockError (0: fail at once).
FormatError when path is not a store.
        """
        ...
    @property
    def path(self) -> Any:
        """The store directory, or None for an in-memory dict."""
        ...
    def pop(self, key, default = ...) -> Any:
        """Removes key (a leaf, or the sub-dict under a prefix) and returns what td[key] gave (a
sub-dict as an in-memory copy); default when key names neither and a default is given, else
tdstore.KeyError. On a store the erase is staged until commit().
        """
        ...
    def refresh(self) -> bool:
        """Moves a reader to the newest commit; True when it moved"""
        ...
    def rename_key_(self, old_key: Any, new_key: Any) -> TensorDict:
        """Moves a key to a new name (returns td): KeyError when old_key is absent or new_key
exists. On a store the key's bytes are written under the new name and the old one erased,
staged until commit(). A lazy property renamed becomes a plain key.
        """
        ...
    def reserve(self, rows: int) -> None:
        """A hint: rows the dict will grow to by append(), so space is laid out once."""
        ...
    def rollback(self) -> None:
        """Discards every change staged since the last commit."""
        ...
    def select(self, *args) -> TensorDict:
        """An in-memory dict of the given keys or '/' prefixes (views of this one's tensors)."""
        ...
    def set(self, key: Any, value: Any, compression: Optional[str] = ..., level: Optional[int] = ...) -> None:
        """td.set(key, value) is td[key] = value.

compression: this key's, instead of the handle's default (td.compression): "zstd",
"zstd:LEVEL", "zstd:LEVEL:BLOCK_BYTES" or "none"; level overrides the text's zstd level. A
compressed key is stored in independently compressed blocks of whole rows; reading it returns
a new tensor (not a view of the file), decompressed whole.
        """
        ...
    def set_ragged(self, key: Any, rows: List[torch.Tensor]) -> None:
        """Stores a list of tensors of different lengths along dim 0 as one ragged key."""
        ...
    def setdefault(self, key, default) -> Any:
        """td[key] when key is in td; else sets td[key] = default and returns td[key]."""
        ...
    @property
    def shape(self) -> Any:
        """The batch size (tensordict's td.shape)."""
        ...
    def split(self, split_size: Any, dim: Any = ...) -> List[TensorDict]:
        """Pieces along batch dim `dim`, as torch.split: split_size rows each (the last one
shorter), or a list of sizes summing to the dim's size. Along dim 0 each piece is td[a:b].
        """
        ...
    @staticmethod
    def stack(dicts: List[TensorDict], dim: int = ...) -> TensorDict:
        """Dicts with the same keys and batch size stacked along a new batch dim."""
        ...
    def to(self, dest: Any = ..., *, dtype: Any = ..., device: Any = ...) -> Any:
        """td.to(torch.float16) (or dtype=) casts every leaf (an in-memory dict; ragged keys'
values); td.to("cpu") (or device=, or another TensorDict's device) moves every leaf there, and is
td itself when they are there already (a store is on the cpu). tdstore.DTypeError for a dtype a
store cannot hold, tdstore.ArgumentError for a device this torch cannot reach.
        """
        ...
    def to_dict(self) -> dict[str, Any]:
        """Nested dicts of tensors (views of the store for a persistent dict)"""
        ...
    def to_tensordict(self) -> Any:
        """This dict as a `tensordict.TensorDict` (same tensors: views of the store for a persistent
dict), when the tensordict package is importable; it is not a dependency of tdstore.
        """
        ...
    def unbind(self, dim: Any = ...) -> List[TensorDict]:
        """One dict per index along batch dim `dim`, without that dim, as torch.unbind."""
        ...
    def unflatten_keys(self, separator: str = ...) -> TensorDict:
        """An in-memory dict whose keys are this one's with separator replaced by '/'
("a.b" -> "a/b").
        """
        ...
    def update(self, other: Any) -> None:
        """Sets every leaf of other (a TensorDict, or a dict of tensors and dicts) into this dict;
keys not in other stay.
        """
        ...
    def values(self) -> List[Any]:
        """The tensors, in key order."""
        ...
    def verify(self) -> List[str]:
        """Re-hashes every key: the damaged ones ([] when the store is exact)"""
        ...


class _CompiledEngine:
    def __init__(self, body: Callable[..., Any], name: str, code_identity: str, cache_limit: int, persist: bool, store: Any, check_first_run: bool, dynamic_batch: bool) -> None:
        ...
    def call(self, arg0: TensorDict, arg1: List[torch.Tensor], arg2: str, arg3: str) -> Tuple[Any, ...]:
        ...
    def explain(self) -> str:
        ...
    @property
    def name(self) -> str:
        ...
    def stats(self) -> CompileStats:
        ...


def _cache_in_parallel(dataset: Dataset, rank: int, world_size: int, barrier: Callable[..., Any], job: Callable[..., Any]) -> None:
    """tdstore::cache_in_parallel with the barrier a Python callable (tdstore.cache_in_parallel); other threads' tdstore calls wait until it returns"""
    ...


def _compile_phase(arg0: TensorDict) -> str:
    """What a compiled function's body runs for: "recording", "tracing" or """""
    ...


def _compile_unsupported(arg0: TensorDict, arg1: str) -> None:
    ...


def _import_files(store: Union[str, os.PathLike[str]], leaves: List[Any], append: bool, compression: Optional[str], level: Optional[int], chunk_bytes: int, progress: Any) -> Tuple[Any, ...]:
    """tdstore.import_from of sources whose keys are raw bytes in files: leaves [(key, file, offset, dtype name, shape)] (file empty for a key without elements) imported by tdstore::import_arrays_chunked (copied in the kernel, compared as they land, resumable; another store refused); progress(done, total) after each commit. Returns (keys, rows, resumed_from, total_rows, generation, verified_bytes)"""
    ...


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two CPU tensors hold the same bytes (memcmp; the importers' exactness check)"""
    ...


def _tensordict_layout(dir: Union[str, os.PathLike[str]]) -> Tuple[Any, ...]:
    """(batch_size, [(key, file, dtype name, shape)]) of a tensordict memmap directory, every meta.json and file size checked (tdstore.FormatError naming the file and field); file is empty for a leaf without elements"""
    ...


def _walk_checks_hold(attrs: List[Any], globals: List[Any], cells: List[Any], dicts: List[Any], lists: List[Any], missing: Any) -> bool:
    """Whether every place a compile walk read still holds the object it found (tdstore._walk.Walk.still_holds)"""
    ...


def _write_tensordict_dir(dir: Union[str, os.PathLike[str]], tensors: Dict[str, torch.Tensor], batch_size: List[int]) -> None:
    """Writes {key: tensor} as a tensordict memmap directory (meta.json as tensordict writes it)"""
    ...


def create_key_file(path: Union[str, os.PathLike[str]]) -> str:
    """Writes a new random key (a team key to share) to path with mode 0600 and returns its id; tdstore.Error when path exists"""
    ...


def keyring_info() -> dict[str, Any]:
    """The keys this user signs and trusts compiled graphs with (tdstore/trust.h): {'keys': [{'id', 'path', 'signs'}], 'refused': [reasons], 'graph_cache': path}. Loads them, creating this user's own key, on first use"""
    ...


def user_graph_cache() -> Union[str, os.PathLike[str]]:
    """This user's graph cache (tdstore/trust.h), created when missing: pass it as tdstore.compile(store=...) to keep a function's graphs there"""
    ...
