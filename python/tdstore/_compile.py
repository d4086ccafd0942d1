"""tdstore.compile for Python functions: what a function's result depends on, found per call.

The engine (C++ CompiledFunction) guards on what the function observes of the dict and on the
ambient state of libtorch (grad mode, autocast, default dtype, deterministic algorithms,
inference mode). Everything else a Python function's result can depend on is found here, by
walking what the function can reach from its code: its closure, the globals its code names
(through the Python functions it reaches, and attributes those names select of modules), its
defaults, a bound method's `self`, a partial's arguments, an `nn.Module`'s attributes,
submodules, parameters and buffers. On every call the walk gives

- the **inputs**: every tensor reached (parameters, buffers, captured tensors), passed to the
  graph as inputs, so their current values are used and their specs are guarded;
- the **context**: a digest of everything else reached (numbers, strings, flags such as
  `training`, the code of the functions and classes reached, where each tensor sits), so an
  entry serves only calls that would compute what it traced;
- an **eager reason** when the walk meets something it cannot summarize exactly (another
  TensorDict, a large numpy array, a structure deeper than it follows): the call runs eagerly.

The code identity under which graphs are persisted digests the code reached at the first call.
"""
import functools
import hashlib
import json
import threading
import types

import torch
from torch.overrides import TorchFunctionMode

from tdstore import _tdstore

_MAX_DEPTH = 64
_MAX_NODES = 200_000
_MAX_ARRAY_BYTES = 1 << 20
_SCALARS = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis), torch.dtype,
            torch.device, torch.layout, torch.memory_format)
_BUILTIN_CALLABLES = (types.BuiltinFunctionType, types.BuiltinMethodType,
                      types.MethodWrapperType, types.WrapperDescriptorType,
                      types.MethodDescriptorType, types.ClassMethodDescriptorType)
_OPAQUE = (_tdstore.TensorDict, _tdstore.Dataset, _tdstore.Loader)

_code_digests = {}   # id(code) -> (code, digest): code objects are immutable
_class_digests = {}  # id(class) -> (class, digest): the code of its methods, taken once


