"""The first commands a newcomer types: every entry point takes a bare relative name, a `../`
path and a symlinked directory, run from a scratch working directory (the rest of the suite
uses absolute temporary paths, which hid `TensorDict.create("mystore")` failing with an untyped
"cannot make absolute path")."""
import os
import subprocess

import numpy as np
import pytest
import torch

import tdstore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("TDSTORE_CLI", os.path.join(ROOT, "build", "tools", "tdstore"))


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A scratch working directory with a subdirectory `work` (the cwd) and a symlink to it."""
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(work, tmp_path / "link")
    monkeypatch.chdir(work)
    return tmp_path


def cli(*args):
    r = subprocess.run([CLI, *args], capture_output=True, text=True)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


@pytest.mark.parametrize("name", ["mystore", "./mystore", "nested/new/mystore", "../mystore",
                                  "../link/mystore"])
def test_a_store_is_created_and_opened_by_a_relative_name(scratch, name):
    td = tdstore.TensorDict.create(name, batch_size=[3])
    td["x"] = torch.arange(3.0)
    td.commit()
    del td
    for handle in (tdstore.open(name), tdstore.TensorDict.open(name), tdstore.open(name, "r+")):
        assert torch.equal(handle["x"], torch.arange(3.0))
    assert "x" in cli("ls", name) and "format version" in cli("info", name)
    assert "1 keys intact" in cli("verify", name)


def test_a_dataset_is_created_and_opened_by_a_relative_name(scratch):
    ds = tdstore.Dataset.create("ds")
    shard = ds.shard(0)
    shard.append(tdstore.TensorDict({"x": torch.arange(4.0)}, batch_size=[4]))
    shard.commit()
    del shard
    ds.publish()
    os.chdir(scratch / "link")
    assert tdstore.Dataset.open("ds").rows == 4
    assert tdstore.Dataset.open("../work/ds").rows == 4


def test_the_cli_imports_compacts_and_exports_by_relative_names(scratch):
    np.save("a.npy", np.arange(5.0))
    cli("import", "imported", "x=a.npy")
    assert torch.equal(tdstore.open("imported")["x"], torch.arange(5.0, dtype=torch.float64))
    os.mkdir("sub")
    os.chdir("sub")
    cli("compact", "../imported")
    cli("export", "../imported", "--npy", "out")
    assert np.array_equal(np.load(os.path.join("out", "x.npy")), np.arange(5.0))
    cli("import", "../../link/second", "y=../a.npy")  # through the symlink to work/
    assert tdstore.open("../second").keys() == ["y"]
