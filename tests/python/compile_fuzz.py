"""A differential fuzzer for tdstore.compile: a compiled call must return what eager returns.

Csmith-style: from a seed, `generate` writes a small Python program (source text) out of random
*fragments*, each an idiom PyTorch users write (GROUPS: globals of many types, helpers, methods,
properties, slots, closures, partials, nn.Modules, grad/autocast contexts, RNG, backward and
optimizer steps, prints, in-place updates, dict reads and writes), and a *schedule* of calls and
of mutations between them (rebind or mutate what a fragment reads, train()/eval(), an optimizer
step outside; per call other input values, batch size or keys, and the ambient grad mode,
autocast, default dtype or inference mode). `mismatch_of` runs the source twice (separate but
identical objects, same seeds), compiles one side's `f` (or nn.Module `m`), calls the other
eagerly from the same RNG state on identical fresh dicts, and after every call compares (`diff`):
the outcome (returned, or the exception's type); the value returned (structure, dtype, shape,
requires_grad, inference, values); the input dict's keys and values; the `state` of every object
the program defines (tensors and their .grad, parameters, buffers, training flags, optimizer
state, containers, objects); torch's global RNG state; what the call printed.

Tensors compare bit-exactly, except floating ones, which may differ by 4 ulps of their dtype at
the tensor's scale: a graph's kernels and autodiff formulas may round differently from eager
(on CPU libtorch 1.13 none did: 32,000 comparisons of a run on graphs were all bit-exact).
The compiled side may run the body twice on a miss; it must still leave eager's results and
effects. Every --persist-every-th program runs a second time with fresh namespaces and a new
compiled object on the same graph store (its mutations applied first), so graphs are loaded.

On a mismatch, `Shrinker.classify` drops fragments, the module target and persistence while the
same kind of difference remains; the class (kind, categories) seen first is minimized further
(`Shrinker.shrink`) and written to --repro-dir as a self-contained script failing as it fails.
Categories are the fragments' tags; LIMITS names those the README or compile.h documents as a
limit (it runs eagerly or bakes the value in): they are checked alike and reported as such.
stats() (graph, traced, loaded, eager) is reported per category as information only.

    /usr/bin/python3 tests/python/compile_fuzz.py --seconds 600   # or --count N, --seed S
"""
import argparse
import collections
import contextlib
import contextvars
import dataclasses
import inspect
import io
import os
import random
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import types
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The build tree's package, unless TDSTORE_PYTHONPATH names another ("installed": the importable one).
PKG_PATH = os.environ.get("TDSTORE_PYTHONPATH", os.path.join(ROOT, "build", "python"))
if os.path.isdir(PKG_PATH) and PKG_PATH not in sys.path:
    sys.path.insert(0, PKG_PATH)

import torch  # noqa: E402

import tdstore  # noqa: E402

# category -> the documented limit of tdstore.compile (README, "What a trace cannot replay runs
# eagerly"). Every idiom the grammar generates is guarded or sent to eager: none is a limit. What
# the README leaves unguarded (library state such as global module hooks, a weak reference's
# referent) is not generated.
LIMITS = {}

# ================================================================== the program generator

# A fragment is (categories, setup, body, mutations): module-level setup source, body lines of
# f that set out["o$"] (x is td["x"], float32 [n, 4]), and mutations applied between calls.
# '$' becomes _<fragment index>; {v} {w} are two different floats, {i} {j} ints, {s} {t} seeds.
Frag = collections.namedtuple("Frag", "cats setup body muts")
_NET = ("GM$ = {v}\nclass Net$(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = nn.Linear(4, 3)\n        self.w = nn.Parameter(torch.randn(3))\n"
        '        self.register_buffer("b", torch.zeros(3))\n        self.drop = nn.Dropout(@P)\n'
        "        self.scale = 1.0\n    def forward(self, y):\n"
        "        return (self.drop(self.lin(y)) * self.w + self.b * self.scale)TAIL\n"
        "net$ = Net$()\nnet$.eval()\nopt$ = torch.optim.SGD(net$.parameters(), lr=0.1, momentum=0.9)")
_NET_MUTS = ["net$.train()", "net$.eval()", "net$.scale = {w}",
             "with torch.no_grad():\n    net$.lin.weight.mul_(0.5)\n    net$.b.add_(1.0)",
             "opt$.zero_grad()\nnet$(torch.ones(2, 4)).sum().backward()\nopt$.step()"]
