"""The compile cache from Python: the four scenarios of the compile-cache issue, gradients
through `inputs`, and several Python threads calling one compiled function."""
import threading

import torch

import tdstore


def test_optional_field_compiles_twice():
    @tdstore.compile(persist=False)
    def masked(td):
        x = td["x"]
        return x * td["mask"] if "mask" in td else x + 1

    for i in range(20):
        d = {"x": torch.arange(3.0) + i, **{f"noise{k}": torch.zeros(3) for k in range(i)}}
        if i % 2:
            d["mask"] = torch.full((3,), 2.0)
        want = (torch.arange(3.0) + i) * 2 if i % 2 else torch.arange(3.0) + i + 1
        assert torch.equal(masked(tdstore.TensorDict(d, batch_size=[3])), want), i
    assert masked.stats().compiles == 2, masked.explain()
    assert masked.stats().hits == 18


def test_lazy_accumulation_compiles_twice():
    @tdstore.compile(persist=False)
    def lazy(td):
        if "prop" not in td:
            td["prop"] = td["x"] * 2
        return td["prop"] + 1

    td = tdstore.TensorDict({"x": torch.ones(2, 3)}, batch_size=[2])
    for _ in range(12):
        assert torch.equal(lazy(td), torch.full((2, 3), 3.0))
    assert lazy.stats().compiles == 2, lazy.explain()  # absent, then present


def test_enriching_loop_compiles_once():
    w = torch.randn(4, 2)

    @tdstore.compile(persist=False)
    def enrich(td):
        td["pred"] = td["obs"] @ w

    td = tdstore.TensorDict({"obs": torch.randn(8, 4)}, batch_size=[8])
    for i in range(10):
        assert enrich(td) is None  # a function returning nothing
        assert torch.allclose(td["pred"], td["obs"] @ w)
        td[f"metric{i}"] = torch.zeros(8)  # the loop enriches the batch as well
        td["obs"] = torch.randn(8, 4)
    assert enrich.stats().compiles == 1, enrich.explain()


def test_parameters_in_inputs_receive_gradients_equal_to_eager():
    torch.manual_seed(0)
    w1 = (torch.randn(4, 8) * 0.5).requires_grad_()
    w2 = (torch.randn(8, 1) * 0.5).requires_grad_()
    e1 = w1.detach().clone().requires_grad_()
    e2 = w2.detach().clone().requires_grad_()

    def loss_of(td, a, b):
        return ((torch.tanh(td["x"] @ a) @ b).squeeze(1) - td["y"]).pow(2).mean()

    step = tdstore.compile(lambda td: loss_of(td, w1, w2), name="py_grad_step", persist=False,
                           inputs=[w1, w2])
    for i in range(6):
        td = tdstore.TensorDict({"x": torch.randn(16, 4), "y": torch.randn(16)}, batch_size=[16])
        loss = step(td)
        loss.backward()
        eager = loss_of(td, e1, e2)
        eager.backward()
        assert torch.allclose(loss, eager, atol=1e-6), i
        assert torch.allclose(w1.grad, e1.grad, atol=1e-5) and torch.allclose(w2.grad, e2.grad, atol=1e-5), i
        with torch.no_grad():  # SGD: the next call must see the updated weights
            for p in (w1, w2, e1, e2):
                p -= p.grad * 0.1
                p.grad = None
    assert step.stats().compiles == 1 and step.stats().hits == 5, step.explain()


def test_several_threads_call_one_compiled_function():
    @tdstore.compile(persist=False)
    def fn(td):
        y = td["x"] @ td["x"].T
        return y.sum(1) + (td["b"] if "b" in td else 0)

    errors, results = [], []

    def work(t):
        try:
            for i in range(60):
                n = 8 + (i + t) % 3  # three sizes: misses from several threads at once
                d = {"x": torch.randn(n, 16)}
                if i % 2:
                    d["b"] = torch.ones(n)
                td = tdstore.TensorDict(d, batch_size=[n])
                got = fn(td)
                want = (d["x"] @ d["x"].T).sum(1) + (d["b"] if i % 2 else 0)
                results.append(torch.allclose(got, want, atol=1e-4))
                fn.stats()  # takes the function's lock: must not wait for it holding the GIL
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)  # a cap against deadlock, not a speed limit
    assert not any(t.is_alive() for t in threads), "a thread is stuck: deadlock"
    assert not errors, errors
    assert len(results) == 240 and all(results)
    s = fn.stats()
    # Per answer of `"b" in td`: two sizes traced, then one entry for every size (dynamic dim 0).
    assert s.compiles == 4 and s.entries == 2 and s.hits + s.compiles + s.fallbacks == 240, fn.explain()