def _code_names(code, out):
    out.update(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            _code_names(c, out)
    return out


def _memoized(cache, obj, compute):
    """compute(obj), once per object: the cache keeps obj, so its id is not reused."""
    hit = cache.get(id(obj))
    if hit is None or hit[0] is not obj:
        hit = cache[id(obj)] = (obj, compute(obj))
    return hit[1]


def _code_digest(code):
    return _memoized(_code_digests, code, _digest_code)


def _digest_code(code):
    h = hashlib.blake2b(digest_size=16)
    stack = [code]
    while stack:
        c = stack.pop()
        h.update(c.co_code)
        h.update(repr((c.co_names, c.co_varnames, c.co_freevars, c.co_cellvars, c.co_argcount,
                       c.co_kwonlyargcount, c.co_posonlyargcount, c.co_flags)).encode())
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                stack.append(k)
            else:
                h.update(f"{type(k).__name__}:{k!r}".encode())
    return h.hexdigest()


def _class_digest(cls):
    return _memoized(_class_digests, cls, _digest_class)


def _digest_class(cls):
    h = hashlib.blake2b(digest_size=16)
    for k in cls.__mro__:
        if k is object:
            continue
        h.update(f"{k.__module__}.{k.__qualname__}".encode())
        for name, member in sorted(vars(k).items()):
            fn = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
            if isinstance(fn, property):
                fn = fn.fget
            code = getattr(fn, "__code__", None)
            if isinstance(code, types.CodeType):
                h.update(name.encode() + b"=" + _code_digest(code).encode())
    return h.hexdigest()


class _Walk:
    """One walk of what a callable reaches: tensors, facts, code, and why not (eager)."""

    __slots__ = ("tensors", "tensor_index", "facts", "code", "seen", "nodes", "eager")

    def __init__(self):
        self.tensors = []
        self.tensor_index = {}
        self.facts = []
        self.code = set()  # digests of the code and classes reached
        self.seen = {}     # id -> order of first visit, for objects that can be shared or cyclic
        self.nodes = 0
        self.eager = ""

    def context(self):
        h = hashlib.blake2b("\x1f".join(self.facts).encode(), digest_size=16)
        return h.hexdigest()

    def _enter(self, v):
        """False (and a back-reference fact) when v was visited already."""
        hit = self.seen.get(id(v))
        if hit is not None:
            self.facts.append(f"@{hit[0]}")
            return False
        self.seen[id(v)] = (len(self.seen), v)  # v kept alive for the walk: ids stay unique
        return True

    def value(self, v, depth, names=None):
        """names: the names the referring code uses, to select attributes of modules."""
        self.nodes += 1
        if depth > _MAX_DEPTH or self.nodes > _MAX_NODES:
            self.eager = self.eager or "it reaches more objects than the compile walk follows"
            return
        f = self.facts
        t = type(v)
        # The common cases first, each fact unambiguous by its form.
        if t is str:
            f.append(repr(v))
        elif t is bool or v is None:
            f.append(str(v))
        elif t is int:
            f.append(f"i{v}")
        elif t is float:
            f.append(f"f{v!r}")
        elif isinstance(v, torch.Tensor):
            i = self.tensor_index.get(id(v))
            if i is None:
                i = self.tensor_index[id(v)] = len(self.tensors)
                self.tensors.append(v)
            f.append(f"T{i}")
        elif isinstance(v, dict):
            if not v:
                f.append(f"{t.__qualname__}{{}}")
                return
            if not self._enter(v):
                return
            f.append(f"{t.__module__}.{t.__qualname__}{{{len(v)}")
            for k, x in v.items():
                if type(k) is str:
                    f.append(repr(k))
                else:
                    self.value(k, depth + 1)
                self.value(x, depth + 1, names)
            f.append("}")
        elif t in _SCALARS:
            f.append(f"{t.__name__}:{v!r}")
        elif t is tuple or t is list or t is torch.Size or isinstance(v, (tuple, list)):
            if not self._enter(v):
                return
            f.append(f"{t.__module__}.{t.__qualname__}[{len(v)}")
            for x in v:
                self.value(x, depth + 1, names)
            f.append("]")
        elif isinstance(v, (set, frozenset)):
            f.append(f"{t.__name__}:{sorted(repr(x) for x in v)!r}")
        elif isinstance(v, types.FunctionType):
            if self._enter(v):
                self.function(v, depth)
        elif isinstance(v, types.MethodType):
            if self._enter(v):
                f.append("method")
                self.value(v.__self__, depth + 1)
                self.value(v.__func__, depth + 1)
        elif isinstance(v, functools.partial):
            if self._enter(v):
                f.append("partial")
                self.value(v.func, depth + 1)
                self.value(v.args, depth + 1)
                self.value(v.keywords, depth + 1)
        elif isinstance(v, types.ModuleType):
            f.append(f"module:{v.__name__}")
            if names and self._enter(v):
                for n in sorted(names):
                    a = getattr(v, n, None)
                    if a is not None and not isinstance(a, types.ModuleType):
                        f.append(n)
                        self.value(a, depth + 1)
        elif isinstance(v, type):
            digest = _class_digest(v)
            self.code.add(digest)
            f.append(f"class:{v.__module__}.{v.__qualname__}:{digest}")
        elif isinstance(v, _BUILTIN_CALLABLES):
            owner = getattr(v, "__self__", None)
            f.append(f"builtin:{getattr(v, '__module__', None)}.{getattr(v, '__qualname__', '?')}")
            if owner is not None and not isinstance(owner, types.ModuleType):
                self.value(owner, depth + 1)
        elif isinstance(v, _OPAQUE):
            self.eager = self.eager or (
                f"it captures a tdstore.{t.__name__} (its tensors would be constants of the "
                "graph); read them from the dict the function is called with")
        elif t.__module__ == "numpy" and t.__name__ == "ndarray":
            if v.nbytes > _MAX_ARRAY_BYTES or v.dtype.hasobject:
                self.eager = self.eager or ("it captures a numpy array too large (or of objects) "
                                            "to digest per call; capture it as a tensor")
            else:
                f.append(f"ndarray:{v.dtype.str}:{v.shape}:"
                         + hashlib.blake2b(v.tobytes(), digest_size=16).hexdigest())
        elif t.__module__ == "numpy" and hasattr(v, "item") and not hasattr(v, "__dict__"):
            f.append(f"numpy:{t.__name__}:{v!r}")
        else:
            if not self._enter(v):
                return
            digest = _class_digest(t)
            self.code.add(digest)
            f.append(f"object:{t.__module__}.{t.__qualname__}:{digest}")
            attrs = getattr(v, "__dict__", None)
            if attrs is not None:
                self.value(attrs, depth + 1)
            for slot in getattr(t, "__slots__", ()):
                if isinstance(slot, str) and hasattr(v, slot):
                    f.append(slot)
                    self.value(getattr(v, slot), depth + 1)

    def function(self, fn, depth):
        code = fn.__code__
        digest = _code_digest(code)
        self.code.add(digest)
        self.facts.append(f"fn:{digest}")
        self.value(fn.__defaults__, depth + 1)
        self.value(fn.__kwdefaults__, depth + 1)
        for cell in fn.__closure__ or ():
            try:
                self.value(cell.cell_contents, depth + 1)
            except ValueError:  # an empty cell
                self.facts.append("<empty cell>")
        names = _code_names(code, set())
        g = fn.__globals__
        for n in sorted(names):
            if n in g:
                self.facts.append(f"global:{n}")
                self.value(g[n], depth + 1, names)


def _walk(target):
    w = _Walk()
    w.value(target, 0)
    return w


class _LayoutReads(TorchFunctionMode):
    """Notes the first read of where a tensor's bytes are (storage_offset(), data_ptr()): no
    guard holds it and a trace bakes it in, so the call's entry runs eagerly."""

    NAMES = frozenset({"storage_offset", "data_ptr", "storage", "untyped_storage"})

    def __init__(self):
        super().__init__()
        self.seen = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.seen is None and getattr(func, "__name__", None) in self.NAMES:
            self.seen = func.__name__
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------------------------- returns

def _flatten(value, out, where):
    if isinstance(value, torch.Tensor):
        out.append(value)
        return "T"
    if value is None:
        return "N"
    t = type(value)
    if t is tuple or t is list:
        inner = ",".join(_flatten(v, out, where) for v in value)
        return f"({inner})" if t is tuple else f"[{inner}]"
    if t is dict and all(type(k) is str for k in value):
        return "{" + ",".join(json.dumps(k) + ":" + _flatten(v, out, where)
                              for k, v in value.items()) + "}"
    raise _tdstore.DTypeError(
        f"compiled function {where} returned {t.__module__}.{t.__qualname__}; expected a tensor, "
        "None, or a tuple, list or dict (str keys) of them")


@functools.lru_cache(maxsize=1024)
def _builder(structure):
    """A function rebuilding the value `structure` describes from an iterator of tensors."""
    decoder = json.JSONDecoder()

    def parse(i):
        c = structure[i]
        if c == "T":
            return (lambda it: next(it)), i + 1
        if c == "N":
            return (lambda it: None), i + 1
        close = {"(": ")", "[": "]", "{": "}"}[c]
        parts, i = [], i + 1
        while structure[i] != close:
            key = None
            if c == "{":
                key, i = decoder.raw_decode(structure, i)
                i += 1  # ':'
            part, i = parse(i)
            parts.append((key, part))
            if structure[i] == ",":
                i += 1
        if c == "(":
            return (lambda it: tuple(p(it) for _, p in parts)), i + 1
        if c == "[":
            return (lambda it: [p(it) for _, p in parts]), i + 1
        return (lambda it: {k: p(it) for k, p in parts}), i + 1

    build, _ = parse(0)
    return build


def _unflatten(structure, tensors):
    return _builder(structure)(iter(tensors))


# ---------------------------------------------------------------------------------- compile

def _default_name(target):
    fn = target
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, (types.FunctionType, types.BuiltinFunctionType)):
        fn = type(fn)  # an nn.Module or another callable object: its class
    name = f"{getattr(fn, '__module__', None)}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    return name.replace("/", ".").replace("<", "").replace(">", "")