_W = "W$ = torch.randn(4, 3, requires_grad=True)"
_WMUT = ["with torch.no_grad():\n    W$.mul_(2.0)"]
_LOSS = "W$ = torch.randn(4, 1, requires_grad=True)"
_CTX = 'with {}:\n    y$ = x @ W$\nout["o$"] = y$'
GROUPS = [  # one group per idiom; a fragment is a random variant of a random group
    [("global_scalar", "G$ = {v}", 'out["o$"] = x * G$', ["global G$; G$ = {w}"]),
     ("global_scalar", "G$ = {i}", 'out["o$"] = x[:, :1 + G$ % 4] + G$', ["global G$; G$ = {j}"]),
     ("global_scalar", "G$ = True", 'out["o$"] = x.relu() if G$ else x.abs()', ["global G$; G$ = not G$"]),
     ("global_scalar", 'G$ = "sum"', 'out["o$"] = x.sum(1) if G$ == "sum" else x.amax(1)',
      ['global G$; G$ = "max" if G$ == "sum" else "sum"'])],
    [("global_container", "G$ = ({v}, 1.0)", 'out["o$"] = x * G$[0] + G$[1]', ["global G$; G$ = ({w}, 1.0)"]),
     ("global_container", "G$ = [{v}]", 'out["o$"] = x * sum(G$)',
      ["G$[0] = {w}", "G$.append(1.0)", "global G$; G$ = [{w}]"]),
     ("global_container", 'G$ = {{"a": {v}}}', 'out["o$"] = x * G$["a"] + G$.get("b", 0.0)',
      ['G$["a"] = {w}', 'G$["b"] = 1.0'])],
    [("slice_global", "S$ = slice(0, 2)", 'out["o$"] = x[:, S$] * 2',
      ["global S$; S$ = slice(1, 4)", "global S$; S$ = slice(0, 4, 2)"]),
     ("range_global", "R$ = range(1, 3)", 'out["o$"] = x * sum(R$)',
      ["global R$; R$ = range(2, 5)", "global R$; R$ = range(0, 2)"])],
    [("deque", "D$ = collections.deque([{v}, 1.0], maxlen=3)", 'out["o$"] = x * D$[0] + D$[-1]',
      ["D$.append({w})", "D$.rotate(1)", "D$[0] = {w}"])],
    [("mappingproxy", 'MB$ = {{"a": {v}}}\nM$ = types.MappingProxyType(MB$)', 'out["o$"] = x * M$["a"]',
      ['MB$["a"] = {w}'])],
    [("contextvar", 'CV$ = contextvars.ContextVar("cv$", default={v})', 'out["o$"] = x * CV$.get()',
      ["CV$.set({w})"])],
    [("set_elements", "class It$:\n    def __init__(self, v):\n        self.v = v\n"
      "SET$ = {{It$({v}), It$(1.0)}}", 'out["o$"] = x * max(i.v for i in SET$)', ["for i in SET$:\n    i.v += {w}"]),
     ("set_elements", "class It$:\n    def __init__(self, v):\n        self.v = v\n"
      "SET$ = frozenset([It$({v})])", 'out["o$"] = x * min(i.v for i in SET$)', ["for i in SET$:\n    i.v = {w}"]),
     ("set_strings", 'FL$ = {{"neg"}}', 'out["o$"] = -x if "neg" in FL$ else x * 2',
      ['FL$.discard("neg")', 'FL$.add("neg")'])],
    [("tensor_global", "T$ = torch.randn(4)", 'out["o$"] = x * T$',
      ["T$.mul_({v})", "global T$; T$ = torch.randn(4)", "T$[0] = 7.0"]),
     ("tensor_global", "T$ = torch.randn(4, 3, requires_grad=True)", 'out["o$"] = x @ T$',
      ["with torch.no_grad():\n    T$.mul_({v})", "global T$; T$ = torch.randn(4, 3, requires_grad=True)"])],
    [("helper_global", "K$ = {v}\ndef h$(y):\n    return y * K$", 'out["o$"] = h$(x)', ["global K$; K$ = {w}"])],
    [("fn_attr", "def h$(y):\n    return y * h$.scale\nh$.scale = {v}", 'out["o$"] = h$(x)', ["h$.scale = {w}"])],
    [("method_global", "K$ = {v}\nclass C$:\n    base = 1.0\n    def k(self):\n        return K$ * self.base\n"
      "obj$ = C$()", 'out["o$"] = x * obj$.k()', ["global K$; K$ = {w}", "obj$.base = {w}"]),
     ("property_global", "K$ = {v}\nclass C$:\n    base = 1.0\n    @property\n    def k(self):\n"
      "        return K$ * self.base\nobj$ = C$()", 'out["o$"] = x * obj$.k', ["global K$; K$ = {w}", "obj$.base = {w}"])],
    [("class_attr", "class C$:\n    scale = {v}\nobj$ = C$()", 'out["o$"] = x * obj$.scale', ["C$.scale = {w}"])],
    [("slots", 'class S$:\n    __slots__ = ("scale", "shift")\ns$ = S$()\ns$.scale = {v}\ns$.shift = 1.0',
      'out["o$"] = x * s$.scale + s$.shift', ["s$.scale = {w}", "s$.shift = {w}"]),
     ("slots_base", 'class B$:\n    __slots__ = ("scale",)\nclass S$(B$):\n    __slots__ = ("shift",)\n'
      "s$ = S$()\ns$.scale = {v}\ns$.shift = 1.0", 'out["o$"] = x * s$.scale + s$.shift',
      ["s$.scale = {w}", "s$.shift = {w}"]),
     ("slots_str", 'class S$:\n    __slots__ = "scale"\ns$ = S$()\ns$.scale = {v}', 'out["o$"] = x * s$.scale',
      ["s$.scale = {w}"])],
    [("plain_object", "@dataclasses.dataclass\nclass Cfg$:\n    k: float = {v}\ncfg$ = Cfg$()",
      'out["o$"] = x * cfg$.k', ["cfg$.k = {w}"]),
     ("plain_object", "cfg$ = types.SimpleNamespace(k={v})", 'out["o$"] = x * cfg$.k', ["cfg$.k = {w}"])],
    [("closure", "def make$():\n    k = [{v}]\n    def g(y):\n        return y * k[0]\n    return g, k\n"
      "g$, cell$ = make$()", 'out["o$"] = g$(x)', ["cell$[0] = {w}"]),
     ("closure", "def make$():\n    k = {v}\n    def g(y):\n        return y * k\n    def s(a):\n"
      "        nonlocal k\n        k = a\n    return g, s\ng$, set$ = make$()", 'out["o$"] = g$(x)', ["set$({w})"])],
    [("partial", "def sc$(a, y):\n    return y * a\np$ = functools.partial(sc$, {v})", 'out["o$"] = p$(x)',
      ["global p$; p$ = functools.partial(sc$, {w})"])],
    [("default_arg", "def h$(y, s={v}):\n    return y * s", 'out["o$"] = h$(x)', ["h$.__defaults__ = ({w},)"]),
     ("default_arg", "def h$(y, s=[{v}]):\n    return y * s[0]", 'out["o$"] = h$(x)',
      ["h$.__defaults__[0][0] = {w}"])],
    [("numpy_global", "A$ = np.array([{v}, 1.0], dtype=np.float32)", 'out["o$"] = x * float(A$[0])',
      ["A$[0] = {w}", "global A$; A$ = np.array([{w}, 2.0], dtype=np.float32)"]),
     ("captured_tensordict", 'TD$ = tdstore.TensorDict({{"m": torch.full((4,), {v})}}, batch_size=[])',
      'out["o$"] = x * TD$["m"]', ['TD$["m"] = torch.full((4,), {w})'])],
    [("module_attr", 'mod$ = types.ModuleType("mod$")\nmod$.K = {v}', 'out["o$"] = x * mod$.K', ["mod$.K = {w}"])],
    [("nn_module", _NET.replace("TAIL", "").replace("@P", "0.0"), 'out["o$"] = net$(x)', _NET_MUTS),
     ("nn_module dropout", _NET.replace("TAIL", "").replace("@P", "0.5"), 'out["o$"] = net$(x)', _NET_MUTS),
     ("nn_module module_forward_global", _NET.replace("TAIL", " * GM$").replace("@P", "0.0"),
      'out["o$"] = net$(x)', _NET_MUTS + ["global GM$; GM$ = {w}"])],
    [("no_grad_block", _W, _CTX.format("torch.no_grad()"), _WMUT),
     ("no_grad_helper", _W + "\n@torch.no_grad()\ndef h$(y):\n    return y @ W$", 'out["o$"] = h$(x)', _WMUT),
     ("enable_grad_block", _W, _CTX.format("torch.enable_grad()"), _WMUT),
     ("inference_block", _W, _CTX.format("torch.inference_mode()"), _WMUT),
     ("autocast_block", _W, _CTX.format('torch.autocast("cpu")'), _WMUT),
     ("set_grad_enabled", _W + "\nGE$ = False", _CTX.format("torch.set_grad_enabled(GE$)"),
      _WMUT + ["global GE$; GE$ = not GE$"])],
    [("manual_seed", "SEED$ = {s}", 'torch.manual_seed(SEED$)\nout["o$"] = x + torch.rand(4)',
      ["global SEED$; SEED$ = {t}"]),
     ("rand_body", "", 'out["o$"] = x + torch.randn(x.shape[0], 4)', []),
     ("dropout", "", 'out["o$"] = F.dropout(x, p=0.5, training=True)', [])],
    [("backward_body", _LOSS, 'loss$ = (x @ W$).pow(2).mean()\nloss$.backward()\nout["o$"] = loss$.detach()', []),
     ("autograd_grad", _LOSS, 'out["o$"], = torch.autograd.grad((x @ W$).pow(2).mean(), W$)', []),
     ("optimizer_step_body", _LOSS + "\nopt$ = torch.optim.SGD([W$], lr=0.1, momentum=0.9)",
      'opt$.zero_grad()\nloss$ = (x @ W$).pow(2).mean()\nloss$.backward()\nopt$.step()\nout["o$"] = loss$.detach()',
      [])],
    [("grad_read", "W$ = torch.randn(4, requires_grad=True)\n(W$ * {v}).sum().backward()",
      'out["o$"] = x * W$.grad', ["(W$ * {w}).sum().backward()", "W$.grad.zero_()", "W$.grad = torch.full((4,), {w})"])],
    [("list_append", "LOG$ = []", 'LOG$.append(x.shape[0])\nout["o$"] = x + len(LOG$)', []),
     ("print", "", 'print("o$", x.shape[0])\nout["o$"] = x * 2', []),
     ("inplace_input", "", 'td["y"].add_(1.0)\nout["o$"] = td["y"] * 2', []),
     ("inplace_captured", "T$ = torch.zeros(4)", 'T$.add_(x.sum(0))\nout["o$"] = T$ * 1', ["T$.zero_()"])],
    [("tensor_literal", "", 'out["o$"] = x * torch.tensor([{v}, {w}, 1.0, 0.5])', []),
     ("tensor_literal global_scalar", "K$ = {v}", 'out["o$"] = x * torch.tensor([K$, 1.0, 1.0, K$])',
      ["global K$; K$ = {w}"])],
    [("shape_branch", "", 'out["o$"] = x.sum(1) if x.shape[0] > 6 else x.mean(1)', []),
     ("is_tracing", "", 'out["o$"] = x * 2.0 if torch.jit.is_tracing() else x * 3.0', []),
     ("is_tracing", "", 'if torch.jit.is_tracing():\n    out["o$"] = x * 2.0\nelse:\n    out["o$"] = x * 3.0', []),
     ("item", "", 's$ = x.sum().item()\nout["o$"] = x * s$', []),
     ("item", "", 'out["o$"] = x * 2 if x.sum() > 0 else x * 3', []),
     ("len_td", "", 'out["o$"] = x / len(td)', [])],
    [("dict_get", "", 'm$ = td.get("mask", None)\nout["o$"] = x * m$ if m$ is not None else x + 1', []),
     ("dict_contains", "", 'out["o$"] = x * td["mask"] if "mask" in td else x - 1', []),
     ("dict_keys", "", 'out["o$"] = x + sum((td[k] for k in td.keys() if k.startswith("noise")), torch.zeros(4))', []),
     ("dict_keyerror", "", 'out["o$"] = x * td["mask"]', []),
     ("dict_keyerror", "", 'try:\n    m$ = td["mask"]\nexcept KeyError:\n    m$ = 2.0\nout["o$"] = x * m$', []),
     ("sub_dict", "", 'out["o$"] = td["sub"]["y"] * 2 + td["sub/y"]', []),
     ("dict_write", "", 'td["w$"] = x * 2\ntd["sub/w$"] = x + 1\nout["o$"] = td["w$"]', [])],
]
HEADER = ("import collections, contextvars, dataclasses, functools, types\nimport numpy as np\n"
          "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\nimport tdstore\n")


