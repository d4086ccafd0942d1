"""Bad input from Python gets a tdstore.Error that is also the matching builtin, naming what
was wrong, never a crash or a raw torch/pybind11 message."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tdstore


def test_a_lazy_property_or_row_feature_returning_a_non_tensor_is_refused(tmp_path):
    td = tdstore.TensorDict({"x": torch.ones(4)}, batch_size=[4])
    with pytest.raises(tdstore.DTypeError, match="lazy property 'p'.*returned float") as e:
        td.get_or_compute("p", ["x"], lambda d: 1.5)
    assert isinstance(e.value, TypeError) and "p" not in td
    with pytest.raises(tdstore.DTypeError, match="lazy property 'q'.*returned NoneType"):
        td.get_or_compute("q", ["x"], lambda d: None)
    store = tdstore.TensorDict.create(tmp_path / "s", batch_size=[8])
    store["x"] = torch.arange(8.0)
    store.commit()
    loader = tdstore.Loader(store, batch_size=4, shuffle=False, num_workers=0)
    loader.add_feature("f", ["x"], lambda rows: rows["x"].tolist())
    with pytest.raises(tdstore.DTypeError, match="row feature 'f'.*returned list"):
        list(loader)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_full_file_system_is_an_oserror_never_a_crash(tmp_path):
    script = textwrap.dedent("""
        import sys, torch, tdstore
        path = sys.argv[1]
        try:
            td = tdstore.TensorDict.create(path, batch_size=[16])
        except tdstore.IOError as e:
            assert isinstance(e, OSError) and "No space left" in str(e), e
            print("create failed")
            sys.exit(0)
        td["a"] = torch.ones(16, 8)
        td.commit()
        try:
            for i in range(64):
                td[f"k{i}"] = torch.full((16, 4096), float(i))
                td.commit()
        except tdstore.IOError as e:
            assert isinstance(e, OSError) and "No space left" in str(e), e
            print("commit failed")
        del td
        r = tdstore.open(path)
        assert r.verify() == [], r.verify()
        assert torch.equal(r["a"], torch.ones(16, 8))
        for k in r.keys():
            if k != "a":
                assert torch.equal(r[k], torch.full((16, 4096), float(k[1:])))
        print("reopened", len(r.keys()))
    """)
    seen = set()
    for size_kib in (256, 9 * 1024, 10 * 1024, 12 * 1024):
        mnt = tmp_path / f"m{size_kib}"
        mnt.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs",
                           str(mnt)]).returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        try:
            r = subprocess.run([sys.executable, "-c", script, str(mnt / "s")],
                               capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, (size_kib, r.returncode, r.stdout, r.stderr)
            seen.add(r.stdout.split()[0] + " " + r.stdout.split()[1])
        finally:
            subprocess.run(["umount", "-l", str(mnt)])
    assert "create failed" in seen and "commit failed" in seen, seen


@pytest.fixture(params=["memory", "store"])
def some_dict(request, tmp_path):
    if request.param == "memory":
        return tdstore.TensorDict({"x": torch.zeros(4)}, batch_size=[4])
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[4])
    td["x"] = torch.zeros(4)
    td.commit()
    return td


def test_values_that_are_no_tensors_are_refused_naming_the_key(some_dict):
    import numpy as np
    cases = [(None, "NoneType"), ("abcd", "str"), (b"ab", "bytes"), (["a", "b", "c", "d"], "list"),
             (np.array([object()] * 4), "dtype object"), (np.array(["a"] * 4), "dtype <U1"),
             (np.zeros(4, dtype=np.uint16), "uint16")]
    for value, what in cases:
        with pytest.raises(tdstore.DTypeError, match="key 'bad'") as e:
            some_dict["bad"] = value
        assert what in str(e.value) and isinstance(e.value, TypeError), (what, e.value)
        with pytest.raises(tdstore.DTypeError, match="key 'bad'"):
            some_dict.set("bad", value)
    assert "bad" not in some_dict


def test_numpy_arrays_in_another_byte_order_or_with_negative_strides_are_stored_as_values(
        some_dict):
    import numpy as np
    some_dict["be"] = np.arange(4, dtype=">f4")
    some_dict["rev"] = np.arange(4.0)[::-1]
    assert torch.equal(some_dict["be"], torch.arange(4.0))
    assert torch.equal(some_dict["rev"], torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64))


def test_nested_and_unallocatable_tensors_are_refused(some_dict):
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(tdstore.DTypeError, match="'n'.*nested tensors.*ragged"):
        some_dict["n"] = nested
    if some_dict.is_persistent:  # an in-memory dict keeps the view as it is
        with pytest.raises(tdstore.CapacityError, match="'huge'.*cannot be allocated"):
            some_dict["huge"] = torch.zeros(4, 1).expand(4, 2**42)  # 64 TiB once contiguous
    assert "n" not in some_dict


def test_keys_that_are_not_utf8_and_odd_indices(some_dict):
    bad = b"\xff\xfe".decode("utf-8", "surrogateescape")
    with pytest.raises(tdstore.KeyError, match="not valid Unicode"):
        some_dict[bad] = torch.zeros(4)
    with pytest.raises(tdstore.KeyError, match="not valid Unicode"):
        some_dict["ok", bad]
    with pytest.raises(tdstore.DTypeError, match="index None"):
        some_dict[None]
    everything = some_dict[...]
    assert everything.keys() == some_dict.keys() and torch.equal(everything["x"], some_dict["x"])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs another user to lack the permission")
def test_a_store_that_cannot_be_read_is_a_permission_problem_not_a_format_one(tmp_path):
    path = tmp_path / "s"
    td = tdstore.TensorDict.create(path, batch_size=[1])
    td.commit()
    del td
    os.chmod(path, 0o000)
    os.chmod(tmp_path, 0o755)
    try:
        r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                            sys.executable, "-c",
                            f"import tdstore\ntry:\n    tdstore.open({str(path)!r})\n"
                            "except tdstore.Error as e:\n    print(type(e).__name__, e)"],
                           capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    finally:
        os.chmod(path, 0o755)
    assert r.stdout.startswith("IOError") and "Permission denied" in r.stdout, r.stdout + r.stderr


def test_zero_dim_and_fortran_numpy_arrays_keep_their_shape():
    import numpy as np
    td = tdstore.TensorDict({}, batch_size=[])
    td["scalar"] = np.array(3.0)
    td["matrix"] = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    assert td["scalar"].shape == () and float(td["scalar"]) == 3.0
    assert torch.equal(td["matrix"], torch.arange(6.0, dtype=torch.float64).reshape(2, 3))


def test_an_out_of_range_row_is_an_index_error(tmp_path):
    td = tdstore.TensorDict({"x": torch.arange(4.0)}, batch_size=[4])
    for bad in (lambda: td[4], lambda: td[-5], lambda: td[torch.tensor([0, 9])]):
        with pytest.raises(IndexError, match="out of range") as e:
            bad()
        assert isinstance(e.value, tdstore.IndexError) and isinstance(e.value, tdstore.ShapeError)
    ds = tdstore.Dataset.create(tmp_path / "d")
    shard = ds.shard(0)
    shard.append(td)
    shard.commit()
    del shard
    ds.publish()
    with pytest.raises(IndexError, match="row 4 out of range"):
        ds[4]


def test_usage_errors_are_also_builtins(tmp_path):
    """Errors once raised as a bare tdstore.Error (no builtin base): each is now the class of
    what went wrong, so `except OSError` / `except ValueError` catch them as they would."""
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[8])
    td["x"] = torch.arange(8.0)
    td.commit()
    with pytest.raises(tdstore.IOError, match="exists") as e:  # a store or a dataset over data
        tdstore.TensorDict.create(tmp_path / "s", batch_size=[8])
    assert isinstance(e.value, OSError)
    with pytest.raises(OSError, match="exists"):
        tdstore.Dataset.create(tmp_path / "s")
    loader = tdstore.Loader(td, batch_size=4, shuffle=False, num_workers=0)
    it = iter(loader)
    next(it)
    with pytest.raises(tdstore.ArgumentError, match="during an epoch") as e:  # a Loader in use
        loader.add_feature("f", ["x"], lambda rows: rows["x"] * 2)
    assert isinstance(e.value, ValueError)
    state = loader.state_dict()
    other = tdstore.Loader(td, batch_size=2, shuffle=False, num_workers=0)
    with pytest.raises(ValueError, match="Loader position"):  # a position of another loader
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="function name"):  # checked at the first call
        tdstore.compile(lambda d: d["x"] + 1, name="a/b")(td)
    sub = tdstore.TensorDict({"a/x": torch.ones(2)}, batch_size=[2])
    with pytest.raises(ValueError, match="sub-dict"):  # an append through a sub-dict handle
        sub["a"].append(tdstore.TensorDict({"x": torch.ones(1)}, batch_size=[1]))