def test_compiling_beside_a_thread_that_draws_random_numbers():
    # The generator is process-wide: another thread's draws during a trace are neither a
    # difference in this function's draws nor something to undo (undoing them would hand that
    # thread its numbers again).
    @tdstore.compile(persist=False, dynamic_batch=False)
    def fn(td):
        return td["x"] * 2 + 1

    drawn, stop = [], threading.Event()

    def draw():
        while not stop.is_set():
            drawn.append(torch.randn(64, dtype=torch.float64))  # float32 values collide by chance

    t = threading.Thread(target=draw)
    t.start()
    try:
        for n in range(1, 9):  # eight sizes (the cache limit): eight traces while it draws
            td = tdstore.TensorDict({"x": torch.ones(n, 3)}, batch_size=[n])
            assert torch.equal(fn(td), torch.full((n, 3), 3.0))
    finally:
        stop.set()
        t.join()
    s = fn.stats()
    assert s.compiles == 8 and s.fallbacks == 0, fn.explain()
    values = torch.cat(drawn)
    assert values.unique().numel() == values.numel(), "the other thread was handed numbers twice"


def test_one_graph_for_every_batch_size():
    w, bias = torch.randn(784, 10), torch.randn(10)

    @tdstore.compile(persist=False)
    def logits(td):
        x = td["image"].view(td["image"].shape[0], -1)  # a size read in Python stays symbolic
        td["logits"] = x @ w + bias
        return td["logits"].softmax(1)[:, td["label"][0]]

    @tdstore.compile(persist=False, dynamic_batch=False)
    def exact(td):
        return td["image"].flatten(1) @ w + bias

    for n in (1, 7, 96, 128, 200, 1000, 128):
        td = tdstore.TensorDict({"image": torch.randn(n, 28, 28), "label": torch.zeros(n, dtype=torch.long)},
                                batch_size=[n])
        want = td["image"].flatten(1) @ w + bias
        assert torch.allclose(logits(td), want.softmax(1)[:, 0], atol=1e-5), n
        assert torch.allclose(td["logits"], want, atol=1e-5), n
        assert torch.allclose(exact(td), want, atol=1e-5), n
    assert logits.stats().compiles == 2 and logits.stats().entries == 1, logits.explain()
    assert "became dynamic in dim 0" in logits.explain()
    assert exact.stats().entries == 6, exact.explain()


def test_a_size_read_in_python_keeps_exact_entries():
    @tdstore.compile(persist=False)
    def per_row(td):
        return td["x"].sum(1) / len(td)  # len() reads the batch size: a constant of the trace

    for n in (128, 96, 7):
        td = tdstore.TensorDict({"x": torch.ones(n, 3)}, batch_size=[n])
        assert torch.allclose(per_row(td), torch.full((n,), 3.0 / n)), n
    assert per_row.stats().entries == 3, per_row.explain()


def test_a_branch_on_the_batch_size_never_serves_the_wrong_branch():
    # Both branches agree on the first batch of size 50 (non-negative data); an output
    # comparison would admit 50 into the dynamic entry. The trace at 50 differs: refused.
    @tdstore.compile(persist=False)
    def branchy(td):
        x = td["x"]
        return x.abs() if x.shape[0] > 100 else x * 1

    for n in (128, 200):
        branchy(tdstore.TensorDict({"x": torch.randn(n, 3)}, batch_size=[n]))
    assert branchy.stats().entries == 1, branchy.explain()
    benign = torch.rand(50, 3)
    assert torch.equal(branchy(tdstore.TensorDict({"x": benign}, batch_size=[50])), benign)
    for _ in range(3):
        x = torch.randn(50, 3)
        assert torch.equal(branchy(tdstore.TensorDict({"x": x}, batch_size=[50])), x), branchy.explain()


def test_a_size_whose_eager_run_raises_always_raises():
    @tdstore.compile(persist=False)
    def picky(td):
        x = td["x"]
        if x.shape[0] == 13:
            raise ValueError("13 rows")
        return x * 2

    for n in (128, 200):
        picky(tdstore.TensorDict({"x": torch.randn(n, 3)}, batch_size=[n]))
    for _ in range(3):
        try:
            picky(tdstore.TensorDict({"x": torch.randn(13, 3)}, batch_size=[13]))
        except ValueError:
            continue
        raise AssertionError("a graph served a size whose eager run raises: " + picky.explain())


def test_compile_takes_its_defaults_from_the_engine():
    """One owner: tdstore.compile's defaults are the C++ CompileOptions' (as the Loader's are
    LoaderOptions'), so help() shows what the engine does."""
    import inspect
    engine = tdstore._tdstore._compile_defaults
    assert set(engine) == {"cache_limit", "persist", "check_first_run", "dynamic_batch",
                           "code_identity"}
    params = inspect.signature(tdstore.compile).parameters
    for name, value in engine.items():
        assert params[name].default == value, name
