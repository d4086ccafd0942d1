"""The walk of what a compiled Python function reaches, and the proof that it is unchanged.

A walk visits what a callable can reach from its code (module docstring of tdstore._compile)
and yields the call's graph inputs (the tensors reached), its context (a digest of everything
else reached) and an eager reason. Walking costs about a microsecond per object visited, which
is more than a small training step's graph saves, so a walk also records **checks**: for every
mutable place it read (a dict's items, a list's elements, a function's code, defaults and
closure cells, an object's class and `__dict__`, a module attribute or global it selected by
name, a slot) the object it found there. When every check still finds the identical object,
every read of a new walk would find what this one found, so its facts, and so its context and
tensors, would be the same: the previous walk is reused. Immutable values (numbers, strings,
tuples, code) need no check of their own: the place holding them is checked by identity. What
cannot be checked by identity (a numpy array's contents) makes a walk single-use.

Classes defined outside the library (LIBRARY_DIRS: torch, the standard library, tdstore) are
walked member by member: every function, property and class attribute in the dicts of their
MRO, with a check on each of those dicts, so a module-level global read in `forward`, in a
property or a helper method is in the context like one read by the function itself, and a
class attribute set or a method replaced later is seen. The code a recording run executes must
be code the walk reached (Walk.codes; tdstore._observe checks it), else the call runs eagerly.

Invariant: every read the walk's facts depend on is either of an immutable object or covered by
a check recorded in the same walk.
"""
import collections
import contextvars
import functools
import gc
import hashlib
import os
import re
import sys
import sysconfig
import types

import torch

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
_MISSING = object()  # what a check expects of an absent attribute, global or empty cell
# Objects of C types that cannot change after they are made: their repr is their fact.
_IMMUTABLE = (range, re.Pattern, torch.finfo, torch.iinfo, types.CodeType,
              types.MemberDescriptorType, types.GetSetDescriptorType,
              type(collections.namedtuple("_Pair", "a").a))  # a named tuple's field getter

# Code in files under these directories is library code: its classes are digested rather than
# walked member by member, and tdstore._observe does not require the walk to reach it.
LIBRARY_DIRS = tuple(os.path.normpath(d) + os.sep for d in (
    os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)),
    sysconfig.get_paths()["stdlib"]))

_code_digests = {}   # id(code) -> (code, digest): code objects are immutable
_code_name_sets = {}  # id(code) -> (code, sorted names its code and nested code use)
_class_digests = {}  # id(class) -> (class, digest): the code of its methods, taken once
_user_classes = {}  # id(class) -> (class, whether its module's file is outside LIBRARY_DIRS)


def _memoized(cache, obj, compute):
    """compute(obj), once per object: the cache keeps obj, so its id is not reused."""
    hit = cache.get(id(obj))
    if hit is None or hit[0] is not obj:
        hit = cache[id(obj)] = (obj, compute(obj))
    return hit[1]


def _names_of(code):
    out = set()
    stack = [code]
    while stack:
        c = stack.pop()
        out.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return tuple(sorted(out))


def code_names(code):
    return _memoized(_code_name_sets, code, _names_of)


_nested = {}  # id(code) -> (code, frozenset of it and the code objects nested in it)


def _nested_codes(code):
    def collect(c):
        out, stack = set(), [c]
        while stack:
            k = stack.pop()
            out.add(k)
            stack.extend(x for x in k.co_consts if isinstance(x, types.CodeType))
        return frozenset(out)
    return _memoized(_nested, code, collect)


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


def is_library_file(filename):
    return filename.startswith(LIBRARY_DIRS) or filename.startswith("<frozen")


def _defined_by_user(cls):
    """A class statement's class outside LIBRARY_DIRS (one made by exec'd code, or in a module
    without a file, is the user's too)."""
    if not cls.__flags__ & _HEAPTYPE:
        return False
    module = sys.modules.get(getattr(cls, "__module__", None) or "")
    f = getattr(module, "__file__", None)
    return not f or not is_library_file(os.path.abspath(f))


