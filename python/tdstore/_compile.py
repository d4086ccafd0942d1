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

What the walk cannot see is caught where it happens: the recording run of a miss is watched
(tdstore._observe) and anything a trace cannot replay or a guard does not hold (a grad-mode
switch inside the body, a seeded generator, backward(), a value read into Python, a tensor read
from a place no guard covers, code the walk does not reach, Python state the call changes, a
path that differs under the tracer) makes that entry run eagerly, with the reason in explain().
"""
import functools
import hashlib
import json
import threading
import types
import weakref

import torch

from tdstore import _tdstore
from tdstore._observe import RecordingWatch, TracingWatch, watching
from tdstore._walk import walk

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
    w = walk(fn)
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
        self._last_walk = None  # (the function walked, its Walk)
        self._calls = threading.local()  # .walk: the walk of this thread's call in progress
        self._recorded_path = None  # the lines the last recording run ran (tdstore._observe)
        functools.update_wrapper(self, fn, updated=())

    def _body(self, td):
        phase = "" if watching() else _tdstore._compile_phase(td)  # nested: the outer watches
        made = None
        if phase == "recording":
            with RecordingWatch() as watch:
                result = self.__wrapped__(td)
            why = watch.reason or watch.unreached(self._calls.walk.codes) or self._changed()
            if why:
                _tdstore._compile_unsupported(td, why)
            self._recorded_path = watch.path
            made = []  # this run is judged here (CallResult.made), not as a C++ body's
        elif phase == "tracing":
            with TracingWatch() as watch:
                result = self.__wrapped__(td)
            if watch.path != self._recorded_path:  # the trace fails: the entry runs eagerly
                raise _tdstore.Error(
                    "the function takes another path under the tracer than in its eager run (a "
                    "branch on torch.jit.is_tracing(), or on state the tracer changes)")
            made = watch.made
        else:
            result = self.__wrapped__(td)
        out = []
        structure = _flatten(result, out, repr(self._name))
        return out, structure, made

    def _changed(self):
        """Why the recording run changed what this call's walk found (Python state the result
        depends on, such as a global list it appends to or an attribute it sets), or None: a
        graph would not make the change, and the next call would find another context."""
        before = self._calls.walk
        if before.still_holds():
            return None
        after = self._new_walk()
        if after.context() == before.context() and len(after.tensors) == len(before.tensors) \
                and all(a is b for a, b in zip(after.tensors, before.tensors)):
            return None
        return "changes Python state its result depends on (a global, an attribute, a container)"

    def _make_engine(self):
        # At the first call, when the helpers the function names exist: they are part of the
        # identity its graphs are stored under.
        with self._lock:
            if self._engine is None:
                identity = code_identity(self.__wrapped__, self._extra_identity)
                me = weakref.ref(self)  # the engine is ours: a strong reference would be a cycle
                # through C++ that the garbage collector cannot see, so self would never be freed

                def body(td):
                    return me()._body(td)
                self._engine = _tdstore._CompiledEngine(body, self._name, identity,
                                                        *self._options)

    def _walk(self):
        """This call's walk: the last one while every place it read still holds what it found
        (tdstore._walk), else a new one."""
        last = self._last_walk
        if last is not None and last[0] is self.__wrapped__ and last[1].still_holds():
            return last[1]
        w = self._new_walk()
        self._last_walk = (self.__wrapped__, w)
        return w

    def _new_walk(self):
        fn = self.__wrapped__
        w = walk(self._inputs, fn) if self._inputs else walk(fn)
        w.seen = w.tensor_index = None  # only the checks keep what they compare
        return w

    def __call__(self, td):
        """fn(td), from a cached graph when its guard holds, else traced or run eagerly."""
        if not isinstance(td, _tdstore.TensorDict):
            raise _tdstore.DTypeError(f"compiled function {self._name!r} takes a "
                                      f"tdstore.TensorDict, got {type(td).__qualname__}")
        if self._engine is None:
            self._make_engine()
        w = self._calls.walk = self._walk()
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


_DEFAULTS = _tdstore._compile_defaults  # the C++ CompileOptions' defaults (one owner)


def compile(fn=None, *, name=None, cache_limit=_DEFAULTS["cache_limit"],  # noqa: A001
            persist=_DEFAULTS["persist"], store=None,
            check_first_run=_DEFAULTS["check_first_run"], dynamic_batch=_DEFAULTS["dynamic_batch"],
            code_identity=_DEFAULTS["code_identity"], inputs=()):
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