def code_identity(fn, extra=""):
    """The digest of the code fn reaches now (its own, the functions it calls through globals
    and closures, the classes of the objects and modules it reaches) and `extra`. Graphs are
    persisted under it, so a function whose code or helpers changed between runs never loads
    the old graphs."""
    w = _walk(fn)
    h = hashlib.blake2b(digest_size=16)
    for d in sorted(w.code):
        h.update(d.encode())
    h.update(b"\x00" + str(extra).encode())
    return h.hexdigest()


class CompiledFunction:
    """A function of a TensorDict with a graph cache (made by tdstore.compile).

    Calls return what the function returns eagerly: a tensor, None, or tuples, lists and dicts
    (str keys) of them. stats() counts compilations, loads, hits and eager fallbacks; explain()
    says why each graph was traced or why calls ran eagerly."""

    def __init__(self, fn, name, code_identity, cache_limit, persist, store, check_first_run,
                 dynamic_batch, inputs=()):
        if not callable(fn):
            raise _tdstore.DTypeError(f"tdstore.compile: {fn!r} is not callable")
        self.__wrapped__ = fn
        self._inputs = tuple(inputs)  # walked first: their order is the inputs' order
        self._lock = threading.Lock()
        self._name = name
        self._extra_identity = code_identity
        self._options = (cache_limit, persist, None if store is None else str(store),
                         check_first_run, dynamic_batch)
        self._engine = None
        functools.update_wrapper(self, fn, updated=())

    def _body(self, td):
        layout = _LayoutReads()
        with layout:
            result = self.__wrapped__(td)
        if layout.seen:
            _tdstore._compile_unsupported(
                td, f"{layout.seen}() of a tensor (where its bytes are: a trace bakes it in)")
        out = []
        structure = _flatten(result, out, repr(self._name))
        return out, structure

    def _make_engine(self):
        # At the first call, when the helpers the function names exist: they are part of the
        # identity its graphs are stored under.
        with self._lock:
            if self._engine is None:
                identity = code_identity(self.__wrapped__, self._extra_identity)
                self._engine = _tdstore._CompiledEngine(self._body, self._name, identity,
                                                        *self._options)

    def _walk(self):
        w = _Walk()
        if self._inputs:
            w.value(self._inputs, 0)
        w.value(self.__wrapped__, 0)
        return w

    def __call__(self, td):
        """fn(td), from a cached graph when its guard holds, else traced or run eagerly."""
        if not isinstance(td, _tdstore.TensorDict):
            raise _tdstore.DTypeError(f"compiled function {self._name!r} takes a "
                                      f"tdstore.TensorDict, got {type(td).__qualname__}")
        if self._engine is None:
            self._make_engine()
        w = self._walk()
        tensors, structure = self._engine.call(td, w.tensors, w.context(), w.eager)
        return _unflatten(structure, tensors)

    def stats(self):
        """Counts of this function's calls: compiles, loads, hits, fallbacks, entries."""
        if self._engine is None:
            return _tdstore.CompileStats()
        return self._engine.stats()

    def explain(self):
        """Why each graph was traced or loaded, and why calls ran eagerly ("" before a call)."""
        return "" if self._engine is None else self._engine.explain()

    @property
    def name(self):
        """The name graphs are stored under (the function's qualified name by default)."""
        return self._name

    def __repr__(self):
        """tdstore.CompiledFunction('name')."""
        return f"tdstore.CompiledFunction({self._name!r})"


