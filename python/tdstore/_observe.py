"""What a compiled function's recording run did that a trace cannot replay or a guard cannot see.

On a miss the engine runs the function eagerly (the recording run), then under the tracer. A
TorchScript trace holds tensor operations only, so everything else the recording run does or
reads must either be guarded (tdstore._walk) or make the entry run eagerly. RecordingWatch
watches the recording run and names the first thing of the latter kind:

- every torch operation (a TorchFunctionMode):
  - the ambient state (grad mode, inference mode, autocast, default dtype, deterministic
    algorithms) must be the call's own at every operation and after the call: a `no_grad` or
    `enable_grad` block, a `@torch.no_grad()` helper, `inference_mode` or `set_default_dtype`
    inside the body are not in a trace;
  - an operation whose result is not tensors (`item()`, `bool()`, `tolist()`, `data_ptr()`,
    `register_hook()`...) and is not one of a tensor's guarded properties (sizes, dtype...)
    hands a value to Python that a trace would bake in;
  - setting a tensor's attribute (`.grad = None`, `requires_grad_()`) is not in a trace;
- every C function called from code outside torch (sys.setprofile): one known to be free of
  effects and hidden reads runs (builtins such as len, methods of containers, math, torch);
  a random generator seeded or set, autograd run (`backward`, `autograd.grad`) and any other
  C function (I/O, `time`, `random`, a C extension) make the entry eager;
- every Python frame (sys.settrace): code outside the library (tdstore._walk.LIBRARY_DIRS) must
  be code the compile walk reached (Walk.codes), or what it reads is unguarded; the instructions
  it runs are kept (`path`) and TracingWatch compares them with the trace's run, where a branch
  on `torch.jit.is_tracing()` (or on anything the tracer changes) takes another path.

TracingWatch also keeps every tensor the traced run's operations made (`made`, literals such
as `torch.tensor([...])` included): the engine refuses a trace holding any other tensor as a
constant, which is a tensor read from a place no guard covers (`p.grad`, a tensor in an opaque
container, a cast autocast cached during the eager run).
"""
import math
import operator
import os
import sys
import threading
import weakref

import torch
from torch.overrides import TorchFunctionMode

from tdstore._walk import is_library_file

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


_active = threading.local()


def watching():
    """Whether a watch runs on this thread (a compiled function called inside another's body
    runs plainly: the outer watch sees it)."""
    return getattr(_active, "on", False)


