"""A compiled call returns what eager returns now, in the idioms PyTorch users write every day:
reads the walk reaches only through classes, containers whose contents it must read, and
effects inside the body that a trace cannot replay (tdstore._walk, tdstore._observe). Every
test here failed before those existed; each runs the function compiled and eagerly on identical
copies and compares results, gradients and state after every call."""
import collections
import contextvars
import copy
import types

import pytest
import torch

import tdstore

TEMPERATURE = 2.0
WINDOW = slice(0, 2)
SPAN = range(0, 2)


def td(seed=0, rows=4):
    g = torch.Generator().manual_seed(seed)
    return tdstore.TensorDict({"x": torch.randn(rows, 3, generator=g)}, batch_size=[rows])


def same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and \
            a.requires_grad == b.requires_grad and torch.equal(a.detach(), b.detach())
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def follows(fn, change, calls=3, eager_fn=None, state=None):
    """fn compiled equals fn eager on `calls` calls, then again after change(); state(): extra
    values (gradients, parameters) compared after every call, on the compiled side (fn) and
    the eager side (eager_fn, a deep copy made by the caller where state matters)."""
    eager_fn = eager_fn or fn
    step = tdstore.compile(fn, persist=False)
    for phase in range(2):
        for i in range(calls):
            got, want = step(td(i)), eager_fn(td(i))
            assert same(got, want), (phase, i, got, want, step.explain())
            if state:
                assert same(state(fn), state(eager_fn)), (phase, i, step.explain())
        if phase == 0:
            change()
    return step


# ------------------------------------------------------------------ reads reached via classes

class Scaled(torch.nn.Module):
    def forward(self, d):
        return d["x"] / TEMPERATURE


def _set_temperature(v):
    global TEMPERATURE
    TEMPERATURE = v


def test_a_module_global_read_in_forward_is_guarded():
    m = Scaled()
    try:
        follows(m, lambda: _set_temperature(5.0))
    finally:
        _set_temperature(2.0)


class Holder:
    def scale(self):
        return TEMPERATURE

    @property
    def shift(self):
        return TEMPERATURE * 10


def test_a_method_and_a_property_reading_a_global_are_guarded():
    h = Holder()
    try:
        follows(lambda d: d["x"] * h.scale() + h.shift, lambda: _set_temperature(3.0))
    finally:
        _set_temperature(2.0)


def test_a_class_attribute_and_a_replaced_method_are_guarded():
    class Cfg:
        factor = 2.0

        def f(self, x):
            return x * self.factor

    c = Cfg()
    follows(lambda d: c.f(d["x"]), lambda: setattr(Cfg, "factor", 7.0))
    follows(lambda d: c.f(d["x"]), lambda: setattr(Cfg, "f", lambda self, x: x - 1))


class Base:
    __slots__ = ("k",)


class Derived(Base):
    __slots__ = "j"  # one string: one slot


def test_slots_of_a_base_class_and_a_one_string_slots_are_guarded():
    o = Derived()
    o.k, o.j = 1.0, 2.0
    follows(lambda d: d["x"] * o.k + o.j, lambda: setattr(o, "k", 4.0))
    follows(lambda d: d["x"] * o.k + o.j, lambda: setattr(o, "j", 9.0))


def _helper(x):
    return x * _helper.scale


_helper.scale = 2.0


def test_an_attribute_set_on_a_function_object_is_guarded():
    follows(lambda d: _helper(d["x"]), lambda: setattr(_helper, "scale", 5.0))


def test_deque_mappingproxy_and_contextvar_contents_are_guarded():
    q = collections.deque([1.0, 2.0])
    follows(lambda d: d["x"] * q[0], lambda: q.appendleft(6.0))
    backing = {"s": 1.0}
    mp = types.MappingProxyType(backing)
    follows(lambda d: d["x"] * mp["s"], lambda: backing.update(s=3.0))
    var = contextvars.ContextVar("scale", default=1.0)
    follows(lambda d: d["x"] * var.get(), lambda: var.set(4.0))


def _set(name, value):
    globals()[name] = value


def test_slice_and_range_globals_are_told_apart():
    try:
        follows(lambda d: d["x"][WINDOW], lambda: _set("WINDOW", slice(1, 4)))
        follows(lambda d: d["x"][:, SPAN[0]:SPAN[-1] + 1], lambda: _set("SPAN", range(1, 3)))
    finally:
        _set("WINDOW", slice(0, 2))
        _set("SPAN", range(0, 2))


class Knob:
    def __init__(self, v):
        self.v = v


def test_the_state_of_a_set_element_is_guarded():
    k = Knob(1.0)
    s, fs = {k}, frozenset([k])
    follows(lambda d: d["x"] * next(iter(s)).v, lambda: setattr(k, "v", 3.0))
    follows(lambda d: d["x"] * next(iter(fs)).v, lambda: setattr(k, "v", 5.0))


def test_a_module_whose_class_is_switched_is_guarded():
    mod = types.ModuleType("switched")
    mod.factor = 2.0

    class WithProperty(types.ModuleType):
        @property
        def factor(self):
            return 11.0

    follows(lambda d: d["x"] * mod.factor, lambda: setattr(mod, "__class__", WithProperty))