def compile(fn=None, *, name=None, cache_limit=8, persist=True, store=None,  # noqa: A001
            check_first_run=False, dynamic_batch=True, code_identity="", inputs=()):
    """Compiles a function of a TensorDict (a function, a bound method, an nn.Module, a
    functools.partial or any callable): graphs are keyed by what the function reads of the dict
    (the specs of the tensors it gets, the answers of contains/keys/attrs), never by how many
    keys the dict holds, and persisted in the store it reads.

    Every tensor the function reaches (module parameters and buffers, captured tensors) is a
    graph input; everything else it reaches (numbers, flags such as `training`, the code of the
    functions and classes it reaches) and libtorch's grad mode, autocast, default dtype,
    deterministic and inference modes are in the guard. On a miss the function runs twice:
    eagerly, then under the tracer. dynamic_batch: when two batch sizes trace one graph, one
    entry serves every size (each new size is traced first and joins only when its trace is the
    same graph); False keeps sizes exact. code_identity: mixed into the identity graphs are
    stored under (anything else the result depends on). inputs: tensors to pass as graph
    inputs first (those the function reaches are passed anyway). Usable as @tdstore.compile or
    @tdstore.compile(...)."""
    def wrap(f):
        return CompiledFunction(f, name or _default_name(f), code_identity, cache_limit, persist,
                                store, check_first_run, dynamic_batch, inputs)
    return wrap if fn is None else wrap(fn)