def fragment(r, variant=None):
    """A fragment of `variant` (by default a random variant of a random group), its numbers
    drawn from r."""
    cats, setup, body, muts = variant or r.choice(r.choice(GROUPS))
    v, w = r.sample([0.5, 1.5, 2.0, 2.5, 3.0, -1.0, -0.5, 4.0], 2)
    (i, j), (s, t) = r.sample(range(1, 8), 2), r.sample(range(100), 2)
    fill = lambda src: src.format(v=v, w=w, i=i, j=j, s=s, t=t)  # noqa: E731
    return Frag(cats.split(), fill(setup), fill(body), [fill(m) for m in muts])


CATEGORIES = sorted({c for g in GROUPS for v in g for c in v[0].split()} | {"target_module", "persist"})
AMBIENT = (("nograd", 0.3), ("autocast", 0.25), ("float64", 0.1), ("inference", 0.1))
EXTRAS = ("mask", "noise0", "noise1")


@dataclasses.dataclass
class Program:
    """A program: fragments (index, Frag), its target (`f` or nn.Module `m`), its return form,
    a schedule of ("call", (n, seed, extras), flags) and ("mut", name) steps, and whether it
    runs the persistent variant."""
    seed: int
    frags: list
    target: str
    ret: str
    schedule: list
    persist: bool

    def replace(self, **kw):
        p = dataclasses.replace(self, **kw)
        live = {f"mut_{k}_" for k, _ in p.frags}  # mutations of dropped fragments go too
        p.schedule = [s for s in p.schedule if s[0] == "call" or s[1][:s[1].rindex("_") + 1] in live]
        return p

    def source(self):
        sub = lambda s, k: s.replace("$", f"_{k}")  # noqa: E731
        out = [HEADER]
        for k, fr in self.frags:
            if fr.setup:
                out.append(sub(fr.setup, k))
            for j, m in enumerate(fr.muts):
                if ("mut", f"mut_{k}_{j}") in self.schedule:  # only those the schedule applies
                    out.append(f"def mut_{k}_{j}():\n" + textwrap.indent(sub(m, k), "    "))
        body = "\n".join(sub(fr.body, k) for k, fr in self.frags)
        ret = {"dict": "out", "tuple": "tuple(out[k] for k in sorted(out))",
               "list": "[out[k] for k in sorted(out)]",
               "nested": '{"all": tuple(out.values()), "none": None}',
               "tensor": "out[sorted(out)[0]]", "none": "None"}[self.ret]
        body = 'x = td["x"]\nout = {}\n' + body + f"\nreturn {ret}"
        if self.target == "f":
            out.append("def f(td):\n" + textwrap.indent(body, "    "))
        else:
            out.append("class Top(nn.Module):\n    def forward(self, td):\n"
                       + textwrap.indent(body, "        ") + "\nm = Top()")
        return "\n".join(out) + "\n"

    def categories(self):
        cats = {c for _, fr in self.frags for c in fr.cats}
        return sorted(cats | ({"target_module"} if self.target == "m" else set())
                      | ({"persist"} if self.persist else set()))


