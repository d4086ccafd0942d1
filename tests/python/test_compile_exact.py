"""tdstore.compile never returns what eager would not: everything a Python function's result
depends on is a graph input or in the guard (modules' parameters, buffers, flags and code,
globals, bound objects, autocast and the default dtype), returns come back as eager returns
them, and what cannot be compiled says so with a typed error."""
import functools
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tdstore


def batch(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tdstore.TensorDict({"x": torch.randn(n, 8, generator=g)}, batch_size=[n])


def run(script, cwd):
    """Runs a Python script in a fresh interpreter (a new run of a user's program)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


# ----------------------------------------------------------------- modules and their state

def test_a_modules_parameters_are_inputs_and_its_training_flag_is_guarded():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    step = tdstore.compile(lambda td: net(td["x"]), persist=False)
    td = batch()
    net.eval()
    for _ in range(3):
        assert torch.equal(step(td), net(td["x"])), step.explain()
    with torch.no_grad():  # an optimizer step: the graph sees the new values
        net[0].weight.mul_(2)
    assert torch.equal(step(td), net(td["x"])), step.explain()
    net.train()
    dropped = [(step(td) == 0).float().mean().item() for _ in range(4)]
    assert all(0.2 < d < 0.8 for d in dropped), dropped  # dropout is on again
    net.eval()
    assert torch.equal(step(td), net(td["x"])), step.explain()  # and off: no dropped values
    assert step.stats().compiles == 2, step.explain()


def test_a_modules_attribute_changed_in_process_is_seen():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = 2.0

        def forward(self, x):
            return x * self.scale

    m = Scaled()
    step = tdstore.compile(lambda td: m(td["x"]), persist=False)
    td = batch()
    assert torch.equal(step(td), td["x"] * 2)
    assert torch.equal(step(td), td["x"] * 2)
    m.scale = 3.0
    assert torch.equal(step(td), td["x"] * 3), step.explain()
    m.scale = 2.0
    assert torch.equal(step(td), td["x"] * 2)
    assert step.stats().compiles == 2 and step.stats().hits == 2, step.explain()


def test_batchnorm_buffers_update_on_every_call_as_in_eager():
    torch.manual_seed(0)
    compiled_bn, eager_bn = torch.nn.BatchNorm1d(8), torch.nn.BatchNorm1d(8)
    step = tdstore.compile(lambda td: compiled_bn(td["x"]), persist=False)
    for i in range(5):
        td = batch(seed=i)
        assert torch.allclose(step(td), eager_bn(td["x"]), atol=1e-6), step.explain()
        assert torch.allclose(compiled_bn.running_mean, eager_bn.running_mean, atol=1e-6), i
        assert torch.allclose(compiled_bn.running_var, eager_bn.running_var, atol=1e-6), i
        assert int(compiled_bn.num_batches_tracked) == i + 1
    assert step.stats().compiles == 1 and step.stats().hits == 4, step.explain()


def test_gradients_reach_parameters_found_without_inputs():
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 1)
    twin = torch.nn.Linear(8, 1)
    twin.load_state_dict(net.state_dict())
    step = tdstore.compile(lambda td: net(td["x"]).pow(2).mean(), persist=False)
    for i in range(4):
        td = batch(seed=i)
        net.zero_grad()
        twin.zero_grad()
        step(td).backward()
        twin(td["x"]).pow(2).mean().backward()
        assert torch.allclose(net.weight.grad, twin.weight.grad, atol=1e-6), step.explain()
    assert step.stats().compiles == 1 and step.stats().hits == 3, step.explain()


def test_a_compiled_module_and_a_partial():
    torch.manual_seed(0)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 3)

        def forward(self, td):
            return self.lin(td["x"])

    head = Head()
    step = tdstore.compile(head, persist=False)
    td = batch()
    for _ in range(2):
        assert torch.equal(step(td), head.lin(td["x"]))
    assert "Head" in step.name

    def scaled(td, k):
        return td["x"] * k

    for k in (2.0, 3.0):
        p = tdstore.compile(functools.partial(scaled, k=k), persist=False)
        assert torch.equal(p(td), td["x"] * k) and torch.equal(p(td), td["x"] * k)
        assert p.stats().hits == 1


# ----------------------------------------------------------------- bound objects and globals

class Stepper:
    def __init__(self, w, bias):
        self.w, self.bias = w, bias

    def step(self, td):
        return td["x"] @ self.w + self.bias


def test_bound_methods_of_two_objects_never_share_results(tmp_path):
    store = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[16])
    store["x"] = batch()["x"]
    store.commit()
    a, b = Stepper(torch.randn(8, 2), 1.0), Stepper(torch.randn(8, 2), 5.0)
    fa, fb = tdstore.compile(a.step), tdstore.compile(b.step)
    for _ in range(3):
        assert torch.equal(fa(store), a.step(store))
        assert torch.equal(fb(store), b.step(store)), fb.explain()
    c = Stepper(torch.randn(8, 2), 1.0)  # a's config, its own weights
    fc = tdstore.compile(c.step)
    assert torch.equal(fc(store), c.step(store)) and torch.equal(fc(store), c.step(store))


def test_closures_over_different_tensors_share_no_results():
    def make(w):
        return tdstore.compile(lambda td: td["x"] @ w, name="closure_step", persist=False)

    td = batch()
    w1, w2 = torch.randn(8, 2), torch.randn(8, 2)
    f1, f2 = make(w1), make(w2)
    for _ in range(2):
        assert torch.equal(f1(td), td["x"] @ w1) and torch.equal(f2(td), td["x"] @ w2)


SCALE = 2.0


def _helper(x):
    return x * SCALE


def test_globals_and_helpers_are_followed():
    global SCALE
    step = tdstore.compile(lambda td: _helper(td["x"]), persist=False)
    td = batch()
    assert torch.equal(step(td), td["x"] * 2) and torch.equal(step(td), td["x"] * 2)
    SCALE = 4.0
    try:
        assert torch.equal(step(td), td["x"] * 4), step.explain()
    finally:
        SCALE = 2.0
    assert torch.equal(step(td), td["x"] * 2)
    assert step.stats().compiles == 2, step.explain()


def test_a_captured_tensordict_runs_eagerly_and_says_why():
    stats = tdstore.TensorDict({"mean": torch.ones(8)}, batch_size=[])
    step = tdstore.compile(lambda td: td["x"] - stats["mean"], persist=False)
    td = batch()
    assert torch.equal(step(td), td["x"] - 1)
    stats["mean"] = torch.full((8,), 3.0)
    assert torch.equal(step(td), td["x"] - 3)
    assert step.stats().compiles == 0 and step.stats().fallbacks == 2
    assert "captures a tdstore.TensorDict" in step.explain()


# ----------------------------------------------------------------- code changed between runs

def test_a_module_or_helper_edited_between_runs_never_runs_the_old_graph(tmp_path):
    def write(forward_body, helper_body):
        (tmp_path / "model.py").write_text(textwrap.dedent(f"""
            import torch
            def helper(x):
                return {helper_body}
            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lin = torch.nn.Linear(8, 8)
                def forward(self, x):
                    return {forward_body}
        """))
    script = f"""
        import torch, tdstore, model
        torch.manual_seed(0)
        net = model.Net()
        store = tdstore.open({str(tmp_path / 's')!r})
        step = tdstore.compile(lambda td: model.helper(net(td["x"])), name="edited")
        for _ in range(4):
            got = step(store)
            assert torch.equal(got, model.helper(net(store["x"]))), step.explain()
        print(step.stats().loads, step.stats().compiles)
    """
    s = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[16])
    s["x"] = batch()["x"]
    s.commit()
    del s
    write("self.lin(x)", "x + 1")
    assert run(script, tmp_path).split() == ["0", "1"]
    assert run(script, tmp_path).split() == ["1", "0"]  # unchanged: the stored graph
    write("self.lin(x).relu()", "x + 1")
    assert run(script, tmp_path).split() == ["0", "1"]  # forward edited
    write("self.lin(x).relu()", "x * 3")
    assert run(script, tmp_path).split() == ["0", "1"]  # helper edited


def test_a_global_value_changed_between_runs_never_loads_the_old_graph(tmp_path):
    s = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[16])
    s["x"] = batch()["x"]
    s.commit()
    del s
    script = """
        import sys, torch, tdstore
        LR = float(sys.argv[1]) if len(sys.argv) > 1 else {lr}
        store = tdstore.open({path!r})
        step = tdstore.compile(lambda td: td["x"] * LR, name="global_lr")
        for _ in range(3):
            assert torch.equal(step(store), store["x"] * LR), step.explain()
        print(step.stats().loads, step.stats().compiles)
    """
    path = str(tmp_path / "s")
    assert run(script.format(lr=0.5, path=path), tmp_path).split() == ["0", "1"]
    assert run(script.format(lr=0.25, path=path), tmp_path).split() == ["1", "1"]
    assert run(script.format(lr=0.5, path=path), tmp_path).split() == ["2", "0"]


# ----------------------------------------------------------------- libtorch's ambient state

def test_autocast_and_the_default_dtype_are_in_the_guard():
    w = torch.randn(8, 4)
    step = tdstore.compile(lambda td: td["x"] @ w, persist=False)
    td = batch()
    assert step(td).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert step(td).dtype == torch.bfloat16 and step(td).dtype == torch.bfloat16
    assert step(td).dtype == torch.float32
    ones = tdstore.compile(lambda td: td["x"] + torch.ones(8), persist=False)
    assert ones(td).dtype == torch.float32
    torch.set_default_dtype(torch.float64)
    try:
        assert ones(td).dtype == torch.float64 and ones(td).dtype == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
    assert step.stats().compiles == 2 and ones.stats().compiles == 2


# ----------------------------------------------------------------- returns

def test_tuples_lists_and_dicts_come_back_as_eager_returns_them():
    @tdstore.compile(persist=False)
    def metrics(td):
        x = td["x"]
        loss, acc = x.pow(2).mean(), (x > 0).float().mean()
        return loss, acc, {"per_row": x.sum(1), "parts": [x.min(), None]}

    for i in range(4):
        td = batch(seed=i)
        loss, acc, extra = metrics(td)
        x = td["x"]
        assert torch.equal(loss, x.pow(2).mean()) and torch.equal(acc, (x > 0).float().mean())
        assert list(extra) == ["per_row", "parts"] and torch.equal(extra["per_row"], x.sum(1))
        assert isinstance(extra["parts"], list) and extra["parts"][1] is None
        assert torch.equal(extra["parts"][0], x.min())
    assert metrics.stats().compiles == 1 and metrics.stats().hits == 3, metrics.explain()


def test_non_tensor_returns_are_refused_naming_the_function():
    @tdstore.compile(persist=False)
    def to_float(td):
        return td["x"].sum().item()

    with pytest.raises(tdstore.DTypeError, match="to_float.*returned builtins.float") as e:
        to_float(batch())
    assert isinstance(e.value, TypeError)
    with pytest.raises(tdstore.DTypeError, match="not callable"):
        tdstore.compile(42)
    with pytest.raises(tdstore.DTypeError, match="takes a tdstore.TensorDict"):
        tdstore.compile(lambda td: td, persist=False)({"x": 1})


def test_code_identity_keeps_graphs_apart(tmp_path):
    s = tdstore.TensorDict.create(str(tmp_path / "s"), batch_size=[16])
    s["x"] = batch()["x"]
    s.commit()

    def fn(td):
        return td["x"] * 2

    tdstore.compile(fn, name="ident", code_identity="v1")(s)
    again = tdstore.compile(fn, name="ident", code_identity="v1")
    again(s)
    other = tdstore.compile(fn, name="ident", code_identity="v2")
    other(s)
    assert again.stats().loads == 1 and other.stats().loads == 0 and other.stats().compiles == 1


def test_deterministic_algorithms_and_inference_mode_are_in_the_guard():
    step = tdstore.compile(lambda td: td["x"] * 2, persist=False)
    step(batch())
    torch.use_deterministic_algorithms(True)
    try:
        step(batch())
    finally:
        torch.use_deterministic_algorithms(False)
    with torch.inference_mode():
        out = step(batch())
    assert out.is_inference() and step.stats().compiles == 3, step.explain()
    assert "deterministic" in step.explain() and "inference_mode" in step.explain()


def test_a_function_reading_where_a_tensors_bytes_are_runs_eagerly():
    base = torch.arange(40.0).reshape(10, 4)
    step = tdstore.compile(lambda td: td["x"] + td["x"].storage_offset(), persist=False)
    for start in (0, 2, 5, 2):  # one spec, other offsets
        td = tdstore.TensorDict({"x": base[start:start + 4]}, batch_size=[4])
        assert torch.equal(step(td), base[start:start + 4] + start * 4), step.explain()
    assert step.stats().compiles == 0 and "storage_offset() of a tensor" in step.explain()
