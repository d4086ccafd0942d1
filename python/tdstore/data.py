"""torch.utils.data adapters: a map-style Dataset over a store, for DataLoader users.

    ds = tdstore.data.Dataset("/data/fmnist")
    dl = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=2)
    for batch in dl:                    # dicts of tensors, as default_collate makes them
        batch["image"], batch["label"]

    dl = tdstore.data.loader("/data/fmnist", batch_size=256, shuffle=True)   # the same, faster

tdstore.Loader is the faster path (batches gathered by C++ threads, resumable positions, row
features); this one is for code built around DataLoader (samplers, its worker processes).
"""
import os

import torch.utils.data

import tdstore


class _Item(dict):
    """One row as Dataset.__getitem__ gives it: a dict of tensors, a ragged key's row at its own
    length; `ragged` names those keys ('/' paths) for `collate`, which pads them."""
    __slots__ = ("ragged",)


class _Row(_Item):
    """One row of a batch gathered by Dataset.__getitems__: a dict of views of that batch, which
    `collate` recognizes to hand out the gathered batch instead of stacking the rows again."""
    __slots__ = ("batch", "index", "size")


def _lengths_key(key):
    return key + ".lengths"  # as a tdstore.Loader batch names a ragged key's row lengths


def _nested_set(d, key, value):
    *parents, leaf = key.split("/")
    for p in parents:
        d = d.setdefault(p, {})
    d[leaf] = value


def _nested_pop(d, key):
    *parents, leaf = key.split("/")
    for p in parents:
        d = d[p]
    return d.pop(leaf)


class Dataset(torch.utils.data.Dataset):
    """Rows of a store (batch dim 0) as a map-style dataset of dicts of tensors (nested dicts
    for '/' keys), as torch.utils.data.default_collate expects. __getitems__, which DataLoader
    calls with a batch's indices, gathers the batch in one indexing call.

    path_or_td: a store's path (str or os.PathLike), opened read-only, or a tdstore.TensorDict.
    keys: the keys (or '/' prefixes) to load; every key when None.

    The store is reopened by path when the dataset is pickled (workers started by spawn or
    forkserver); forked workers keep using the parent's handle. close() or `with` closes the
    store (a TensorDict passed in is closed too).

    A read-only store's compressed keys (td.compression_of(key) != "none") are decompressed once,
    when the dataset is made, and held in memory (their raw bytes; forked workers share them, a
    pickled dataset decompresses its own; again after the handle's refresh() shows another
    generation), so that shuffled batches do not decompress every block they touch; the other
    keys stay views of the store.
    """

    def __init__(self, path_or_td, keys=None):
        if isinstance(path_or_td, (str, os.PathLike)):
            path_or_td = tdstore.open(path_or_td)
        elif not isinstance(path_or_td, tdstore.TensorDict):
            raise tdstore.DTypeError(f"tdstore.data.Dataset: expected a store path or a tdstore.TensorDict, "
                                     f"got {type(path_or_td).__name__}")
        self.td = path_or_td if keys is None else path_or_td.select(*keys)
        self._ragged_keys = None
        self._rows = None
        self._unpack()

    def _unpack(self):
        # Compressed keys are decompressed once here (memory: their raw bytes, shared with
        # forked workers) rather than block by block for every batch a shuffling DataLoader
        # asks for; the other keys stay views of the store. Only for a read-only handle, whose
        # rows change only when its generation does (refresh()): a writer's staged sets are read
        # through the store.
        self._rows, self._rows_generation = None, None
        td = self.td
        if td.is_persistent and not td.is_writable and any(td.compression_of(k) != "none" for k in td.keys()):
            self._rows, self._rows_generation = td.select(*td.keys()), td.generation

    def _source(self):
        if self._rows is not None and self.td.generation != self._rows_generation:
            self._unpack()  # the handle was refreshed: the rows it sees now
        return self.td if self._rows is None else self._rows

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_rows"] = None  # a pickled dataset reopens the store and decompresses again
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._unpack()

    def __len__(self):
        return len(self.td)

    def __getitem__(self, i):
        """Row i as a dict of tensors (views of the store); a ragged key's row at its own length,
        [length, ...], never padded (collate pads a batch of them and adds their lengths)."""
        item = _Item(self._source()[int(i)].to_dict())
        item.ragged = self._ragged()
        return item

    def __getitems__(self, indices):
        """Rows `indices`, gathered at once, as a list of row dicts (views of the gathered batch;
        a ragged key's rows at their own lengths)."""
        gathered = self._source()[torch.as_tensor(indices, dtype=torch.long)]
        ragged = self._ragged()
        batch = gathered.to_dict()  # a ragged key padded to its longest row here
        parts = {}
        for k in ragged:
            values, offsets = gathered.get_ragged(k)
            _nested_set(batch, _lengths_key(k), offsets[1:] - offsets[:-1])
            parts[k] = (values, offsets.tolist())
        rows = []
        for i in range(len(indices)):
            row = _Row(_index_nested(batch, i))
            for k, (values, offsets) in parts.items():
                _nested_pop(row, _lengths_key(k))
                _nested_set(row, k, values[offsets[i]:offsets[i + 1]])
            row.ragged = ragged
            row.batch, row.index, row.size = batch, i, len(indices)
            rows.append(row)
        return rows

    def _ragged(self):
        if self._ragged_keys is None:
            self._ragged_keys = tuple(k for k in self.td.keys() if self.td.is_ragged(k))
        return self._ragged_keys

    def close(self):
        """Closes the store (tdstore.TensorDict.close) and frees what was decompressed."""
        self._rows = None
        self.td.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.td.closed:
            return "tdstore.data.Dataset(closed)"
        return f"tdstore.data.Dataset({self.td.path!r}, rows={len(self)}, keys={self.td.keys()!r})"