def generate(seed, persist_every=8, only=(), exclude=()):
    """The program of a seed (deterministic): 1-4 fragments and 3-8 calls with mutations.
    only/exclude: fragment categories to draw from or not (and exclude target_module, persist)."""
    r = random.Random(seed)
    frags = []
    for k in range(r.randint(1, 4)):
        for _ in range(1000):
            fr = fragment(r)
            if not set(fr.cats) & set(exclude) and (not only or set(fr.cats) & set(only)):
                frags.append((k, fr))
                break
    muts = [f"mut_{k}_{j}" for k, fr in frags for j in range(len(fr.muts))]
    n, dseed, extras, schedule = r.choice([4, 6, 8, 12]), 0, (), []
    for i in range(r.randint(3, 8)):
        while i and muts and r.random() < 0.5:
            schedule.append(("mut", r.choice(muts)))
        if r.random() < 0.25:
            n = r.choice([4, 6, 8, 12])
        if r.random() < 0.7:
            dseed = i
        if r.random() < 0.2:
            e = r.choice(EXTRAS)
            extras = tuple(sorted(set(extras) ^ {e}))
        if i == 0 or r.random() < 0.3:  # a phase in another ambient state (eval, autocast...)
            flags = tuple(a for a, p in AMBIENT if r.random() < p)
        schedule.append(("call", (n, dseed, extras), flags))
    target = r.choice(["f", "f", "m"]) if "target_module" not in exclude else "f"
    ret = r.choice(["dict", "tuple", "list", "nested", "tensor", "none"])
    persist = bool(persist_every) and seed % persist_every == persist_every - 1
    return Program(seed, frags, target, ret, schedule, persist and "persist" not in exclude)


