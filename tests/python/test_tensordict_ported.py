"""Cases ported from tensordict's own tests (pytorch/tensordict 0.4/0.5: test/test_tensordict.py, the
TestTensorDictsBase fixtures of test/_utils_internal.py, test/test_memmap.py), each run on an in-memory dict and
on a store holding the same data, values compared with torch's. Adapted only where tdstore documents a difference
(README "Coming from tensordict", the stubs): keys are "a/b" paths or flat tuples of str, a sub-dict shares its
parent's batch size, a store's batch size is its rows, td[index] = rows takes one index along batch dim 0, new
dicts are in memory, get() without a default gives None, torch functions beyond stack/cat/split/chunk/unbind
refuse TensorDicts. tensordict's zero_() is td[:] = 0 here; its memmap_(prefix) is a store."""
import itertools

import numpy as np
import pytest
import torch

import tdstore

BATCH = [4, 3, 2, 1]  # TestTensorDictsBase's batch size
S = slice(None)


def assert_td_equal(td, ref):
    assert td.keys() == sorted(ref)
    for k, v in ref.items():
        assert torch.equal(td[k], v), k


def zeroed(td):
    """tensordict's td.to_tensordict().zero_()."""
    z = td.clone()
    z[:] = 0
    return z


@pytest.fixture(params=["memory", "store"])
def make(request, tmp_path):
    """make(values, batch_size): the dict in memory (TensorDict.from_dict) or in a store (TensorDict.create,
    keys set, commit; the writer handle is returned). values are copied."""
    paths = itertools.count()

    def make(values, batch_size):
        values = {k: v.clone() for k, v in values.items()}
        if request.param == "memory":
            return tdstore.TensorDict.from_dict(values, batch_size=batch_size)
        td = tdstore.TensorDict.create(tmp_path / f"store{next(paths)}", batch_size=batch_size)
        for k, v in values.items():
            td[k] = v
        td.commit()
        request.addfinalizer(td.close)
        return td
    return make


@pytest.fixture
def ref():
    """TestTensorDictsBase.nested_td's leaves, by "/" path."""
    g = torch.Generator().manual_seed(1)
    return {"a": torch.randn(4, 3, 2, 1, 5, generator=g), "b": torch.randn(4, 3, 2, 1, 10, generator=g),
            "c": torch.randint(10, (4, 3, 2, 1, 3), generator=g),
            "my_nested_td/inner": torch.randn(4, 3, 2, 1, 2, generator=g)}


@pytest.fixture
def td(make, ref):
    """TestTensorDictsBase.nested_td, in memory or in a store."""
    return make(ref, BATCH)


def persisted(td, path):
    """td committed and reopened read-only: a store's own path, or an in-memory dict written into a new
    store (tensordict's td.memmap_(prefix), then TensorDict.load_memmap(prefix))."""
    if td.is_persistent:
        td.commit()
        return tdstore.open(td.path)
    with tdstore.TensorDict.create(path, batch_size=td.batch_size) as s:
        s.update(td)
    return tdstore.open(path)