def is_user_class(cls):
    return _memoized(_user_classes, cls, _defined_by_user)


def _type_dict(cls):
    """The dict behind cls.__dict__ (a read-only proxy), so that a check can read it by key."""
    return gc.get_referents(cls.__dict__)[0]


def _slot_names(cls):
    """The slots declared along cls's MRO (a one-string __slots__ is one slot)."""
    out = []
    for k in cls.__mro__:
        slots = vars(k).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if isinstance(name, str) and name not in ("__dict__", "__weakref__"):
                if name.startswith("__") and not name.endswith("__"):
                    name = f"_{k.__name__.lstrip('_')}{name}"  # a private name is mangled
                if name not in out:
                    out.append(name)
    return out


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement (or type())
_CLASS_BOOKKEEPING = frozenset({"__dict__", "__weakref__", "__module__", "__doc__", "__slots__",
                                "__qualname__", "__annotations__", "__parameters__",
                                "__orig_bases__", "__abstractmethods__", "_abc_impl",
                                "__dataclass_fields__", "__dataclass_params__",
                                "__match_args__"})


def _unwrapped(member):
    """What a class member runs or holds: a classmethod's or staticmethod's function, a
    property's accessors (as a tuple), or the member itself."""
    if isinstance(member, (classmethod, staticmethod)):
        return member.__func__
    if isinstance(member, property):
        return (member.fget, member.fset, member.fdel)
    return member