# ================================================================== the runner (also in reproducers)

def make_td(n, seed, extras):
    """A call's input: x, y and sub/y (float32 [n, 4]) and the optional keys named in extras."""
    g = torch.Generator().manual_seed(seed)
    r = lambda: torch.randn(n, 4, generator=g, dtype=torch.float32)  # noqa: E731
    d = {"x": r(), "y": r(), "sub": {"y": r()}}
    d.update({k: r() for k in extras})
    return tdstore.TensorDict(d, batch_size=[n])


@contextlib.contextmanager
def ambient(*flags):
    """Libtorch's ambient state of a call: "nograd", "autocast", "float64", "inference"."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if "float64" in flags else dtype)
    try:
        none = contextlib.nullcontext()
        with torch.set_grad_enabled("nograd" not in flags), \
                torch.autocast("cpu") if "autocast" in flags else none, \
                torch.inference_mode() if "inference" in flags else none:
            yield
    finally:
        torch.set_default_dtype(dtype)


def fresh(src, seed):
    """A new namespace running the program: its own but identical globals, modules, parameters."""
    ns = {"__name__": "fuzzprog"}
    torch.manual_seed(seed)
    exec(compile(src, "<fuzz program>", "exec"), ns)  # noqa: S102
    return ns


def mutate(C, E, name):
    """The mutation `name` on both sides, from the same RNG state."""
    rng = torch.get_rng_state()
    C[name]()
    torch.set_rng_state(rng)
    E[name]()


def snap(v, depth=0):
    """A comparable copy of v: tensors (with .grad), modules, optimizers, containers, objects."""
    if depth > 12:
        return "..."
    s = lambda x: snap(x, depth + 1)  # noqa: E731
    if isinstance(v, torch.Tensor):
        return {"value": v.detach().clone(), "requires_grad": v.requires_grad,
                "inference": v.is_inference(), "grad": s(v.grad) if v.is_leaf else None}
    if v is None or isinstance(v, (bool, int, float, str, slice, range)):
        return v
    if isinstance(v, torch.nn.Module):
        return {"modules": {n: (m.training, s({k: a for k, a in vars(m).items()
                                               if not k.startswith("_") and k != "training"}))
                            for n, m in v.named_modules()},
                "parameters": {n: s(p) for n, p in v.named_parameters()},
                "buffers": {n: s(b) for n, b in v.named_buffers()}}
    if isinstance(v, tdstore.TensorDict):
        return {k: s(v[k]) for k in v.keys()}
    if type(v).__module__ == "numpy":
        return v.tolist()
    if isinstance(v, torch.optim.Optimizer):
        return {"optimizer": s(v.state_dict())}
    if isinstance(v, (list, tuple, collections.deque)):
        return (type(v).__name__, [s(x) for x in v])
    if isinstance(v, (dict, types.MappingProxyType)):
        return {repr(k): s(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        return (type(v).__name__, sorted(repr(s(x)) for x in v))
    if isinstance(v, contextvars.ContextVar):
        return {"contextvar": s(v.get(None))}
    if isinstance(v, type):
        return f"<class {v.__name__}>"
    if isinstance(v, types.FunctionType):
        return {"attrs": s(vars(v)), "defaults": s(v.__defaults__),
                "closure": [s(c.cell_contents) for c in v.__closure__ or ()
                            if not isinstance(c.cell_contents, types.FunctionType)]}
    slots = [n for k in type(v).__mro__ for n in ([vars(k).get("__slots__", ())]
             if isinstance(vars(k).get("__slots__"), str) else vars(k).get("__slots__", ()))]
    return {"type": type(v).__name__, "attrs": s({k: a for k, a in vars(v).items()
                                                  if not k.startswith("__")}
                                                 if hasattr(v, "__dict__") else {}),
            "slots": {n: s(getattr(v, n, None)) for n in slots}}


def state(ns):
    """The snapshot of every object the program defined (names ending in _<index>, and m)."""
    return {k: snap(v) for k, v in sorted(ns.items()) if re.fullmatch(r"\w+_\d+|m", k)}


def same_tensor(a, b):
    """Same dtype and shape; equal values, or floating values within 4 ulps of their dtype at
    the tensor's scale (NaNs in the same places)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if torch.equal(a, b) or a.numel() == 0:
        return True
    if not (a.is_floating_point() or a.is_complex()):
        return False
    eps = torch.finfo(a.dtype).eps if a.is_floating_point() else torch.finfo(a.real.dtype).eps
    scale = max(1.0, float(b.abs().double().nan_to_num().max()))
    return torch.allclose(a.to(torch.complex128 if a.is_complex() else torch.float64),
                          b.to(torch.complex128 if b.is_complex() else torch.float64),
                          rtol=4 * eps, atol=4 * eps * scale, equal_nan=True)