def _index_nested(d, i):
    return {k: _index_nested(v, i) if isinstance(v, dict) else v[i] for k, v in d.items()}


def collate(rows):
    """DataLoader's collate_fn for Dataset: the batch __getitems__ gathered when `rows` are all of
    it, in order (no second copy); torch.utils.data.default_collate otherwise (a sampler that
    reorders, items from __getitem__). A ragged key's rows are padded with zeros to the longest
    and its lengths added as "<key>.lengths", as in a tdstore.Loader batch (padding is never
    mistaken for data: read row i's first lengths[i] entries)."""
    first = rows[0] if rows else None
    if (isinstance(first, _Row) and first.size == len(rows)
            and all(isinstance(r, _Row) and r.batch is first.batch and r.index == n for n, r in enumerate(rows))):
        return first.batch
    ragged = first.ragged if isinstance(first, _Item) else ()
    if not ragged:
        return torch.utils.data.default_collate(rows)
    rows = [_copy_nested(r) for r in rows]
    padded = {}
    for k in ragged:
        parts = [_nested_pop(r, k) for r in rows]
        padded[k] = (torch.nn.utils.rnn.pad_sequence(parts, batch_first=True),
                     torch.tensor([p.shape[0] for p in parts], dtype=torch.long))
    batch = torch.utils.data.default_collate(rows)
    for k, (values, lengths) in padded.items():
        _nested_set(batch, k, values)
        _nested_set(batch, _lengths_key(k), lengths)
    return batch


def _copy_nested(d):
    return {k: _copy_nested(v) if isinstance(v, dict) else v for k, v in d.items()}


def loader(path_or_td, batch_size=256, shuffle=True, keys=None, **dataloader_kwargs):
    """A torch.utils.data.DataLoader over Dataset(path_or_td, keys) with collate() as its
    collate_fn; every other argument (num_workers, sampler, generator, multiprocessing_context,
    ...) is DataLoader's."""
    dataloader_kwargs.setdefault("collate_fn", collate)
    return torch.utils.data.DataLoader(Dataset(path_or_td, keys), batch_size=batch_size, shuffle=shuffle,
                                       **dataloader_kwargs)