def _cell(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return _MISSING


class Walk:
    """One walk of what a callable reaches: tensors, facts, code, why not (eager), and the
    checks that prove a later walk would find the same (still_holds)."""

    __slots__ = ("tensors", "tensor_index", "facts", "code", "codes", "seen", "nodes", "eager",
                 "single_use", "attrs", "globals", "cells", "dicts", "lists", "_context")

    def __init__(self):
        self.tensors = []
        self.tensor_index = {}
        self.facts = []
        self.code = set()  # digests of the code and classes reached
        self.codes = set()  # the code objects walked as functions, with the code nested in them
        self.seen = {}     # id -> order of first visit, for objects that can be shared or cyclic
        self.nodes = 0
        self.eager = ""
        self.single_use = False  # something read cannot be checked by identity
        self.attrs = []  # (object, attribute name, object found or _MISSING)
        self.globals = []  # (a function's globals, name, object found or _MISSING)
        self.cells = []  # (closure cell, contents found or _MISSING)
        self.dicts = []  # (dict, its keys, its values), in iteration order
        self.lists = []  # (list or set, its elements in iteration order)
        self._context = None

    def context(self):
        if self._context is None:
            h = hashlib.blake2b("\x1f".join(self.facts).encode(), digest_size=16)
            self._context = h.hexdigest()
        return self._context

    def still_holds(self):
        """True when every place this walk read still holds the object it found there."""
        if self.single_use or self.eager:
            return False
        return _tdstore._walk_checks_hold(self.attrs, self.globals, self.cells, self.dicts,
                                          self.lists, _MISSING)

    def _attr(self, o, name):
        """o.name (or _MISSING), checked."""
        x = getattr(o, name, _MISSING)
        self.attrs.append((o, name, x))
        return x

    def _module_attr(self, m, name, plain):
        """m.name (or _MISSING), checked. `plain`: m is a plain module without a module
        __getattr__ (checked once by the caller), which answers from its __dict__ unless its
        type has the name: checked there, as a global is, with no AttributeError raised when
        the name is absent."""
        if plain and not hasattr(types.ModuleType, name):
            x = m.__dict__.get(name, _MISSING)
            self.globals.append((m.__dict__, name, x))
            return x
        return self._attr(m, name)

    def _plain_module(self, m):
        """Whether m's attributes are its __dict__'s entries: a plain module without a module
        __getattr__ (that it still has none is checked)."""
        self._attr(m, "__class__")  # a module's class can be switched to one with properties
        if type(m) is not types.ModuleType:
            return False
        hook = m.__dict__.get("__getattr__", _MISSING)
        self.globals.append((m.__dict__, "__getattr__", hook))
        return hook is _MISSING

    def _enter(self, v):
        """False (and a back-reference fact) when v was visited already."""
        hit = self.seen.get(id(v))
        if hit is not None:
            self.facts.append(f"@{hit[0]}")
            return False
        self.seen[id(v)] = (len(self.seen), v)  # v kept alive for the walk: ids stay unique
        return True

    def value(self, v, depth, names=None):
        """names: the names the referring code uses, to select attributes of modules. Each kind
        of value has its handler: by exact type first (_BY_TYPE, the common cases), then the
        first of _BY_KIND whose class v is an instance of, then numpy's, then any object."""
        self.nodes += 1
        if depth > _MAX_DEPTH or self.nodes > _MAX_NODES:
            self.eager = self.eager or "it reaches more objects than the compile walk follows"
            return
        handler = _BY_TYPE.get(id(type(v)))  # by identity: a metaclass's __eq__ never answers
        if handler is None:
            handler = next((h for kind, h in _BY_KIND if isinstance(v, kind)), None)
        if handler is None:
            handler = _numpy_handler(v) or Walk._object
        handler(self, v, depth, names)

    # Handlers: each fact unambiguous by its form.
    def _str(self, v, depth, names):
        self.facts.append(repr(v))

    def _bool_or_none(self, v, depth, names):
        self.facts.append(str(v))

    def _int(self, v, depth, names):
        self.facts.append(f"i{v}")

    def _float(self, v, depth, names):
        self.facts.append(f"f{v!r}")

    def _scalar(self, v, depth, names):  # the other _SCALARS: complex, bytes, dtypes, ...
        self.facts.append(f"{type(v).__name__}:{v!r}")

    def _immutable(self, v, depth, names):
        self.facts.append(f"{type(v).__name__}:{v!r}")

    def _tensor(self, v, depth, names):
        i = self.tensor_index.get(id(v))
        if i is None:
            i = self.tensor_index[id(v)] = len(self.tensors)
            self.tensors.append(v)
        self.facts.append(f"T{i}")

    def _dict(self, v, depth, names):
        t = type(v)
        if not v:
            self.dicts.append((v, (), ()))
            self.facts.append(f"{t.__qualname__}{{}}")
            return
        if not self._enter(v):
            return
        items = list(v.items())
        self.dicts.append((v, tuple(k for k, _ in items), tuple(x for _, x in items)))
        self.facts.append(f"{t.__module__}.{t.__qualname__}{{{len(items)}")
        for k, x in items:
            if type(k) is str:
                self.facts.append(repr(k))
            else:
                self.value(k, depth + 1)
            self.value(x, depth + 1, names)
        self.facts.append("}")

    def _sequence(self, v, depth, names):  # tuples, lists, torch.Size and their subclasses
        if not self._enter(v):
            return
        if not isinstance(v, tuple):
            self.lists.append((v, tuple(v)))
        t = type(v)
        self.facts.append(f"{t.__module__}.{t.__qualname__}[{len(v)}")
        for x in v:
            self.value(x, depth + 1, names)
        self.facts.append("]")

    def _set(self, v, depth, names):  # sets, frozensets, deques
        if not self._enter(v):
            return
        t = type(v)
        if t is not frozenset:
            self.lists.append((v, tuple(v)))  # the same elements, found in the same order
        self.facts.append(f"{t.__module__}.{t.__qualname__}[{len(v)}")
        for x in v:  # the elements themselves: their state is read too
            self.value(x, depth + 1, names)
        self.facts.append("]")

    def _mappingproxy(self, v, depth, names):
        if self._enter(v):
            self.facts.append("mappingproxy")
            self.value(gc.get_referents(v)[0], depth + 1, names)  # the mapping it shows

    def _slice(self, v, depth, names):
        self.facts.append("slice")
        for x in (v.start, v.stop, v.step):
            self.value(x, depth + 1)

    def _contextvar(self, v, depth, names):
        self.single_use = True  # its value depends on the context it is read in
        self.facts.append(f"contextvar:{v.name}")
        self.value(v.get(_MISSING), depth + 1, names)

    def _function(self, v, depth, names):
        if self._enter(v):
            self.function(v, depth)

    def _method(self, v, depth, names):
        if self._enter(v):
            self.facts.append("method")
            self.value(v.__self__, depth + 1)
            self.value(v.__func__, depth + 1)

    def _partial(self, v, depth, names):
        if self._enter(v):
            self.facts.append("partial")
            self.value(self._attr(v, "func"), depth + 1)
            self.value(self._attr(v, "args"), depth + 1)
            self.value(self._attr(v, "keywords"), depth + 1)

    def _module(self, v, depth, names):
        self.facts.append(f"module:{v.__name__}")
        if names and self._enter(v):
            plain = self._plain_module(v)
            if not plain:
                self.cls(type(v), depth)  # a module subclass: its properties run
            for n in names:
                a = self._module_attr(v, n, plain)
                if a is not _MISSING and a is not None and not isinstance(a, types.ModuleType):
                    self.facts.append(n)
                    self.value(a, depth + 1)

    def _class(self, v, depth, names):
        self.cls(v, depth)

    def _builtin(self, v, depth, names):
        owner = getattr(v, "__self__", None)
        self.facts.append(
            f"builtin:{getattr(v, '__module__', None)}.{getattr(v, '__qualname__', '?')}")
        if owner is not None and not isinstance(owner, types.ModuleType):
            self.value(owner, depth + 1)

    def _opaque(self, v, depth, names):
        self.eager = self.eager or (
            f"it captures a tdstore.{type(v).__name__} (its tensors would be constants of the "
            "graph); read them from the dict the function is called with")

    def _ndarray(self, v, depth, names):
        self.single_use = True  # its contents change in place
        if v.nbytes > _MAX_ARRAY_BYTES or v.dtype.hasobject:
            self.eager = self.eager or ("it captures a numpy array too large (or of objects) "
                                        "to digest per call; capture it as a tensor")
        else:
            self.facts.append(f"ndarray:{v.dtype.str}:{v.shape}:"
                              + hashlib.blake2b(v.tobytes(), digest_size=16).hexdigest())

    def _numpy_scalar(self, v, depth, names):
        self.facts.append(f"numpy:{type(v).__name__}:{v!r}")

    def _object(self, v, depth, names):
        """Any other object: its class, then its __dict__ or slots."""
        if not self._enter(v):
            return
        t = type(v)
        self._attr(v, "__class__")
        self.facts.append("object")
        self.cls(t, depth)
        attrs = self._attr(v, "__dict__")
        if attrs is not _MISSING and attrs is not None:
            self.value(attrs, depth + 1)
        elif not t.__flags__ & _HEAPTYPE and t is not object and not _slot_names(t):
            # A C type whose state is neither a __dict__ nor slots (a deque, an array, an
            # iterator, a weak reference...): what it holds cannot be read here.
            self.eager = self.eager or (
                f"it reaches a {t.__module__}.{t.__qualname__}, whose contents the compile "
                "walk cannot read (pass what the function needs as a tensor, a number or a "
                "plain container)")
        for slot in _slot_names(t):
            x = self._attr(v, slot)
            if x is not _MISSING:
                self.facts.append(slot)
                self.value(x, depth + 1)

    def cls(self, c, depth):
        """A class: its code digest; a class defined outside the library also member by member
        (functions, properties, class attributes) through each class of its MRO, each of whose
        dicts is checked whole, so a member added, replaced or reassigned is seen."""
        if not self._enter(c):
            return
        digest = _class_digest(c)
        self.code.add(digest)
        self.facts.append(f"class:{c.__module__}.{c.__qualname__}:{digest}")
        if not is_user_class(c):
            return
        self.attrs.append((c, "__mro__", c.__mro__))  # __bases__ reassigned changes it
        for k in c.__mro__:
            if k is object or not is_user_class(k):
                continue
            members = _type_dict(k)
            self.dicts.append((members, tuple(members), tuple(members.values())))
            self.facts.append(f"members:{k.__qualname__}")
            for name, member in members.items():
                if name in _CLASS_BOOKKEEPING:
                    continue
                self.facts.append(repr(name))
                self.value(_unwrapped(member), depth + 1)

    def function(self, fn, depth):
        code = self._attr(fn, "__code__")
        digest = _code_digest(code)
        self.code.add(digest)
        self.codes.update(_nested_codes(code))
        self.facts.append(f"fn:{digest}")
        self.value(self._attr(fn, "__defaults__"), depth + 1)
        self.value(self._attr(fn, "__kwdefaults__"), depth + 1)
        attrs = self._attr(fn, "__dict__")  # attributes set on the function object
        if attrs:
            self.value(attrs, depth + 1)
        names = code_names(code)  # also selects the attributes of a module it captures
        for cell in fn.__closure__ or ():  # the tuple of cells is fixed; their contents are not
            x = _cell(cell)
            self.cells.append((cell, x))
            if x is _MISSING:
                self.facts.append("<empty cell>")
            else:
                self.value(x, depth + 1, names)
        g = fn.__globals__  # fixed for a function; the dict's items are checked per name
        for n in names:
            x = g.get(n, _MISSING)
            self.globals.append((g, n, x))
            if x is not _MISSING:
                self.facts.append(f"global:{n}")
                self.value(x, depth + 1, names)


# Walk.value's handlers. By exact type: the common cases, and the other _SCALARS. Keyed by the
# type's id (these types live as long as the interpreter), so a class whose metaclass defines
# __eq__ or __hash__ can neither raise here nor pass for one of them.
_BY_TYPE = {id(t): Walk._scalar for t in _SCALARS}
_BY_TYPE.update({id(t): h for t, h in (
    (str, Walk._str), (bool, Walk._bool_or_none), (type(None), Walk._bool_or_none),
    (int, Walk._int), (float, Walk._float), (tuple, Walk._sequence), (list, Walk._sequence),
    (torch.Size, Walk._sequence), (types.MappingProxyType, Walk._mappingproxy),
    (slice, Walk._slice), (contextvars.ContextVar, Walk._contextvar),
)})
# Then by kind, in order: the first whose class a value is an instance of.
_BY_KIND = (
    (torch.Tensor, Walk._tensor),
    (dict, Walk._dict),
    ((tuple, list), Walk._sequence),
    ((set, frozenset, collections.deque), Walk._set),
    (_IMMUTABLE, Walk._immutable),
    (types.FunctionType, Walk._function),
    (types.MethodType, Walk._method),
    (functools.partial, Walk._partial),
    (types.ModuleType, Walk._module),
    (type, Walk._class),
    (_BUILTIN_CALLABLES, Walk._builtin),
    (_OPAQUE, Walk._opaque),
)


def _numpy_handler(v):
    """A numpy array's or scalar's handler (numpy is not imported for it), else None."""
    t = type(v)
    if t.__module__ != "numpy":
        return None
    if t.__name__ == "ndarray":
        return Walk._ndarray
    if hasattr(v, "item") and not hasattr(v, "__dict__"):
        return Walk._numpy_scalar
    return None


def walk(*targets):
    """A walk of each target in turn (the graph inputs given first, then the function)."""
    w = Walk()
    for t in targets:
        w.value(t, 0)
    return w