class TestShapeDeviceBatchSize:
    def test_shape_and_device(self, td, ref, make):
        """ports test_tensordict.py::TestTensorDicts::test_shape, test_indexed_properties and
        TestGeneric::test_no_batch_size"""
        assert td.shape == td.batch_size == torch.Size(BATCH) and len(td) == 4 and td.device.type == "cpu"
        assert td[0].device == td.device and torch.equal(td[0]["c"], ref["c"][0])
        scalar = make({"a": torch.zeros(3, 4)}, [])
        assert scalar.batch_size == torch.Size([]) and len(scalar) == 0
        pytest.raises(tdstore.ArgumentTypeError, iter, scalar).match("keys")  # no rows to iterate over

    def test_iteration(self, make):
        """ports test_memmap.py::TestIndexing::test_iteration and test_iteration_nd"""
        t = torch.rand(10, 5)
        for td, t_ in ((make({"t": t[:, 0]}, [10]), t[:, 0]), (make({"t": t, "n/u": t * 2}, [10, 5]), t)):
            rows = list(td)
            assert len(rows) == len(td) == 10 and all(r.batch_size == td.batch_size[1:] for r in rows)
            assert all(torch.equal(row["t"], t_[i]) for i, row in enumerate(rows))
        assert torch.equal(rows[3]["n/u"], t[3] * 2)

    def test_tensordict_indexing(self, make):
        """ports test_tensordict.py::TestGeneric::test_tensordict_indexing (stack(list(td)) == td)"""
        ref = {"key1": torch.randn(4, 5, 1), "key2": torch.randn(4, 5, 6).double()}
        td = make(ref, [4, 5])
        assert td[2, 2].batch_size == torch.Size([]) and torch.equal(td[2, :2]["key2"], ref["key2"][2, :2])
        assert (torch.stack(list(td), 0) == td).all()
        assert_td_equal(torch.stack([torch.stack(list(row), 0) for row in td], 0), ref)

    def test_cast_device(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_cast_device and test_cast_to (cpu only)"""
        assert td.to("cpu") is td and td.to(device="cpu") is td and td.to(torch.device("cpu")) is td
        assert td.to("cpu:1").device == torch.device("cpu") and td.clone().device == torch.device("cpu")
        assert td.to(tdstore.TensorDict({"x": torch.zeros(1)}, batch_size=[1])) is td  # another dict's device
        assert torch.equal(td.to(device="cpu", dtype=torch.int)["a"], ref["a"].int())
        pytest.raises(TypeError, td.to, torch.randn(3, dtype=torch.half))  # one positional: no example tensor

    def test_casts(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_casts (td.float(), td.half(), ... as td.to(dtype))"""
        for dtype in (torch.float, torch.double, torch.bfloat16, torch.half, torch.int):
            cast = td.to(dtype)
            assert not cast.is_persistent and cast.batch_size == td.batch_size
            assert_td_equal(cast, {k: v.to(dtype) for k, v in ref.items()})

    def test_batchsize_reset(self, make):
        """ports test_tensordict.py::TestGeneric::test_batchsize_reset (a store's is its rows)"""
        ref = {"a": torch.randn(3, 4, 5, 6), "b": torch.randn(3, 4, 5)}
        td = make(ref, [3, 4])
        if td.is_persistent:
            pytest.raises(tdstore.ArgumentError, setattr, td, "batch_size", [3]).match("clone")
            td = td.clone()
        for bs in (torch.Size([3]), [3], (3,)):
            td.batch_size = bs
            assert td.batch_size == torch.Size([3])
        pytest.raises(tdstore.ShapeError, setattr, td, "batch_size", [3, 5]).match("'a'")
        td["c"] = c = torch.randn(3)
        assert torch.equal(td[torch.tensor([1, 2])]["a"], ref["a"][1:]) and torch.equal(td[[1, 2]]["c"], c[1:])
        pytest.raises(IndexError, td.__getitem__, (S, 0))
        grown = td.exclude("c")
        grown.batch_size = torch.Size([3, 4, 5])  # a greater batch size
        pytest.raises(tdstore.ShapeError, grown.set, "d", torch.randn(3, 4, 2))
        assert torch.equal(grown[0, 1, 2]["a"], ref["a"][0, 1, 2])


class TestStackCatSplit:
    def test_cat_td(self, make):
        """ports test_tensordict.py::TestGeneric::test_cat_td (without out=)"""
        d1 = {"key1": torch.randn(4, 5, 6), "key2": torch.randn(4, 5, 10), "key3/key4": torch.randn(4, 5, 10)}
        d2 = {k: torch.randn(4, 10, *v.shape[2:]) for k, v in d1.items()}
        td_cat = torch.cat([make(d1, [4, 5]), make(d2, [4, 10])], 1)
        assert td_cat.batch_size == torch.Size([4, 15])
        assert_td_equal(td_cat, {k: torch.cat([d1[k], d2[k]], 1) for k in d1})

    def test_stack(self, make):
        """ports test_tensordict.py::TestLazyStackedTensorDict::test_stack (dense stacks)"""
        td = make({"a": (a := torch.randn(4, 5, 3))}, [4, 5])
        rebuilt = torch.stack(list(td), 0)
        assert rebuilt.batch_size == td.batch_size and (rebuilt == td).all()
        s = tdstore.TensorDict.stack([td, td.clone()], 1)
        assert s.batch_size == torch.Size([4, 2, 5]) and torch.equal(s["a"], torch.stack([a, a], 1))

    def test_chunk(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_chunk (dim 0, 1; chunks 1, 2)"""
        for dim, chunks in itertools.product([0, 1], [1, 2]):
            parts = td.chunk(chunks, dim)
            assert len(parts) == chunks and (torch.cat(parts, dim) == td).all()
            assert all(torch.equal(p["b"], t) for p, t in zip(parts, ref["b"].chunk(chunks, dim)))

    def test_split(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_split (performer torch and tensordict)"""
        t = torch.zeros(()).expand(td.shape)
        for dim, performer in itertools.product(range(4), ["torch", "tensordict"]):
            for size in (2, [2] * (td.shape[dim] // 2) + [1] * (td.shape[dim] % 2)):
                tds = torch.split(td, size, dim) if performer == "torch" else td.split(size, dim)
                assert [p.batch_size for p in tds] == [e.shape for e in t.split(size, dim=dim)]
                for i, piece in enumerate(tds):
                    assert all(torch.equal(piece[k], v.split(size, dim)[i]) for k, v in ref.items())

    def test_split_with_empty_tensordict(self, make):
        """ports test_tensordict.py::TestGeneric::test_split_with_empty_tensordict and
        test_split_with_negative_dim"""
        assert [p.shape[0] for p in make({}, [10]).split(4, 0)] == [4, 4, 2]
        assert [p.shape for p in make({}, [10, 10, 3]).split([1, 9], 1)] == [(10, 1, 3), (10, 9, 3)]
        ref = {"a": torch.randn(5, 4, 2, 1), "b": torch.randn(5, 4, 1)}
        tds = make(ref, [5, 4]).split([1, 3], -1)
        assert [p.shape for p in tds] == [torch.Size([5, 1]), torch.Size([5, 3])]
        assert torch.equal(tds[0]["a"], ref["a"][:, :1]) and torch.equal(tds[1]["b"], ref["b"][:, 1:])

    def test_split_with_invalid_arguments(self, make):
        """ports test_tensordict.py::TestGeneric::test_split_with_invalid_arguments"""
        pytest.raises(IndexError, make({"a": torch.zeros(2, 1)}, []).split, 1, 0)
        td = make({"a": torch.zeros(3, 2)}, [3, 2])
        for size, dim, error in [("1", 0, TypeError), (["1", 2], 0, TypeError), ([], 0, tdstore.ShapeError),
                                 ([1, 1], 0, tdstore.ShapeError), (1, 2, IndexError), (1, -3, IndexError)]:
            pytest.raises(error, td.split, size, dim)

    def test_unbind(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_unbind (dims 0-3)"""
        for dim in range(4):
            parts = torch.unbind(td, dim=dim)
            assert len(parts) == td.shape[dim] and (td == torch.stack(parts, dim)).all()
            assert (td[(S,) * dim + (0,)] == parts[0]).all()
            assert torch.equal(parts[-1]["c"], ref["c"].unbind(dim)[-1])

    def test_unbind_td(self, make):
        """ports test_tensordict.py::TestGeneric::test_unbind_td and test_unbind_batchsize"""
        td = make({"key1": torch.randn(4, 5, 6), "n/key2": torch.randn(4, 5, 10)}, [4, 5])
        parts = torch.unbind(td, dim=1)
        assert len(parts) == 5 and parts[0].batch_size == td[:, 0].batch_size == torch.Size([4])
        assert torch.equal(parts[3]["n", "key2"], td["n/key2"][:, 3])
        assert td.unbind(0)[0].batch_size == td.unbind(0)[0]["n"].batch_size == torch.Size([5])


class TestRowWrites:
    def test_setitem(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_setitem (its five indices)"""
        for idx in (slice(1), torch.tensor([0]), torch.tensor([0, 1]), range(1), range(2)):
            td[:] = ref
            td[idx] = rows = zeroed(td[idx])
            rest = torch.ones(4, dtype=torch.bool)
            rest[torch.arange(4)[list(idx) if isinstance(idx, range) else idx]] = False
            assert (td[idx]["a"] == 0).all() and torch.equal(td["a"][rest], ref["a"][rest])
            pytest.raises(tdstore.ShapeError, td.__setitem__, idx, torch.cat([rows, rows])).match("broadcast")

    def test_setitem_ellipsis(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_setitem_ellipsis (one index along dim 0 only)"""
        for index in [(..., 0), (0, ...), (0, ..., 0)]:
            pytest.raises(tdstore.IndexError, td.__setitem__, index, zeroed(td[index])).match("batch dim 0")
        td[...] = zeroed(td[...])
        assert (td == 0).all()

    def test_setitem_slice(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_setitem_slice"""
        td[:] = td.clone()
        td[:1] = zeroed(td[:1])
        assert (td[:1] == 0).all() and torch.equal(td["b"][1:], ref["b"][1:])
        td[1:2] = zeroed(td[3])  # a row broadcast over the rows
        assert (td[1:2] == 0).all() and torch.equal(td["c"][2:], ref["c"][2:])
        pytest.raises(tdstore.IndexError, td.__setitem__, (slice(1), 0), zeroed(td[0, 0]))

    def test_masking_set(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_masking_set and test_masked_fill_"""
        rows = torch.tensor([True, False, True, False]).view(4, 1, 1, 1).expand(BATCH)
        td[rows[:, 0, 0, 0]] = -10.0  # masked_fill_(mask, -10.0), a mask along dim 0
        mask = torch.zeros(BATCH, dtype=torch.bool).bernoulli_(0.5, generator=torch.Generator().manual_seed(3))
        n = int(mask.sum())  # tensordict's pseudo_td: zeros with batch size [n]
        td[mask] = tdstore.TensorDict({k: torch.zeros(n, *v.shape[4:], dtype=v.dtype) for k, v in ref.items()},
                                      batch_size=[n])
        for k, v in ref.items():
            assert (td[k][mask] == 0).all() and (td[k][rows & ~mask] == -10).all()
            assert torch.equal(td[k][~rows & ~mask], v[~rows & ~mask])

    def test_update_at_(self, td, ref, tmp_path):
        """ports test_tensordict.py::TestTensorDicts::test_update_at_ (as td[0] = td0); a store stages it"""
        td[0] = zeroed(td[1])
        assert (td[0] == 0).all() and torch.equal(td["a"][1:], ref["a"][1:])
        assert not td.is_persistent or torch.equal(tdstore.open(td.path)["a"], ref["a"])  # not committed yet
        r = persisted(td, tmp_path / "p")
        assert (r[0] == 0).all() and torch.equal(r["c"][1:], ref["c"][1:])

    def test_setitem_nested_dict_value(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_setitem_nested_dict_value and test_setitem_string"""
        td1, td2, e = td.clone(), td.clone(), torch.randn(4, 3, 2, 1, 10)
        td1["d"], td2["d"] = {"e": e}, tdstore.TensorDict({"e": e}, batch_size=BATCH)
        assert (td1 == td2).all() and torch.equal(td1["d/e"], e)
        td["d"] = e[..., :5]
        assert "d" in td.keys() and torch.equal(td["d"], e[..., :5])

    def test_setitem_nestedtuple(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_setitem_nestedtuple (keys are flat tuples of str)"""
        key, z = (" a ", ("little", "story"), "about", ("myself",)), torch.zeros(td.shape)
        pytest.raises(tdstore.ArgumentTypeError, td.__setitem__, key, z)
        td[" a ", "little", "story", "about", "myself"] = z
        assert (td[" a /little/story/about/myself"] == 0).all()

    def test_nested_td_index(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_nested_td_index, TestGeneric::test_setitem_nested"""
        td["sub_td"] = {"sub_sub_td": {"a": (a := torch.zeros([*BATCH, 2, 2]))}}
        assert torch.equal(td["sub_td"]["sub_sub_td"]["a"], td["sub_td", "sub_sub_td", "a"])
        td["sub_td", "sub_sub_td"] = tdstore.TensorDict({"a": a + 1}, batch_size=BATCH)
        assert (td["sub_td/sub_sub_td/a"] == 1).all()
        td.set(("sub_td", "sub_sub_td"), tdstore.TensorDict({"b": a + 2}, batch_size=BATCH))
        assert (td["sub_td", "sub_sub_td", "b"] == 2).all() and "sub_td/sub_sub_td/a" not in td

    def test_tensordict_set(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_tensordict_set (numpy values; no set_, set_at_)"""
        td.set("key1", np.ones(shape=(4, 3, 2, 1, 10)))
        assert (td.get("key1") == 1).all() and td["key1"].dtype == torch.float64
        pytest.raises(tdstore.ShapeError, td.set, "key1", np.ones(shape=(5, 10)))
        td["key1"] = np.zeros(shape=(4, 3, 2, 1, 10))
        assert (td.get("key1") == 0).all()


class TestUpdateEqualityRepr:
    def test_update(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_update and TestGeneric::test_update_nested_dict"""
        z = torch.zeros(td.shape)
        td.update({"x": z, ("somenested", "z"): z, "somenested/zz": z + 1})
        assert td.keys() == ["a", "b", "c", "my_nested_td/inner", "somenested/z", "somenested/zz", "x"]
        td["newnested"] = {"z": z}
        td.update({"newnested": {"y": z + 2}})
        td.update({"newnested": {"x": z, "w": z, "z": z + 3}})
        assert td["newnested"].keys() == ["w", "x", "y", "z"] and torch.equal(td["newnested/y"], z + 2)
        assert torch.equal(td["newnested/z"], z + 3) and torch.equal(td["somenested", "zz"], z + 1)
        pytest.raises(tdstore.KeyError, td.update, {"newnested": z}).match("prefix")  # no leaf is a prefix

    def test_update_from_tensordict(self, td, ref):
        """ports test_tensordict.py::TestGeneric::test_update_ (from a TensorDict, then from its to_dict())"""
        td.update(other := zeroed(td.select("a", "my_nested_td")))
        assert (td.select("a", "my_nested_td") == 0).all() and torch.equal(td["b"], ref["b"])
        td.update((other == 0).to(torch.float32).to_dict())
        assert (td["a"] == 1).all() and (td["my_nested_td/inner"] == 1).all()

    def test_equal(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_equal, test_equal_dict and test_equal_other"""
        assert (td == td.clone()).all() and (td == td.to_dict()).all() and not (td != td.clone()).any()
        assert (td != zeroed(td)).any() and (td != zeroed(td).to_dict()).any()
        assert not td == "z" and td != "z"

    def test_equal_scalars(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_equal_float, test_equal_int and test_equal_tensor"""
        eq = td == torch.zeros([], dtype=torch.int)
        assert torch.equal(eq["c"], ref["c"] == 0) and eq["a"].dtype == torch.bool
        td[:] = 0
        assert (td == 0.0).all() and (td.clone() != 1.0).all() and not (td == 1.0).any() and (td == 0).all()
        assert (td == torch.zeros([], dtype=torch.int)).all() and (td != torch.ones([], dtype=torch.int)).all()

    def test_getitem_nested(self, make):
        """ports test_tensordict.py::TestGeneric::test_getitem_nested"""
        td = make({"a/b/c": (tensor := torch.randn(4, 5, 6, 7))}, [4])
        sub = tdstore.TensorDict({"b/c": tensor}, batch_size=[4])
        assert (td["a"] == sub).all() and (td["a", "b"] == sub["b"]).all() and (td.get("a") == sub).all()
        assert (td["a", "b", "c"] == tensor).all() and (td.get(("a", "b", "c")) == tensor).all()
        assert td.shape == torch.Size([4]) and not (td["a"] != sub).any()

    def test_repr(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_repr, TestTensorDictRepr::test_repr_nested and
        test_repr_batch_size_update (tdstore's format: the batch size, then each key's dtype and shape)"""
        text = repr(td)
        assert str(td) == text and text.startswith("TensorDict(batch_size=[4, 3, 2, 1], keys=4")
        assert all(line in text for line in ("a: float32 [4, 3, 2, 1, 5]", "c: int64 [4, 3, 2, 1, 3]",
                                             "my_nested_td/\n    inner: float32 [4, 3, 2, 1, 2]"))
        assert ("store=" in text) == td.is_persistent and (not td.is_persistent or td.path in text)
        regrouped = td.clone()
        regrouped.batch_size = torch.Size([4, 3, 2])
        assert repr(regrouped).startswith("TensorDict(batch_size=[4, 3, 2]")


class TestOpenModesAndErrors:
    def test_open_modes(self, td, ref, tmp_path):
        """ports test_h5.py's PersistentTensorDict file modes: "r" reads, "r+" writes, "w" is refused typed"""
        r = persisted(td, tmp_path / "p")
        pytest.raises(tdstore.ArgumentError, tdstore.open, r.path, "w").match("create")  # h5py: create/truncate
        pytest.raises(ValueError, tdstore.open, r.path, "a")
        assert not r.is_writable and tdstore.open(r.path, "r").keys() == sorted(ref)
        td.close()  # a store's writer releases its lock
        with tdstore.open(r.path, "r+") as w:
            w["z"] = torch.ones(BATCH)
        assert r.refresh() and (r["z"] == 1).all()
        assert_td_equal(r.exclude("z"), ref)

    def test_delitem_read_only(self, td, ref, tmp_path):
        """ports test_tensordict.py::TestTensorDicts::test_delitem and test_remove (memmap td: ReadOnlyError)"""
        del td["a"]
        assert "a" not in td.keys() and "b" in td
        r = persisted(td, tmp_path / "p")
        for write in (lambda: r.__delitem__("b"), lambda: r.__setitem__("z", torch.zeros(BATCH)),
                      lambda: r.__setitem__(0, 0), lambda: r.rename_key_("b", "q"), lambda: r.pop("b")):
            pytest.raises(tdstore.ReadOnlyError, write)
        assert_td_equal(r, {k: v for k, v in ref.items() if k != "a"})

    def test_missing_key_error(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_tensordict_set's KeyError ("... with keys")"""
        pytest.raises(tdstore.KeyError, td.__getitem__, "smartypants").match("'smartypants' not found.*'a'")
        pytest.raises(KeyError, td.__getitem__, "my_nested_td/iner").match("did you mean 'my_nested_td/inner'")

    def test_err_msg_missing_nested(self, make):
        """ports test_tensordict.py::TestErrorMessage::test_err_msg_missing_nested and
        TestTensorDicts::test_default_nested"""
        td, default = make({"a": torch.zeros(())}, []), torch.randn(())
        pytest.raises(KeyError, td.__getitem__, ("a", "b")).match("'a/b' not found; did you mean 'a'")
        assert td.get(("shiver", "my", "timbers"), default) is default
        assert torch.equal(td.get("a", default), torch.zeros(()))


class TestMethods:
    def test_apply(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_apply and test_apply_other (inplace=False)"""
        assert_td_equal(td.apply(lambda x: x + 1), {k: v + 1 for k, v in ref.items()})
        assert_td_equal(td.apply(lambda x, y: x + y, td.clone()), {k: v * 2 for k, v in ref.items()})
        assert_td_equal(td, ref)

    def test_select(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_select and test_select_exception (strict=True)"""
        td2 = td.select("a", ("my_nested_td", "inner"))
        assert td2 is not td and not td2.is_persistent and td2.clone().keys() == ["a", "my_nested_td/inner"]
        assert torch.equal(td2["a"], ref["a"]) and td.keys() == sorted(ref)
        pytest.raises(KeyError, td.select, "tada").match("'tada'")

    def test_select_nested(self, make):
        """ports test_tensordict.py::TestGeneric::test_select_nested"""
        t1, t2 = torch.rand(4, 5, 6, 7), torch.rand(4, 5, 6, 7)
        td = make({"a": torch.rand(4, 3), "b": torch.rand(4, 2), "nested/double_nested/t1": t1,
                   "nested/double_nested/t2": t2}, [4])
        selected = td.select("b", ("nested", "double_nested", "t2"))
        assert selected.keys() == ["b", "nested/double_nested/t2"] and "nested/double_nested" in selected
        assert torch.equal(selected["nested/double_nested/t2"], t2) and len(td.keys()) == 4
        assert td.select("nested").keys() == ["nested/double_nested/t1", "nested/double_nested/t2"]

    def test_exclude(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_exclude and test_exclude_missing"""
        td2 = td.exclude("a")
        assert td2 is not td and "a" not in td2.clone().keys() and "a" in td
        assert_td_equal(td2, {k: v for k, v in ref.items() if k != "a"})
        assert (td == td.exclude("this key is missing", ("this one too",))).all()

    def test_exclude_nested(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_exclude_nested"""
        td["newnested", "first"] = first = torch.randn(td.shape)
        td2 = td.exclude("a", ("newnested", "first"))
        assert "a" in td.keys() and "a" not in td2.keys() and "newnested/first" in td and "newnested" not in td2
        assert td.exclude("my_nested_td").keys() == ["a", "b", "c", "newnested/first"]
        assert torch.equal(td.exclude("a")["newnested/first"], first)

    def test_pop(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_pop"""
        assert torch.equal(td.pop("a"), ref["a"]) and "a" not in td.keys()
        default = torch.zeros_like(ref["b"])
        assert torch.equal(td.pop("b", default), ref["b"]) and "b" not in td and td.pop("z", default) is default
        pytest.raises(KeyError, td.pop, "z").match("'z'")
        assert torch.equal(td.pop("my_nested_td")["inner"], ref["my_nested_td/inner"]) and td.keys() == ["c"]

    def test_rename_key(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_rename_key (always safe=True)"""
        pytest.raises(KeyError, td.rename_key_, "a", "b").match("exists")
        assert td.rename_key_("a", "z") is td
        pytest.raises(KeyError, td.__getitem__, "a")
        assert td.get("a") is None and "a" not in td.keys() and torch.equal(td.get("z"), ref["a"])
        td.set("z", new_z := torch.randn_like(ref["a"]))
        assert torch.equal(td.get("z"), new_z)

    def test_rename_key_nested(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_rename_key_nested"""
        td["nested", "conflict"], td["nested", "first"] = torch.zeros(td.shape), torch.ones(td.shape)
        pytest.raises(KeyError, td.rename_key_, ("nested", "conflict"), "b").match("exists")
        td.rename_key_(("nested", "first"), "second")
        assert (td["second"] == 1).all() and "nested/first" not in td.keys()
        td.rename_key_("second", ("nested", "back"))
        assert (td["nested", "back"] == 1).all() and "second" not in td.keys()

    def test_flatten_unflatten_keys(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_flatten_keys and test_unflatten_keys"""
        inner = torch.arange(24 * 6.0).reshape(*BATCH, 2, 3)
        td["nested_tensordict"] = {"a": torch.zeros(*BATCH, 2), "nested_nested_tensordict": {"a": inner}}
        for sep in ",-":
            flat = td.flatten_keys(separator=sep)
            assert flat is not td and not flat.is_persistent and all("/" not in k for k in flat.keys())
            assert torch.equal(flat[sep.join(["nested_tensordict", "nested_nested_tensordict", "a"])], inner)
            back = flat.unflatten_keys(separator=sep)
            assert (td == back).all() and back.keys() == td.keys()

    def test_flatten_unflatten_key_collision(self, make):
        """ports test_tensordict.py::TestGeneric::test_flatten_unflatten_key_collision (separator ".")"""
        z = torch.zeros(3)
        td1, td4, td5 = (make(v, []) for v in ({"a.b.c": z, "a/b/c": z}, {"a.b.c.d": z, "a/b/c": z},
                                              {"a.b": z, "a/b/c": z}))
        pytest.raises(KeyError, td1.flatten_keys, ".").match("two keys become 'a.b.c'")
        for td in (td1, td4, td5):
            pytest.raises(KeyError, td.unflatten_keys, ".")
        assert {"a.b.c.d", "a.b.c"} == set(td4.flatten_keys(".").keys())
        assert {"a.b", "a.b.c"} == set(td5.flatten_keys(".").keys())

    def test_numpy(self, td, ref):
        """ports test_tensordict.py (0.5)::TestTensorDicts::test_numpy"""
        arrays = td.numpy()
        assert isinstance(arrays["a"], np.ndarray) and isinstance(arrays["my_nested_td"]["inner"], np.ndarray)
        assert_td_equal(tdstore.TensorDict(arrays, batch_size=BATCH), ref)

    def test_empty(self, td, make):
        """ports test_tensordict.py::TestTensorDicts::test_empty and TestGeneric::test_empty"""
        empty = td.empty()
        assert empty.shape == td.shape and empty.keys() == [] and empty.device is None  # no leaf, no device
        empty.set("a", torch.zeros(()).expand(td.shape))
        assert empty.device == td.device and (empty["a"] == 0).all() and "a" in td
        scalar = make({"a": torch.zeros(()), "b/c": torch.zeros(()), "b/d/e": torch.zeros(())}, [])
        assert scalar.empty().keys() == [] and scalar.keys() == ["a", "b/c", "b/d/e"]

    def test_setdefault(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_setdefault_existing_key, test_setdefault_missing_key,
        test_setdefault_nested and TestGeneric::test_setdefault_nested"""
        expected = torch.ones_like(ref["a"])
        assert torch.equal(td.setdefault("a", torch.ones_like(ref["b"])), ref["a"])
        assert torch.equal(td.setdefault("z", expected), expected) and torch.equal(td["z"], expected)
        del td["a"]
        td.set("a", tdstore.TensorDict({"b/c": ref["b"][..., :5]}, batch_size=BATCH))
        assert torch.equal(td.setdefault(("a", "b", "c"), expected), ref["b"][..., :5])
        assert torch.equal(td.setdefault(("a", "b", "d"), expected), expected)
        assert torch.equal(td["a/b/d"], expected)


class TestIndexing:
    def test_getitem_ellipsis(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_getitem_ellipsis"""
        for actual, expected in [(..., (S,) * 4), ((..., 0), (S, S, S, 0)), ((0, ...), (0, S, S, S)),
                                 ((0, ..., 0), (0, S, S, 0))]:
            assert td[actual].shape == torch.zeros(BATCH)[expected].shape and (td[actual] == td[expected]).all()
            assert_td_equal(td[actual], {k: v[expected] for k, v in ref.items()})

    def test_getitem_range(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_getitem_range, test_getitem_string and
        test_getitem_nestedtuple"""
        assert (td[range(2)] == td[[0, 1]]).all() and (td[range(1), range(1)] == td[[0], [0]]).all()
        assert td[range(1), range(1)].shape == td[[0], [0]].shape == torch.Size([1, 2, 1])
        assert (td[:, range(2)] == td[:, [0, 1]]).all() and (td[..., range(1)] == td[..., [0]]).all()
        assert torch.equal(td[:, range(2)]["b"], ref["b"][:, :2]) and torch.equal(td["a"], ref["a"])
        assert torch.equal(td[("a",)], ref["a"]) and torch.equal(td.get(("a",)), ref["a"])

    def test_index_none(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_index_none (None is refused: a TypeError)"""
        for idx in [None, (..., None), (None, ...), (S, None), (0, None)]:
            pytest.raises(TypeError, td.__getitem__, idx).match("None")

    def test_masking(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_masking and TestGeneric::test_mask_td"""
        mask = torch.zeros(BATCH, dtype=torch.bool).bernoulli_(0.8, generator=torch.Generator().manual_seed(5))
        assert mask.any() and not mask.all() and td[mask].batch_size == torch.Size([int(mask.sum())])
        assert_td_equal(td[mask], {k: v[mask] for k, v in ref.items()})
        dim0 = torch.tensor([True, False, False, True])
        assert_td_equal(td[dim0], {k: v[dim0] for k, v in ref.items()})
        pytest.raises(TypeError, torch.masked_select, td, mask)  # td[mask] instead

    def test_index_tensor_nd(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_index_tensor_nd_names (without names)"""
        index = torch.tensor([[0, 1, 2], [1, 2, 0], [2, 0, 1]])
        example = torch.zeros(()).expand(td.shape)
        for idx in (index, index.numpy()):
            for full in [(S, idx), (0, idx), (..., idx, S, S)]:
                assert td[full].shape == example[tuple(index if i is idx else i for i in full)].shape
            assert_td_equal(td[:, idx], {k: v[:, index] for k, v in ref.items()})

    def test_getitem_batch_size(self, make):
        """ports test_tensordict.py::TestGeneric::test_getitem_batch_size (and the values)"""
        g = torch.Generator().manual_seed(0)
        td = make({"t": (t := torch.randn(10, 7, 11, 5, 2, generator=g))}, [10, 7, 11, 5])
        tensors = tuple(torch.tensor(i) for i in ([1, 2, 3], [2, 3, 4], [0, 10, 2], [2, 4, 1]))
        for idx in [(S,), S, (3, 4), (3, S, slice(2, 2, 2)), (torch.tensor([1, 2, 3]),), [1, 2, 3], tensors,
                    torch.zeros(10, 7, 11, 5, dtype=torch.bool).bernoulli_(generator=g),
                    torch.zeros(10, 7, 11, dtype=torch.bool).bernoulli_(generator=g),
                    (0, torch.zeros(7, dtype=torch.bool).bernoulli_(generator=g))]:
            assert td[idx].batch_size == t[idx].shape[:-1] and torch.equal(td[idx]["t"], t[idx])

    def test_simple_range_double_index(self, make):
        """ports test_memmap.py::TestIndexing::test_simple_index, test_range_index, test_double_index (views)"""
        td = make({"t": (t := torch.rand(10))}, [10])
        assert td[0]["t"].shape == torch.Size([]) and td[0]["t"] == t[0]
        y = td[:2]
        assert y["t"].shape == torch.Size([2]) and y["t"].data_ptr() == td["t"].data_ptr()  # the same mapping
        y = y[:1]
        assert y["t"].shape == torch.Size([1]) and y["t"].data_ptr() == td["t"].data_ptr()
        assert td.shape == torch.Size([10]) and torch.equal(y["t"], t[:1])


class TestCloneAndPersistence:
    def test_clone_td(self, td, ref):
        """ports test_tensordict.py::TestTensorDicts::test_clone_td (torch.clone(td) is refused: td.clone())"""
        clone = td.clone()
        assert (clone == td).all() and clone.batch_size == td.batch_size and not clone.is_persistent
        clone[:] = 0
        assert clone["a"].data_ptr() != td["a"].data_ptr() and (clone == 0).all()
        assert_td_equal(td, ref)
        pytest.raises(TypeError, torch.clone, td)

    def test_items_values_keys(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_items_values_keys and test_from_empty"""
        for _ in range(2):
            keys, values, items = td.keys(), td.values(), td.items()
            assert len(keys) == len(values) == len(items) and keys == sorted(keys)
            built1, built2 = (tdstore.TensorDict({}, batch_size=td.shape) for _ in range(2))
            for (key, value), value2 in zip(items, values):
                built1.set(key, value)
                built2.set(key, value2)
            assert (td == built1).all() and (td == built2).all() and built1.device == td.device
            td.set("x", torch.randn_like(td.get("a")))

    def test_to_dict_nested(self, td):
        """ports test_tensordict.py::TestTensorDicts::test_to_dict_nested and test_nested_dict_init"""
        td["d"] = tdstore.TensorDict({"e": torch.randn(4, 3, 2, 1, 10)}, batch_size=BATCH)
        as_dict = td.to_dict()
        assert isinstance(as_dict["my_nested_td"], dict) and torch.equal(as_dict["d"]["e"], td["d/e"])
        assert all(isinstance(v, torch.Tensor) for v in [as_dict["a"], *as_dict["d"].values()])
        assert (tdstore.TensorDict.from_dict(as_dict, batch_size=BATCH) == td).all()
        assert (tdstore.TensorDict(as_dict, batch_size=BATCH) == td).all()

    def test_memmap_prefix(self, td, ref, tmp_path):
        """ports test_tensordict.py::TestTensorDicts::test_memmap_prefix and test_memmap_ (reopened equal)"""
        r = persisted(td, tmp_path / "p")
        assert r.is_persistent and r.batch_size == td.batch_size and (r == td).all()  # meta.json's "shape"
        assert_td_equal(r, ref)

    def test_memmap_data_type(self, make, tmp_path):
        """ports test_memmap.py::test_memmap_data_type (its 7 dtypes, 2 shapes) and test_memmap_zero_value"""
        dtypes = [torch.half, torch.float, torch.double, torch.int, torch.uint8, torch.long, torch.bool]
        for shape in ([2], [1, 2]):
            values = {str(d): torch.tensor([1, 0], dtype=d).reshape(shape) for d in dtypes}
            r = persisted(make({**values, "z": torch.zeros(*shape, 4)}, shape[:1]), tmp_path / str(shape[0]))
            for key, t in values.items():
                assert r[key].dtype == t.dtype and r[key].shape == t.shape and (r[key] == t).all()
                assert (r[key].contiguous() == t).all() and r[key].clone().dtype == t.dtype
            assert torch.all(r["z"] + torch.ones(*shape, 4) == 1)

    def test_existing(self, td, ref, tmp_path):
        """ports test_memmap.py::test_existing (creating over existing data is refused; the data stays)"""
        r = persisted(td, tmp_path / "p")
        pytest.raises(tdstore.Error, tdstore.TensorDict.create, r.path, BATCH).match("exists")
        assert_td_equal(tdstore.open(r.path), ref)

    def test_existing_error_is_a_builtin_error(self, td, tmp_path):
        """ports test_memmap.py::test_existing (tensordict raises a builtin RuntimeError there);
        here a tdstore.IOError, also an OSError, as creating a dataset over other data"""
        r = persisted(td, tmp_path / "p")
        pytest.raises(OSError, tdstore.TensorDict.create, r.path, BATCH).match("exists")
        pytest.raises(OSError, tdstore.Dataset.create, r.path).match("exists")
