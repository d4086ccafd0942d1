"""Python threads never corrupt a store or crash the interpreter: calls on one handle from
several threads are serialized by the binding (the engine allows one mutating call at a time),
with the GIL released around the I/O. Each case runs in its own process: a crash fails it
instead of the suite."""
import subprocess
import sys
import textwrap


def run(body, tmp_path):
    code = textwrap.dedent(body)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_four_threads_writing_one_handle_and_two_reading_keep_the_store_exact(tmp_path):
    out = run("""
        import sys, threading, torch, tdstore
        path = sys.argv[1] + "/s"
        w = tdstore.TensorDict.create(path, batch_size=[64])
        w["seed"] = torch.zeros(64)
        w.commit()
        r = tdstore.open(path)
        errors = []

        def writer(t):
            try:
                for i in range(150):
                    w[f"t{t}/k{i % 10}"] = torch.full((64, 32), float(t * 1000 + i))
                    if i % 5 == 4:
                        w.commit()
                w.commit()
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        def reader():
            try:
                for _ in range(300):
                    r.refresh()
                    for k in r.keys():
                        v = r[k]
                        assert v.shape[0] == 64, k
                        assert bool((v == v.reshape(64, -1)[0, 0]).all()), k  # never torn
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        threads += [threading.Thread(target=reader) for _ in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
        del w, r
        s = tdstore.open(path)
        assert s.verify() == [], s.verify()
        for t in range(4):
            for k in range(10):
                last = max(i for i in range(150) if i % 10 == k)
                assert torch.equal(s[f"t{t}/k{k}"], torch.full((64, 32), float(t * 1000 + last)))
        print("ok", len(s.keys()))
    """, tmp_path)
    assert out.startswith("ok 41")


def test_threads_computing_lazy_properties_on_one_handle(tmp_path):
    out = run("""
        import sys, threading, torch, tdstore
        path = sys.argv[1] + "/s"
        w = tdstore.TensorDict.create(path, batch_size=[16])
        w["x"] = torch.arange(16.0)
        w.commit()
        errors, calls = [], []

        def compute(t):
            try:
                for i in range(40):
                    key = f"p{t}_{i % 4}"
                    def fn(d, k=i % 4):
                        calls.append(key)
                        return d["x"] * (k + 1)
                    v = w.get_or_compute(key, ["x"], fn, "v1")
                    assert torch.equal(v, torch.arange(16.0) * (i % 4 + 1)), key
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        threads = [threading.Thread(target=compute, args=(t,)) for t in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
        assert len(calls) == 16, len(calls)  # each property computed once
        del w
        s = tdstore.open(path)
        assert s.verify() == []
        print("ok", len(s.keys()))
    """, tmp_path)
    assert out.startswith("ok 17")


def test_a_child_forked_while_another_thread_is_inside_a_call_can_use_its_handles(tmp_path):
    # A thread is inside get_or_compute (holding the binding's lock, its fn waiting) when the
    # main thread forks: the child's calls must not wait for a lock no thread of it holds.
    out = run("""
        import os, sys, threading, torch, tdstore
        path = sys.argv[1] + "/s"
        w = tdstore.TensorDict.create(path, batch_size=[4])
        w["x"] = torch.arange(4.0)
        w.commit()
        r = tdstore.open(path)
        inside, release = threading.Event(), threading.Event()

        def fn(d):
            inside.set()
            release.wait()
            return d["x"] * 2

        t = threading.Thread(target=lambda: w.get_or_compute("x2", ["x"], fn, "v1"))
        t.start()
        inside.wait()
        pid = os.fork()
        if pid == 0:
            ok = torch.equal(r["x"], torch.arange(4.0)) and r.keys() == ["x"]
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        release.set()
        t.join()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        print("ok")
    """, tmp_path)
    assert out.startswith("ok")


def test_a_loader_storing_row_features_while_another_thread_commits_keeps_the_store(tmp_path):
    # The loader stores its row features into its source at the end of each epoch, from the
    # iterating thread; another thread sets attributes and commits on the same handle. Every
    # write the engine makes on a handle is serialized with the handle's other writes.
    out = run("""
        import sys, threading, torch, tdstore
        path = sys.argv[1] + "/s"
        w = tdstore.TensorDict.create(path, batch_size=[512])
        w["x"] = torch.arange(512 * 8, dtype=torch.float32).reshape(512, 8)
        w.commit()
        stop = threading.Event()
        errors = []

        def committer():
            i = 0
            try:
                while not stop.is_set():
                    w.attrs[f"a{i % 7}"] = str(i)
                    w[f"k{i % 3}"] = torch.full((512,), float(i))
                    w.commit()
                    i += 1
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

        t = threading.Thread(target=committer)
        t.start()
        for epoch in range(6):
            loader = tdstore.Loader(w, batch_size=64, num_workers=2, keys=["x"])
            loader.add_feature(f"f{epoch}", ["x"], lambda r: r["x"].sum(1))
            for _ in loader:
                pass
            del loader
        stop.set()
        t.join()
        assert not errors, errors
        w.commit()
        del w
        r = tdstore.open(path)
        assert r.verify() == {} or not r.verify(), r.verify()
        for epoch in range(6):
            assert torch.equal(r[f"f{epoch}"], r["x"].sum(1)), epoch
        print("ok")
    """, tmp_path)
    assert "ok" in out


