"""The parts of tensordict's API that are Python protocols or compositions of the engine's
calls: iteration over rows, torch.stack/torch.cat on TensorDicts, pop, setdefault, numpy, empty.
"""
import torch

from tdstore._tdstore import ArgumentTypeError, DTypeError, TensorDict

_missing = object()


def _iter(self):
    """Iterates over the rows along batch dim 0: td[0], td[1], ... (len(td) of them), as
    tensordict and torch.Tensor do; td.keys() gives the keys, and `key in td` tests one."""
    if not self.batch_size:
        raise ArgumentTypeError(f"{self.path or 'in-memory TensorDict'}: iteration over a "
                                "TensorDict without batch dims: iterate td.keys() for its keys")
    return (self[i] for i in range(len(self)))


_TORCH_FUNCTIONS = {}


def _torch_function(cls, func, types, args=(), kwargs=None):
    """torch.stack(dicts, dim), torch.cat(dicts, dim), torch.split/chunk/unbind(td, ...) on
    TensorDicts, as tensordict supports them; other torch functions refuse TensorDicts."""
    op = _TORCH_FUNCTIONS.get(func)
    if op is None:
        return NotImplemented
    if func in (torch.stack, torch.cat):
        dicts = list(args[0]) if args else list((kwargs or {}).get("tensors", ()))
        others = [type(d).__name__ for d in dicts if not isinstance(d, TensorDict)]
        if others:
            raise ArgumentTypeError(f"torch.{func.__name__} of TensorDicts: every element is a "
                                    f"TensorDict, not {others[0]}")
    try:
        return op(*args, **(kwargs or {}))
    except TypeError as e:
        if isinstance(e, ArgumentTypeError):
            raise
        raise ArgumentTypeError(f"torch.{func.__name__} on a TensorDict: {e}") from None


def _check_key(key):
    """A key is a str or a tuple of str (td[0] is a row, not a key)."""
    if not (isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key))):
        raise ArgumentTypeError(f"a key is a str or a tuple of str, not {key!r}")


def _pop(self, key, default=_missing):
    """Removes key (a leaf, or the sub-dict under a prefix) and returns what td[key] gave (a
    sub-dict as an in-memory copy); default when key names neither and a default is given, else
    tdstore.KeyError. On a store the erase is staged until commit()."""
    _check_key(key)
    if key not in self:
        if default is not _missing:
            return default
        return self[key]  # the KeyError naming the closest keys
    value = self[key]
    if isinstance(value, TensorDict):
        value = value.clone()
    del self[key]
    return value


def _setdefault(self, key, default):
    """td[key] when key is in td; else sets td[key] = default and returns td[key]."""
    _check_key(key)
    if key not in self:
        self[key] = default
    return self[key]


def _numpy(self):
    """Nested dicts of numpy arrays (views of the store's bytes for a raw stored key, as
    torch.Tensor.numpy() is of the tensor)."""
    def array(key, t):
        if t.dtype == torch.bfloat16:
            raise DTypeError(f"{self.path or 'in-memory TensorDict'}: key '{key}' is bfloat16, "
                             "which numpy has no dtype for: td.to(torch.float32).numpy()")
        return t.detach().numpy()

    def convert(d, prefix):
        return {k: convert(v, prefix + k + "/") if isinstance(v, dict) else array(prefix + k, v)
                for k, v in d.items()}
    return convert(self.to_dict(), "")


def _apply(self, fn, *others, batch_size=None):
    """A new in-memory TensorDict holding fn(td[key], *(other[key] for other in others)) for
    every key (tensordict's apply with inplace=False). batch_size: the result's (default: this
    dict's); a result whose leading dims differ is a tdstore.ShapeError naming the key, as for
    any set. A key missing from one of others is its KeyError."""
    out = TensorDict(batch_size=self.batch_size if batch_size is None else batch_size)
    for key in self.keys():
        out[key] = fn(self[key], *(other[key] for other in others))
    return out


def _empty(self):
    """An in-memory TensorDict with this one's batch size and no keys."""
    return TensorDict(batch_size=self.batch_size)


def install():
    _TORCH_FUNCTIONS.update({
        torch.stack: lambda tensors, dim=0: TensorDict.stack(list(tensors), dim),
        torch.cat: lambda tensors, dim=0: TensorDict.cat(list(tensors), dim),
        torch.split: lambda td, split_size_or_sections, dim=0: td.split(split_size_or_sections, dim),
        torch.chunk: lambda td, chunks, dim=0: td.chunk(chunks, dim),
        torch.unbind: lambda td, dim=0: td.unbind(dim),
    })
    TensorDict.__iter__ = _iter
    TensorDict.__torch_function__ = classmethod(_torch_function)
    TensorDict.pop = _pop
    TensorDict.setdefault = _setdefault
    TensorDict.numpy = _numpy
    TensorDict.empty = _empty
    TensorDict.apply = _apply
