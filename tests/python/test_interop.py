"""Interop: numpy arrays where tensors go, to_tensordict() when the tensordict package is there
(a lazy import: tdstore does not depend on it)."""
import sys
import types

import numpy as np
import pytest
import torch

import tdstore


def test_numpy_arrays_are_accepted_where_tensors_are(tmp_path):
    td = tdstore.TensorDict.create(str(tmp_path / "np"), batch_size=[4])
    td["a"] = np.arange(8, dtype=np.int16).reshape(4, 2)
    td.set("b", np.ones(4, dtype=np.float64))
    mem = tdstore.TensorDict({"c": np.zeros((4, 1), dtype=np.uint8)}, batch_size=[4])
    assert td["a"].dtype == torch.int16 and torch.equal(td["a"], torch.arange(8, dtype=torch.int16).reshape(4, 2))
    assert td["b"].dtype == torch.float64 and mem["c"].dtype == torch.uint8
    assert torch.equal(td[torch.tensor([2, 0])]["a"], td[np.array([2, 0])]["a"])


def test_to_tensordict_passes_the_same_tensors(monkeypatch, tmp_path):
    made = []

    class FakeTensorDict:  # records what tdstore hands to tensordict.TensorDict
        def __init__(self, source, batch_size):
            made.append((source, batch_size))

    monkeypatch.setitem(sys.modules, "tensordict", types.SimpleNamespace(TensorDict=FakeTensorDict))
    td = tdstore.TensorDict.create(str(tmp_path / "td"), batch_size=[3])
    td["next", "obs"] = torch.randn(3, 2)
    td["r"] = torch.zeros(3)
    td.commit()
    assert isinstance(td.to_tensordict(), FakeTensorDict)
    source, batch = made[0]
    assert batch == torch.Size([3]) and set(source) == {"next", "r"}
    assert source["next"]["obs"].data_ptr() == td["next", "obs"].data_ptr()  # zero-copy views


def test_to_tensordict_without_the_package_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensordict", None)  # makes `import tensordict` fail
    with pytest.raises(ImportError, match="tensordict"):
        tdstore.TensorDict({"a": torch.ones(2)}, batch_size=[2]).to_tensordict()


def test_python_benchmark_prints_a_ratio_per_case():
    import os
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "bench_python.py"), "--cases=get,compile"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if "ratio" in l]
    assert len(lines) == 4 and all("target" in l for l in lines), r.stdout
