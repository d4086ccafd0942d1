"""A compiled function reuses its last walk of what it reaches only while every place that walk
read still holds the identical object (tdstore._walk). Each test changes one kind of place
after calls that reused the walk, and the next call must return what eager returns now."""
import functools
import types

import numpy as np
import pytest
import torch

import tdstore

_SCALE = 2.0
_HELPER_SHIFT = 1.0
_late = types.SimpleNamespace()  # a namespace whose attribute appears later


def td():
    return tdstore.TensorDict({"x": torch.arange(6.0).reshape(3, 2)}, batch_size=[3])


def _shifted(x):
    return x + _HELPER_SHIFT


def assert_follows(fn, change, calls=3):
    """Compiled fn equals eager fn before and after change(); the walk is reused while
    nothing changes."""
    step = tdstore.compile(fn, persist=False)
    d = td()
    walks = set()
    for _ in range(calls):
        assert torch.equal(step(d), fn(d))
        walks.add(id(step._last_walk[1]))
    assert len(walks) == 1, "an unchanged function reuses its walk"
    before = fn(d)
    change()
    after = fn(d)
    assert not torch.equal(before, after), "the change alters what eager returns"
    for _ in range(2):
        assert torch.equal(step(d), after), step.explain()


def test_a_global_rebound():
    def change():
        global _SCALE
        _SCALE = 3.0
    try:
        assert_follows(lambda t: t["x"] * _SCALE, change)
    finally:
        globals()["_SCALE"] = 2.0


def test_a_global_of_a_helper_rebound():
    def change():
        global _HELPER_SHIFT
        _HELPER_SHIFT = 5.0
    try:
        assert_follows(lambda t: _shifted(t["x"]), change)
    finally:
        globals()["_HELPER_SHIFT"] = 1.0


def test_a_global_that_appears_later():
    def fn(t):
        return t["x"] * getattr(_late, "k", 1.0)
    assert_follows(fn, lambda: setattr(_late, "k", 4.0))
    del _late.k


def test_a_closure_cell_rebound():
    k = 2.0

    def fn(t):
        return t["x"] * k

    def change():
        nonlocal k
        k = 7.0
    assert_follows(fn, change)


def test_defaults_and_code_replaced():
    def fn(t, k=2.0):
        return t["x"] * k
    assert_follows(fn, lambda: setattr(fn, "__defaults__", (9.0,)))

    def g(t):
        return t["x"] + 1
    assert_follows(g, lambda: setattr(g, "__code__", (lambda t: t["x"] - 1).__code__))


def test_an_objects_attribute_and_class_changed():
    class Cfg:
        def k(self):
            return self.base

    class Doubled(Cfg):
        def k(self):
            return self.base * 2

    cfg = Cfg()
    cfg.base = 2.0
    assert_follows(lambda t: t["x"] * cfg.k(), lambda: setattr(cfg, "base", 3.0))
    assert_follows(lambda t: t["x"] * cfg.k(), lambda: setattr(cfg, "__class__", Doubled))


def test_a_slot_changed():
    class Slotted:
        __slots__ = ("k",)

    s = Slotted()
    s.k = 2.0
    assert_follows(lambda t: t["x"] * s.k, lambda: setattr(s, "k", 5.0))


@pytest.mark.parametrize("change", ["replace", "append"])
def test_a_list_changed_in_place(change):
    ks = [2.0]
    assert_follows(lambda t: t["x"] * sum(ks),
                   lambda: ks.__setitem__(0, 4.0) if change == "replace" else ks.append(1.0))


def test_a_set_and_a_dict_changed_in_place():
    flags = set()
    assert_follows(lambda t: -t["x"] if "neg" in flags else t["x"], lambda: flags.add("neg"))
    opts = {"k": 2.0}
    assert_follows(lambda t: t["x"] * opts["k"] + opts.get("b", 0.0), lambda: opts.update(k=3.0))
    assert_follows(lambda t: t["x"] * opts["k"] + opts.get("b", 0.0), lambda: opts.update(b=1.0))


def test_a_module_attribute_changed():
    mod = types.ModuleType("consts")
    mod.K = 2.0

    def fn(t):
        return t["x"] * mod.K
    assert_follows(fn, lambda: setattr(mod, "K", 6.0))


def test_a_parameter_replaced_and_a_flag_flipped():
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 2)
    assert_follows(lambda t: net(t["x"]),
                   lambda: setattr(net, "weight", torch.nn.Parameter(torch.ones(2, 2))))
    drop = torch.nn.Sequential(torch.nn.Dropout(1.0))
    drop.eval()
    assert_follows(lambda t: drop(t["x"]), drop.train)


def test_a_numpy_array_changed_in_place():
    a = np.array([2.0], dtype=np.float32)
    step = tdstore.compile(lambda t: t["x"] * float(a[0]), persist=False)
    d = td()
    assert torch.equal(step(d), d["x"] * 2)
    a[0] = 5.0  # no place holds another object: the walk cannot be reused
    assert torch.equal(step(d), d["x"] * 5)


def test_a_captured_partial_reset():
    def scale(k, x):
        return x * k
    p = functools.partial(scale, 2.0)
    assert_follows(lambda t: p(t["x"]), lambda: p.__setstate__((scale, (3.0,), {}, None)))


def test_a_module_getattr_hook_added_later():
    mod = types.ModuleType("lazy_consts")

    def fn(t):
        try:
            k = mod.K
        except AttributeError:
            k = 1.0
        return t["x"] * k
    assert_follows(fn, lambda: setattr(mod, "__getattr__", lambda name: 3.0))


def test_a_class_whose_metaclass_compares_equal_to_str_is_walked_as_an_object():
    """The walk picks a value's handler by its type's identity: a metaclass's __eq__/__hash__
    can neither make an object pass for a str (its state would go unchecked) nor raise."""
    from tdstore import _walk

    class LikeStr(type):
        def __eq__(cls, other):
            return other is str or cls is other

        def __hash__(cls):
            return hash(str)

    class Sneaky(metaclass=LikeStr):
        def __init__(self):
            self.state = [1]

        def __repr__(self):
            return "'x'"

    class Unhashable(type):
        def __eq__(cls, other):
            return cls is other

    class Plain(metaclass=Unhashable):
        pass

    sneaky = Sneaky()
    facts = _walk.walk(sneaky).facts
    assert facts != _walk.walk("x").facts
    assert "object" in facts
    before = _walk.walk(sneaky)
    sneaky.state = [2]
    assert not before.still_holds(), "a change of its state is seen"
    assert "object" in _walk.walk(Plain()).facts  # no TypeError from an unhashable class