def test_reading_a_gradient_inside_the_body_runs_eagerly():
    p = torch.nn.Parameter(torch.ones(3))

    def fn(d):
        return d["x"] + p.grad

    (p * 2).sum().backward()
    step = follows(fn, lambda: (p * 5).sum().backward())
    assert step.stats().hits == 0, step.explain()


def test_a_branch_on_is_tracing_runs_eagerly():
    def fn(d):
        return d["x"] * (2 if torch.jit.is_tracing() else 3)

    step = follows(fn, lambda: None)
    assert step.stats().hits == 0 and "another path under the tracer" in step.explain()


# ------------------------------------------------------------------ effects inside the body

def _twin(model_factory):
    a = model_factory()
    return a, copy.deepcopy(a)


def _grads(m):
    return [p.grad for p in m.parameters()]


@pytest.mark.parametrize("block", ["no_grad", "helper", "inference_mode", "enable_grad"])
def test_grad_mode_switches_inside_the_body_run_eagerly(block):
    torch.manual_seed(0)
    net, twin = _twin(lambda: torch.nn.Linear(3, 3))

    @torch.no_grad()
    def target(m, x):
        return m(x)

    def make(m):
        def fn(d):
            x = d["x"]
            if block == "no_grad":
                with torch.no_grad():
                    t = m(x)
            elif block == "helper":
                t = target(m, x)
            elif block == "inference_mode":
                with torch.inference_mode():
                    t = m(x).clone()
                t = t.clone()
            else:
                with torch.enable_grad():
                    t = m(x)
            return (m(x) - t).pow(2).sum() + t.sum()
        return fn

    fn, eager = make(net), make(twin)
    ctx = torch.no_grad() if block == "enable_grad" else torch.enable_grad()
    with ctx:
        step = tdstore.compile(fn, persist=False)
        for i in range(3):
            got, want = step(td(i)), eager(td(i))
            assert same(got, want), (i, step.explain())
            if got.requires_grad:
                got.backward()
                want.backward()
                assert same(_grads(net), _grads(twin)), (i, step.explain())
    assert step.stats().hits == 0, step.explain()


def test_seeding_inside_the_body_runs_eagerly():
    def fn(d):
        torch.manual_seed(7)
        return d["x"] + torch.rand(3)

    step = tdstore.compile(fn, persist=False)
    for i in range(3):
        torch.manual_seed(100 + i)
        got, after_got = step(td(i)), torch.rand(2)
        torch.manual_seed(100 + i)
        want, after_want = fn(td(i)), torch.rand(2)
        assert same(got, want) and same(after_got, after_want), (i, step.explain())
    assert step.stats().hits == 0, step.explain()


@pytest.mark.parametrize("how", ["backward", "autograd_grad", "optimizer_step"])
def test_autograd_and_optimizer_steps_inside_the_body_run_eagerly(how):
    torch.manual_seed(0)
    net, twin = _twin(lambda: torch.nn.Linear(3, 1))
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.1) for m in (net, twin)}

    def make(m):
        def fn(d):
            loss = m(d["x"]).pow(2).mean()
            if how == "backward":
                loss.backward()
            elif how == "autograd_grad":
                g, = torch.autograd.grad(loss, m.weight)
                return loss.detach() + g.sum()
            else:
                opts[id(m)].zero_grad()
                loss.backward()
                opts[id(m)].step()
            return loss.detach()
        return fn

    fn, eager = make(net), make(twin)
    step = tdstore.compile(fn, persist=False)
    for i in range(4):
        assert same(step(td(i)), eager(td(i))), (i, step.explain())
        assert same(list(net.parameters()), list(twin.parameters())), (i, step.explain())
        assert same(_grads(net), _grads(twin)), (i, step.explain())
    assert step.stats().hits == 0, step.explain()


def test_python_state_the_body_changes_runs_eagerly():
    seen = []

    def fn(d):
        seen.append(1)
        return d["x"] * len(seen)

    step = tdstore.compile(fn, persist=False)
    for i in range(3):
        got = step(td(i))
        assert torch.equal(got, td(i)["x"] * len(seen)), step.explain()


def test_printing_inside_the_body_runs_eagerly(capsys):
    step = tdstore.compile(lambda d: (print("step"), d["x"] + 1)[1], persist=False)
    for i in range(3):
        step(td(i))
    assert capsys.readouterr().out.count("step") == 3, step.explain()


def test_a_value_read_into_python_runs_eagerly():
    def fn(d):
        return d["x"] * 2 if d["x"].sum() > 0 else d["x"] * 3

    step = tdstore.compile(fn, persist=False)
    for i in range(6):
        assert torch.equal(step(td(i)), fn(td(i))), step.explain()


def test_an_interrupt_during_the_trace_propagates_and_poisons_nothing():
    interrupt = [True]

    def fn(d):
        if torch.jit.is_tracing() and interrupt[0]:  # Ctrl-C during the first call's trace
            raise KeyboardInterrupt
        return d["x"] + 1

    step = tdstore.compile(fn, code_identity="interrupt", persist=False)
    with pytest.raises(KeyboardInterrupt):
        step(td())
    assert step.stats().entries == 0 and step.stats().fallbacks == 0, step.explain()
    interrupt[0] = False  # the next call records and traces anew (here: a path on is_tracing)
    assert torch.equal(step(td()), td()["x"] + 1)
    assert "another path under the tracer" in step.explain(), step.explain()