def ambient():
    """The state of libtorch a trace does not hold (the engine guards it per call)."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
            torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype(),
            torch.is_autocast_enabled(), torch.get_default_dtype(),
            torch.are_deterministic_algorithms_enabled())


_AMBIENT_NAMES = ("grad mode", "inference mode", "CPU autocast", "CPU autocast dtype", "autocast",
                  "default dtype", "deterministic algorithms")

# Operations returning something other than tensors that read only what the guard holds of a
# tensor (its spec) or nothing of its values.
_SPEC_READS = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "stride", "shape", "dtype", "device",
    "layout", "is_contiguous", "is_floating_point", "is_complex", "is_signed", "requires_grad",
    "is_leaf", "element_size", "ndim", "is_sparse", "is_quantized", "is_meta", "is_cuda",
    "is_cpu", "is_mkldnn", "is_inference", "is_nested", "names", "grad_fn", "__len__",
    "__iter__", "__hash__", "is_tensor", "get_device", "output_nr", "type", "is_shared",
    "is_pinned", "__get__", "__reduce_ex__", "has_names",
})
_TENSOR_SETTERS = frozenset({"__set__", "__delete__", "requires_grad_", "retain_grad",
                             "register_hook", "share_memory_", "_backward_hooks"})

# C functions that read nothing but their arguments and change nothing but what they are
# handed (a container method mutating a walked container is seen by the walk's checks).
_PURE_BUILTINS = frozenset({
    "abs", "all", "any", "ascii", "bin", "callable", "chr", "divmod", "format", "getattr",
    "hasattr", "hash", "hex", "id", "isinstance", "issubclass", "iter", "len", "max", "min",
    "next", "oct", "ord", "pow", "repr", "round", "sorted", "sum", "setattr", "delattr", "vars",
    "dir", "aiter", "anext",
})
_PURE_MODULES = frozenset({"math", "cmath", "_operator", "operator", "itertools", "_functools",
                           "functools", "_collections", "_abc", "_weakref", "_string", "_struct",
                           "_bisect", "_heapq", "_json", "copy", "_copy", "_contextvars"})
_PURE_OWNERS = (list, dict, set, frozenset, tuple, str, bytes, bytearray, int, float, complex,
                bool, type(None), range, slice, torch.Size, torch.Tensor, weakref.ref,
                type(math), type(operator.add))
_GENERATOR_SETTERS = frozenset({"manual_seed", "seed", "set_state"})
_AUTOGRAD_RUNS = frozenset({"run_backward", "queue_callback"})


def _name(func):
    return getattr(func, "__name__", None) or type(func).__name__


def _tensors(value, out):
    """Appends the tensors in value (nested tuples, lists and dicts) to out."""
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (tuple, list)):
        for v in value:
            _tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors(v, out)
    return out


def _only_tensors(value):
    if value is None or isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)) and not isinstance(value, torch.Size):
        return all(_only_tensors(v) for v in value)
    return False


def _c_call_effect(func, frame):
    """Why calling C function `func` from `frame` is an effect or a read no guard sees, or None."""
    owner = getattr(func, "__self__", None)
    name = _name(func)
    if isinstance(owner, torch.Generator) and name in _GENERATOR_SETTERS:
        return f"seeds or sets a random generator ({name}: torch.manual_seed, set_rng_state...)"
    if name in _AUTOGRAD_RUNS and type(owner).__name__ == "_EngineBase":
        return "runs autograd (backward() or torch.autograd.grad: a trace holds no backward pass)"
    if frame is not None and frame.f_code.co_filename.startswith((_TORCH_DIR, _HERE)):
        return None  # torch's own code: what it reads is what it is handed
    module = getattr(func, "__module__", None) or getattr(owner, "__name__", None)
    if isinstance(owner, type(sys)):
        if owner.__name__ == "builtins":
            return None if name in _PURE_BUILTINS else f"calls {name}() (I/O or a hidden read)"
        if owner.__name__ in _PURE_MODULES or owner.__name__.startswith("torch"):
            return None
    elif owner is None or isinstance(owner, _PURE_OWNERS):
        if owner is not None or (module or "").startswith("torch") or module in _PURE_MODULES:
            return None
    elif type(owner).__module__.startswith("torch"):
        return None
    where = module or type(owner).__module__
    return (f"calls {where}.{getattr(func, '__qualname__', name)}, a C function whose effects "
            "and reads the compile cannot see")


class _OpWatch(TorchFunctionMode):
    """Every torch operation of the recording run (module docstring)."""

    def __init__(self, watch):
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        w = self.watch
        if w.reason is None:
            w.check_ambient(f"{_name(func)}()")
        name = _name(func)
        result = func(*args, **kwargs)
        if w.reason is None:
            owner = getattr(getattr(func, "__self__", None), "__name__", None)
            if name in _TENSOR_SETTERS:
                w.reason = f"sets {owner or name} of a tensor (not in a trace)"
            elif not _only_tensors(result) and name not in _SPEC_READS:
                w.reason = (f"{name}() of a tensor (its value or where its bytes are, read into "
                            "Python: a trace bakes it in)")
        return result


class _MadeWatch(TorchFunctionMode):
    """Keeps the tensors the operations of a run make (TracingWatch.made)."""

    def __init__(self, made):
        super().__init__()
        self.made = made

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if _name(func) != "__get__":  # an attribute read (p.grad) hands out a tensor, makes none
            _tensors(result, self.made)
        return result


class RecordingWatch:
    """Watches a recording run (module docstring). `reason` is the first effect or unguarded
    read found (None: none); `codes` the code objects outside the library the run executed, with the first line each
    ran; `path` the (code, instruction offset) steps of that code, in order."""

    def __init__(self):
        self.reason = None
        self.codes = {}
        self.path = []
        self._state = ambient()
        self._mode = _OpWatch(self)
        self._saved = None

    def check_ambient(self, where):
        now = ambient()
        if now != self._state:
            which = next(n for n, a, b in zip(_AMBIENT_NAMES, now, self._state) if a != b)
            self.reason = (f"switches the {which} inside the function (at {where}; a trace "
                           "holds only the call's own)")

    def _profile(self, frame, event, arg):
        if event == "c_call" and self.reason is None:
            self.reason = _c_call_effect(arg, frame)

    def _trace(self, frame, event, arg):
        code = frame.f_code
        if is_library_file(code.co_filename):
            return None
        self.codes.setdefault(code, frame.f_lineno)
        frame.f_trace_opcodes = True
        return self._step

    def _step(self, frame, event, arg):
        if event == "opcode":
            self.path.append((frame.f_code, frame.f_lasti))
        return self._step

    def __enter__(self):
        self._saved = (sys.gettrace(), sys.getprofile())
        _active.on = True
        self._mode.__enter__()
        sys.settrace(self._trace)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._saved[1])
        sys.settrace(self._saved[0])
        self._mode.__exit__(*exc)
        _active.on = False
        if self.reason is None:
            self.check_ambient("its return")
        return False

    def unreached(self, walked_codes):
        """Why the run executed code the compile walk does not reach (so its reads are not
        guarded), or None."""
        for code, line in self.codes.items():
            if code not in walked_codes:
                return (f"runs {code.co_qualname} ({code.co_filename}:{line}), which the compile "
                        "walk does not reach from the function (its reads would not be guarded)")
        return None


class TracingWatch:
    """The instructions code outside the library runs in the tracing run (`path`), to compare
    with the recording run's, and the tensors its operations made (`made`)."""

    def __init__(self):
        self.path = []
        self.made = []
        self._mode = _MadeWatch(self.made)
        self._saved = None

    def _trace(self, frame, event, arg):
        if is_library_file(frame.f_code.co_filename):
            return None
        frame.f_trace_opcodes = True
        return self._step

    _step = RecordingWatch._step

    def __enter__(self):
        self._saved = sys.gettrace()
        _active.on = True
        self._mode.__enter__()
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._saved)
        self._mode.__exit__(*exc)
        _active.on = False
        return False