def diff(a, b, path="call"):
    """Where the snapshots a (compiled) and b (eager) differ first, or None."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if same_tensor(a, b):
            return None
        at = 0
        if a.shape == b.shape and a.dtype == b.dtype:  # from the first element that differs
            at = next(i for i, (x, y) in enumerate(zip(a.flatten(), b.flatten()))
                      if not same_tensor(x, y))
        return f"{path}: {a.dtype}{list(a.shape)} != {b.dtype}{list(b.shape)}, from flat " \
               f"index {at}: {a.flatten()[at:at + 4].tolist()} != {b.flatten()[at:at + 4].tolist()}"
    if type(a) is not type(b):
        return f"{path}: {str(a)[:200]} != {str(b)[:200]}"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{path}: keys {list(a)} != {list(b)}"
        return next((d for k in a if (d := diff(a[k], b[k], f"{path}.{k}"))), None)
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}: {str(a)[:200]} != {str(b)[:200]}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := diff(x, y, f"{path}[{i}]"))),
                    None)
    return None if a == b else f"{path}: {a!r} != {b!r}"


def observe(fn, ns, td, flags):
    """Calls fn(td) under flags; what a caller can see after it, in comparison order."""
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), ambient(*flags):
            result = ("returned", snap(fn(td)))
    except Exception as e:  # noqa: BLE001  (the exception's type is compared)
        result = ("raised", type(e).__name__)
    return {"outcome": result[0], "return": result[1],
            "td": {"batch": list(td.batch_size), "keys": {k: snap(td[k]) for k in td.keys()}},
            "state": state(ns), "rng": torch.get_rng_state(), "stdout": out.getvalue()}


def run_call(cf, C, E, target, td_args, flags):
    """One call, compiled on C's side and eager on E's, from one RNG state on identical dicts."""
    td_c, td_e = make_td(*td_args), make_td(*td_args)
    rng = torch.get_rng_state()
    got = observe(cf, C, td_c, flags)
    torch.set_rng_state(rng)
    return got, observe(E[target], E, td_e, flags)


def check_call(got, want):
    """Raises AssertionError naming the first difference of a compiled call from eager."""
    d = diff(got, want)
    assert d is None, "compiled != eager: " + d


# ================================================================== checking, classifying, shrinking

REPRO_HELPERS = "\n".join(inspect.getsource(f) for f in (  # the runner, for reproducers
    make_td, ambient, fresh, mutate, snap, state, same_tensor, diff, observe, run_call, check_call))
_names = iter(range(1 << 62))
TOTALS = collections.Counter()  # calls; ("how", category, how the compiled side served a call)
HOW = ("hits", "compiles", "loads", "fallbacks")  # graph, traced, loaded, eager


class Mismatch(Exception):
    def __init__(self, kind, step, detail, info):
        super().__init__(f"{kind} at step {step}: {detail}")
        self.kind, self.step, self.detail, self.info = kind, step, detail, info


def _phase(prog, src, store, second=False):
    """One run of the schedule (the second run of the persistent variant first applies every
    mutation: its calls find state the stored graphs were not traced with)."""
    C, E = fresh(src, prog.seed), fresh(src, prog.seed)
    cf = tdstore.compile(C[prog.target], persist=store is not None, store=store,
                         name=f"fuzz{prog.seed}_{'p' if store else next(_names)}")
    cats = prog.categories()
    try:
        for step in (s for s in prog.schedule if s[0] == "mut" and second):
            mutate(C, E, step[1])
        for i, step in enumerate(prog.schedule):
            if step[0] == "mut":
                mutate(C, E, step[1])
                continue
            before = cf.stats()
            got, want = run_call(cf, C, E, prog.target, *step[1:])
            after = cf.stats()
            how = next((k for k in HOW if getattr(after, k) > getattr(before, k)), "none")
            TOTALS["calls"] += 1
            TOTALS.update(("how", c, how) for c in cats + ["*"])
            d = diff(got, want)
            if d is not None:
                info = f"{after}\n{cf.explain()[-1500:]}"
                raise Mismatch(re.match(r"call\.(\w+)", d).group(1), i, d, info)
    finally:
        # A called CompiledFunction and all it reaches are never freed (its engine holds its
        # body, a bound method of it: a cycle through C++ the collector cannot see); emptying
        # it when the run ends breaks the cycle.
        vars(cf).clear()


def mismatch_of(prog):
    """Runs the program compiled and eager: its first Mismatch, or None."""
    src = prog.source()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not prog.persist:
                return _phase(prog, src, None)
            with tempfile.TemporaryDirectory() as d:
                tdstore.TensorDict.create(os.path.join(d, "g"), batch_size=[]).close()
                _phase(prog, src, os.path.join(d, "g"))  # traces and stores the graphs
                _phase(prog, src, os.path.join(d, "g"), True)  # a new process-like run: loads them
    except Mismatch as m:
        return m


class Shrinker:
    """Keeps the smallest program found that still fails with the same kind of mismatch, within
    a budget of checks."""

    def __init__(self, prog, m, budget=400):
        self.prog, self.m, self.budget = prog, m, budget

    def attempt(self, **changes):
        if self.budget <= 0:
            return False
        self.budget -= 1
        q = self.prog.replace(**changes)
        m = mismatch_of(q)
        if m is None or m.kind != self.m.kind:
            return False
        self.prog, self.m = q, m
        return True

    def classify(self):
        """Drops fragments, the module target, persistence: the (kind, categories) class."""
        self.attempt(schedule=self.prog.schedule[:self.m.step + 1])
        dropped = True
        while dropped and len(self.prog.frags) > 1:  # one by one, until none can go
            dropped = any(self.attempt(frags=[f for f in self.prog.frags if f is not fr])
                          for fr in self.prog.frags)
        for name, simple in (("target", "f"), ("persist", False), ("ret", "dict")):
            if getattr(self.prog, name) != simple:
                self.attempt(**{name: simple})
        return self.m.kind, tuple(self.prog.categories())

    def shrink(self):
        """Drops schedule steps (windows of 4, 2, 1), call flags and input variation."""
        simpler = [lambda c: (c[0], c[1], ()), lambda c: (c[0], (8, 0, ()), c[2]),
                   lambda c: (c[0], (c[1][0], 0, ()), c[2])]
        simpler += [lambda c, a=a: (c[0], c[1], tuple(x for x in c[2] if x != a)) for a, _ in AMBIENT]
        changed = True
        while changed:
            changed = False
            for size in (4, 2, 1):
                for i in reversed(range(len(self.prog.schedule))):
                    s = self.prog.schedule
                    if i + size <= len(s) and len(s) > size:
                        changed |= self.attempt(schedule=s[:i] + s[i + size:])
            for i in range(len(self.prog.schedule)):
                for make in simpler:
                    s = self.prog.schedule
                    if s[i][0] == "call" and make(s[i]) != s[i]:
                        changed |= self.attempt(schedule=s[:i] + [make(s[i])] + s[i + 1:])


def reproducer(prog, m, key):
    """A self-contained script replaying the program: it fails (AssertionError) as it fails."""
    esc = lambda t: t.replace("\\", "\\\\").replace('"' * 3, "'" * 3)  # noqa: E731
    lines = ['"' * 3 + f"tdstore.compile fuzzer reproducer: seed {prog.seed}, class {key[0]}: "
             f'{"+".join(key[1])}', "", esc(f"Mismatch: {m}"[:2000]),
             *(f"Documented limit ({c}): {LIMITS[c]}" for c in key[1] if c in LIMITS),
             "", "The compiled side's stats() and explain():", esc(m.info), '"' * 3,
             "import collections, contextlib, contextvars, io, os, re, sys, tempfile, types",
             f"sys.path.insert(0, {os.path.dirname(os.path.dirname(tdstore.__file__))!r})",
             "import torch", "import tdstore", "",
             "# The program, executed twice: compiled on side C, eager on side E.",
             "SRC = " + '"' * 3 + "\\", esc(prog.source()) + '"' * 3, "", REPRO_HELPERS, "store = None"]
    if prog.persist:  # the persistent variant: two runs on one graph store
        lines.append('tmp = tempfile.TemporaryDirectory()  # removed at exit\n'
                     'store = os.path.join(tmp.name, "g")\n'
                     "tdstore.TensorDict.create(store, batch_size=[]).close()")
    for phase in range(2 if prog.persist else 1):
        lines += [f"\n# run {phase + 1}", f"C, E = fresh(SRC, {prog.seed}), fresh(SRC, {prog.seed})",
                  f"cf = tdstore.compile(C[{prog.target!r}], persist=store is not None, "
                  f"store=store, name='repro{prog.seed}')"]
        pre = [s for s in prog.schedule if s[0] == "mut"] if phase else []
        lines += [f"mutate(C, E, {s[1]!r})" if s[0] == "mut" else
                  f"check_call(*run_call(cf, C, E, {prog.target!r}, {s[1]!r}, {s[2]!r}))"
                  for s in pre + prog.schedule]
    return "\n".join(lines + ["print(cf.stats())", 'print("no mismatch")']) + "\n"


def write_repro(text, key, directory, verify):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, re.sub(r"\W+", "_", f"{key[0]}__{'__'.join(key[1])}")[:150] + ".py")
    with open(path, "w") as f:
        f.write(text)
    if not verify:
        return path, None
    r = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=600)
    return path, r.returncode != 0 and "compiled != eager" in r.stderr


# ================================================================== the driver

def fuzz(seconds=None, count=None, seed=0, only=(), exclude=(), repro_dir="/tmp/fuzz-repros",
         persist_every=8, verify=True, log=print):
    """Checks programs seed, seed+1, ... until `count` programs or `seconds` pass. Returns a
    report dict: counts, throughput, and per mismatch class its count and reproducer."""
    start, n, classes, aliases = time.monotonic(), 0, {}, {}  # aliases: class -> minimized class
    TOTALS.clear()
    mismatching, shrink_time, errors = 0, 0.0, []
    while (count is None or n < count) and (seconds is None or time.monotonic() - start < seconds):
        prog = generate(seed + n, persist_every, only, exclude)
        n += 1
        try:
            m = mismatch_of(prog)
        except Exception as e:  # noqa: BLE001  (the fuzzer's own failure: reported, not hidden)
            errors.append((prog.seed, f"{type(e).__name__}: {e}"))
            log(f"fuzzer error at seed {prog.seed}: {errors[-1][1]}")
            continue
        if m is None:
            continue
        mismatching += 1
        t0 = time.monotonic()
        saved = TOTALS.copy()
        sh = Shrinker(prog, m)
        key = sh.classify()
        if key not in aliases:  # a new class: minimized, then classified again (fewer steps
            sh.shrink()         # may let more fragments go)
            aliases[key] = sh.classify()
        key = aliases[key]
        c = classes.setdefault(key, {"count": 0, "seeds": []})
        c["count"] += 1
        c["seeds"].append(prog.seed)
        if "repro" not in c:
            c["repro"] = write_repro(reproducer(sh.prog, sh.m, key), key, repro_dir, verify)
            log(f"new class {key[0]}: {'+'.join(key[1])} (seed {prog.seed}): {sh.m}"[:400]
                + f"\n  reproducer {c['repro'][0]} (reproduces standalone: {c['repro'][1]})")
        TOTALS.clear()  # shrinking's calls are not fuzzing's
        TOTALS.update(saved)
        shrink_time += time.monotonic() - t0
    elapsed = time.monotonic() - start
    fuzz_time = max(elapsed - shrink_time, 1e-9)
    return {"programs": n, "calls": TOTALS["calls"], "mismatching_programs": mismatching,
            "seconds": elapsed, "programs_per_s": n / fuzz_time, "calls_per_s": TOTALS["calls"] / fuzz_time,
            "by_category": {c: {h: TOTALS["how", c, h] for h in HOW + ("none",)}
                            for c in CATEGORIES + ["*"]}, "errors": errors,
            "classes": classes}


def format_report(rep):
    served = lambda c: ", ".join(f"{h} {n}" for h, n in rep["by_category"][c].items() if n)  # noqa: E731
    out = [f"programs {rep['programs']}, calls {rep['calls']}, mismatching programs "
           f"{rep['mismatching_programs']}, {rep['seconds']:.0f} s ({rep['programs_per_s']:.1f} "
           f"programs/s, {rep['calls_per_s']:.1f} calls/s, shrinking excluded)",
           f"compiled calls served by: {served('*')}", "by category (calls of programs using it):"]
    out += [f"  {c:24s} {served(c)}" for c in CATEGORIES if any(rep["by_category"][c].values())]
    out += [f"fuzzer errors: {rep['errors'][:10]}"] if rep["errors"] else []
    out.append(f"{len(rep['classes'])} mismatch classes (count, kind: categories):")
    for (kind, cats), c in sorted(rep["classes"].items(), key=lambda kv: -kv[1]["count"]):
        lim = [x for x in cats if x in LIMITS]
        out.append(f"  {c['count']:5d}  {kind}: {'+'.join(cats)}"
                   + (f"  [documented limit: {', '.join(lim)}]" if lim else "")
                   + f"\n         {c['repro'][0]} (standalone: {c['repro'][1]}; seeds {c['seeds'][:5]})")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--count", type=int)
    ap.add_argument("--seed", type=int, default=0, help="the first seed (one: --count 1)")
    ap.add_argument("--only", nargs="*", default=(), choices=CATEGORIES, metavar="CATEGORY")
    ap.add_argument("--exclude", nargs="*", default=(), choices=CATEGORIES, metavar="CATEGORY")
    ap.add_argument("--repro-dir", default="/tmp/fuzz-repros")
    ap.add_argument("--persist-every", type=int, default=8, help="0: no persistent variant")
    ap.add_argument("--no-verify", action="store_true", help="skip rerunning reproducers")
    ap.add_argument("--show", action="store_true", help="print the program of --seed and exit")
    a = ap.parse_args(argv)
    if a.show:
        p = generate(a.seed, a.persist_every, a.only, a.exclude)
        print(p.source(), *p.schedule, f"categories: {p.categories()}", sep="\n")
        return 0
    if a.seconds is None and a.count is None:
        a.seconds = 60
    rep = fuzz(a.seconds, a.count, a.seed, a.only, a.exclude, a.repro_dir, a.persist_every,
               not a.no_verify)
    print(format_report(rep))
    return 1 if rep["classes"] or rep["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