def run_bounded(body, tmp_path, seconds=120):
    """As run(), but a hang is a failure after `seconds` (the case deadlocked), not a stuck suite."""
    code = textwrap.dedent(body)
    try:
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                           timeout=seconds)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"no answer in {seconds} s: the calls deadlocked") from None
    assert r.returncode == 0, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_a_lazy_propertys_function_may_read_its_dict_from_a_thread_pool(tmp_path):
    # The function ran holding the binding's lock, and the pool's threads waited for it forever.
    out = run_bounded("""
        import sys, torch, tdstore
        from concurrent.futures import ThreadPoolExecutor
        td = tdstore.TensorDict.create(sys.argv[1] + "/s", batch_size=[8])
        td["x"] = torch.arange(8.)
        td.commit()

        def parts(d):
            with ThreadPoolExecutor(4) as pool:
                halves = list(pool.map(lambda s: d["x"][s].sum(), [slice(0, 4), slice(4, 8)]))
            return (halves[0] + halves[1]).expand(8).clone()

        v = td.get_or_compute("total", ["x"], parts)
        again = tdstore.open(sys.argv[1] + "/s").get("total")
        print(v[0].item(), again[0].item())
    """, tmp_path)
    assert out.split() == ["28.0", "28.0"]


def test_a_lazy_property_whose_dependency_changes_in_another_thread_is_not_stored(tmp_path):
    # With the lock lent out while the function runs, another thread can write a dependency:
    # the result was not computed from the inputs its provenance would name, so it is refused.
    out = run_bounded("""
        import sys, threading, torch, tdstore
        td = tdstore.TensorDict.create(sys.argv[1] + "/s", batch_size=[4])
        td["x"] = torch.zeros(4)
        td.commit()

        def changes_x(d):
            t = threading.Thread(target=lambda: d.__setitem__("x", torch.ones(4)))
            t.start(); t.join()
            return torch.zeros(4)

        try:
            td.get_or_compute("p", ["x"], changes_x)
            print("stored")
        except tdstore.Error as e:
            print("refused", "changed while its function ran" in str(e), td.lazy_valid("p"))
    """, tmp_path)
    assert out.split() == ["refused", "True", "False"]


def test_a_compiled_body_may_wait_for_threads_that_call_tdstore(tmp_path):
    out = run_bounded("""
        import sys, threading, torch, tdstore
        other = tdstore.TensorDict.from_dict({"y": torch.ones(4)}, batch_size=[4])
        td = tdstore.TensorDict.from_dict({"x": torch.arange(4.)}, batch_size=[4])

        @tdstore.compile
        def f(d):
            box = []
            t = threading.Thread(target=lambda: box.append(other["y"].sum().item()))
            t.start(); t.join()
            return d["x"] * 2

        for _ in range(3):
            r = f(td)
        print(r.tolist(), f.stats().compiles + f.stats().hits + f.stats().fallbacks >= 3)
    """, tmp_path)
    assert out.strip() == "[0.0, 2.0, 4.0, 6.0] True"


def test_a_compiled_body_may_wait_for_threads_calling_another_compiled_function(tmp_path):
    # Found by an adversarial review: with the engine lock lent out during a body, a thread that
    # took it and then waited for the function's own lock deadlocked against the body.
    out = run_bounded("""
        import sys, threading, torch, tdstore

        @tdstore.compile
        def g(d):
            return d["x"] + 1

        @tdstore.compile
        def f(d):
            out = []
            ts = [threading.Thread(target=lambda: out.append(g(d))) for _ in range(2)]
            for t in ts: t.start()
            for t in ts: t.join()
            return d["x"] * 2 + out[0] + out[1]

        td = tdstore.TensorDict.from_dict({"x": torch.arange(4.)}, batch_size=[4])
        for _ in range(3):
            r = f(td)
        results = []
        def caller():
            for _ in range(20):
                results.append(f(td).tolist())
        ts = [threading.Thread(target=caller) for _ in range(3)]
        for t in ts: t.start()
        for t in ts: t.join()
        print(r.tolist(), all(x == r.tolist() for x in results), len(results))
    """, tmp_path)
    assert out.strip() == "[2.0, 6.0, 10.0, 14.0] True 60"
