"""The differential fuzzer of tdstore.compile (compile_fuzz.py) under pytest.

test_compiled_calls_equal_eager runs it for TDSTORE_FUZZ_SECONDS (default 60) and fails with
every mismatch class found and its minimized reproducer. The other tests check the fuzzer itself:
its grammar runs, it is deterministic per seed, it finds nothing when "compiling" is running
eagerly (its comparisons have no false positives: RNG, sets, effects) and it does find the
planted bugs of a stale cache and of a body run twice."""
import os
import random

import pytest

import compile_fuzz as fz
import tdstore


class _Stub:
    """A stand-in for tdstore.compile(fn, ...): runs fn eagerly (`runs` times per call), or
    `stale`: returns the first call's result while the batch size stays the same."""

    def __init__(self, fn, runs=1, stale=False):
        self.fn, self.runs, self.stale, self.cache = fn, runs, stale, {}

    def __call__(self, td):
        if self.stale and len(td) in self.cache:
            return self.cache[len(td)]
        for _ in range(self.runs):
            out = self.fn(td)
        self.cache[len(td)] = out
        return out

    def stats(self):
        return tdstore.CompileStats()

    def explain(self):
        return ""


def _fuzz_with(monkeypatch, tmp_path, count, **stub):
    monkeypatch.setattr(fz.tdstore, "compile", lambda fn, **kw: _Stub(fn, **stub))
    return fz.fuzz(count=count, repro_dir=str(tmp_path), verify=False, log=lambda *a: None)


def test_every_fragment_runs_eagerly_with_each_mutation():
    for group in fz.GROUPS:
        for variant in group:
            fr = fz.fragment(random.Random(0), variant)
            muts = [f"mut_0_{j}" for j in range(len(fr.muts))]
            prog = fz.Program(0, [(0, fr)], "f", "dict", [("mut", m) for m in muts], False)
            assert all(f"def {m}():" in prog.source() for m in muts)
            ns = fz.fresh(prog.source(), 0)
            ns["f"](fz.make_td(8, 0, ("mask",)))
            for m in muts:
                ns[m]()
                ns["f"](fz.make_td(6, 1, ()))


def test_programs_are_deterministic_per_seed():
    for seed in range(50):
        a, b = fz.generate(seed), fz.generate(seed)
        assert a.source() == b.source() and a.schedule == b.schedule, seed
    assert len({fz.generate(s).source() for s in range(50)}) > 40


def test_eager_stand_in_shows_no_mismatch(monkeypatch, tmp_path):
    rep = _fuzz_with(monkeypatch, tmp_path, 300)
    assert not rep["classes"] and not rep["errors"], fz.format_report(rep)


@pytest.mark.parametrize("stub,kinds", [({"stale": True}, {"return", "td"}),
                                        ({"runs": 2}, {"rng", "state", "stdout", "td"})])
def test_planted_bugs_are_found_and_minimized(monkeypatch, tmp_path, stub, kinds):
    rep = _fuzz_with(monkeypatch, tmp_path, 80, **stub)
    assert {k for k, _ in rep["classes"]} & kinds, fz.format_report(rep)
    for c in rep["classes"].values():
        src = open(c["repro"][0]).read()
        assert "check_call(" in src and src.count("\ndef mut_") <= 2, src


def test_compiled_calls_equal_eager():
    seconds = float(os.environ.get("TDSTORE_FUZZ_SECONDS", "60"))
    repros = os.environ.get("TDSTORE_FUZZ_REPROS", "/tmp/fuzz-repros/pytest")
    rep = fz.fuzz(seconds=seconds, repro_dir=repros, verify=False, log=lambda *a: None)
    if rep["classes"] or rep["errors"]:
        shown = []
        for (kind, cats), c in rep["classes"].items():  # the program and its schedule
            text = open(c["repro"][0]).read()
            src = text.index("SRC = ")
            shown.append(f"===== {kind}: {'+'.join(cats)}: {c['repro'][0]}\n"
                         + text[text.index("Mismatch: "):].split("\n", 1)[0] + "\n"
                         + text[src:text.index('"""', src + 10) + 3]
                         + text[text.index("\nstore = None"):])
        pytest.fail(fz.format_report(rep) + "\n\n" + "\n".join(shown), pytrace=False)
