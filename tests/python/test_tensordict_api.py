"""tensordict's API as its users write it (issue 48): len and iter along the batch dim, shape,
device, to(), batch_size =, torch.stack/cat, row assignment, ==, repr, and the pipeline methods;
on in-memory dicts and stores alike. Cases follow tensordict's own tests (test_generic.py,
test_methods) where they exist."""
import random

import numpy as np
import pytest
import torch

import tdstore


def make(kind, tmp_path, n=4):
    """The same dict in memory or in a store (read-write handle)."""
    values = {"a": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
              "n/x": torch.arange(n), "n/y": torch.ones(n, 2, dtype=torch.uint8)}
    if kind == "memory":
        td = tdstore.TensorDict(batch_size=[n])
    else:
        td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[n])
    for k, v in values.items():
        td[k] = v.clone()
    if kind == "store":
        td.commit()
    return td, values


KINDS = ["memory", "store"]


@pytest.mark.parametrize("kind", KINDS)
def test_len_and_iter_follow_the_batch_dim(kind, tmp_path):
    td, values = make(kind, tmp_path)
    rows = list(td)
    assert len(rows) == len(td) == 4
    for i, row in enumerate(rows):
        assert row.batch_size == torch.Size([])
        assert torch.equal(row["a"], values["a"][i]) and torch.equal(row["n/x"], values["n/x"][i])
    assert "a" in td and "n" in td and "z" not in td  # `in` tests keys, as before
    assert td.keys() == ["a", "n/x", "n/y"]
    with pytest.raises(TypeError):
        iter(tdstore.TensorDict(batch_size=[]))


@pytest.mark.parametrize("kind", KINDS)
def test_shape_device_and_to(kind, tmp_path):
    td, values = make(kind, tmp_path)
    assert td.shape == td.batch_size == torch.Size([4])
    assert td.device == torch.device("cpu")
    assert td.to("cpu") is td and td.to(torch.device("cpu")) is td
    half = td.to(torch.float16)
    assert not half.is_persistent and {half[k].dtype for k in half.keys()} == {torch.float16}
    assert torch.equal(half["n/x"], values["n/x"].half())
    with pytest.raises(TypeError):
        td.to(3.5)
    assert tdstore.TensorDict(batch_size=[2]).device is None  # no leaves: no device


def test_batch_size_setter_where_the_leaves_allow(tmp_path):
    td = tdstore.TensorDict(batch_size=[4])
    td["a"] = torch.zeros(4, 3, 2)
    td["b"] = torch.zeros(4, 3)
    td.batch_size = [4, 3]
    assert td.batch_size == torch.Size([4, 3]) and td[0].batch_size == torch.Size([3])
    with pytest.raises(tdstore.ShapeError, match="'b'"):
        td.batch_size = [4, 3, 2]
    td.batch_size = []
    assert td.batch_size == torch.Size([])
    store, _ = make("store", tmp_path)
    with pytest.raises(tdstore.ArgumentError, match="clone"):
        store.batch_size = [2, 2]
    store.batch_size = [4]  # its own: nothing to do


@pytest.mark.parametrize("kind", KINDS)
def test_torch_stack_and_cat(kind, tmp_path):
    td, values = make(kind, tmp_path)
    s = torch.stack([td, td.clone()], 0)
    assert s.batch_size == torch.Size([2, 4]) and torch.equal(s["a"][1], values["a"])
    c = torch.cat([td, td], dim=0)
    assert c.batch_size == torch.Size([8]) and torch.equal(c["n/x"][4:], values["n/x"])
    assert [p.batch_size[0] for p in torch.split(td, 3)] == [3, 1]
    assert len(torch.unbind(td)) == 4 and len(torch.chunk(td, 2)) == 2
    with pytest.raises(TypeError):
        torch.add(td, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_equality_is_leafwise(kind, tmp_path):
    td, values = make(kind, tmp_path)
    eq = td == td.clone()
    assert isinstance(eq, tdstore.TensorDict) and eq.batch_size == td.batch_size
    assert eq.all() and eq["a"].dtype == torch.bool
    other = td.clone()
    other["a"] = other["a"] + (torch.arange(4) == 2).float().unsqueeze(1)
    assert not (td == other).all() and (td != other).any()
    assert (td != other)["a"].nonzero()[:, 0].unique().tolist() == [2]
    assert (td == 1)["n/y"].all() and not (td == 1)["a"].all()
    assert (td == {"a": values["a"], "n": {"x": values["n/x"], "y": values["n/y"]}}).all()
    with pytest.raises(KeyError, match="'n/y'"):
        td == td.exclude("n/y")
    with pytest.raises(ValueError, match="ambiguous"):
        bool(td == td)
    with pytest.raises(TypeError):
        hash(td)


def test_repr_lists_every_key_with_dtype_and_shape(tmp_path):
    td, _ = make("store", tmp_path)
    td.set("c", torch.zeros(4, 5, dtype=torch.float64), compression="zstd")
    text = repr(td)
    assert text.splitlines()[0].startswith("TensorDict(batch_size=[4]")
    assert "a: float32 [4, 3]" in text and "x: int64 [4]" in text and "y: uint8 [4, 2]" in text
    assert "c: float64 [4, 5] (compressed)" in text and str(tmp_path / "s") in text


@pytest.mark.parametrize("kind", KINDS)
def test_pipeline_methods(kind, tmp_path):
    td, values = make(kind, tmp_path)
    parts = td.split([1, 3])
    assert [p.batch_size[0] for p in parts] == [1, 3] and torch.equal(parts[1]["a"], values["a"][1:])
    with pytest.raises(tdstore.ShapeError, match="sum"):
        td.split([1, 1])
    assert [p.batch_size[0] for p in td.chunk(3)] == [2, 2]
    assert all(torch.equal(r["n/x"], values["n/x"][i]) for i, r in enumerate(td.unbind(0)))
    flat = td.flatten_keys()
    assert flat.keys() == ["a", "n.x", "n.y"] and flat.unflatten_keys().keys() == td.keys()
    assert flat.flatten_keys("_").keys() == ["a", "n.x", "n.y"]
    arrays = td.numpy()
    assert isinstance(arrays["n"]["x"], np.ndarray) and (arrays["a"] == values["a"].numpy()).all()
    e = td.empty()
    assert e.keys() == [] and e.batch_size == td.batch_size
    assert torch.equal(td.setdefault("a", torch.zeros(4, 3)), values["a"])
    assert torch.equal(td.setdefault("d", torch.full((4,), 7)), torch.full((4,), 7))
    assert td.rename_key_("d", "e") is td and "e" in td and "d" not in td
    with pytest.raises(KeyError, match="exists"):
        td.rename_key_("e", "a")
    with pytest.raises(KeyError):
        td.rename_key_("missing", "f")
    assert torch.equal(td.pop("e"), torch.full((4,), 7)) and "e" not in td
    assert td.pop("missing", None) is None
    sub = td.pop("n")
    assert sub.keys() == ["x", "y"] and torch.equal(sub["x"], values["n/x"]) and "n" not in td
    with pytest.raises(KeyError):
        td.pop("n")
    if kind == "store":
        td.commit()
        r = tdstore.open(td.path)
        assert r.keys() == ["a"]


def test_rename_keeps_a_stored_key_as_it_was(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[3])
    td.set("z", torch.arange(3.0), compression="zstd:5")
    td.set_ragged("r", [torch.arange(2), torch.arange(5), torch.arange(1)])
    td.commit()
    td.rename_key_("z", "w/z").rename_key_("r", "w/r")
    td.commit()
    r = tdstore.open(tmp_path / "s")
    assert r.keys() == ["w/r", "w/z"] and r.compression_of("w/z").startswith("zstd:5")
    assert r.is_ragged("w/r") and torch.equal(r.get_ragged("w/r")[1], torch.tensor([0, 2, 7, 8]))


# ---- td[index] = rows


def test_row_assignment_in_memory_writes_in_place():
    a = torch.zeros(5, 2)
    td = tdstore.TensorDict(batch_size=[5])
    td["a"] = a
    td[1] = {"a": torch.ones(2)}
    td[3:5] = 2
    td[torch.tensor([True, False, False, False, False])] = td[1:2]
    assert torch.equal(a[:, 0], torch.tensor([1.0, 1, 0, 2, 2]))  # the leaf itself
    # Memory the dict does not own is copied first, never written.
    arr = np.zeros((5, 2), dtype=np.float32)
    td["b"] = torch.from_numpy(arr)
    td["e"] = torch.zeros(1, 2).expand(5, 2)
    td[0] = 9
    assert (arr == 0).all() and td["b"][0].tolist() == [9, 9] and td["e"][1].tolist() == [0, 0]


def test_row_assignment_on_a_store_is_staged_and_keeps_tensors_read_before(tmp_path):
    td, values = make("store", tmp_path)
    td.set("c", values["a"] * 2, compression="zstd")
    td.commit()
    before = td["a"]
    reader = tdstore.open(tmp_path / "s")
    td[2] = {"a": torch.full((3,), -1.0), "c": torch.full((3,), -2.0)}
    td[torch.tensor([0, 3])] = {"n": {"x": torch.tensor([10, 11])}}
    assert torch.equal(before, values["a"])  # read before: unchanged
    assert td["a"][2].tolist() == [-1, -1, -1] and td["n/x"].tolist() == [10, 1, 2, 11]
    assert torch.equal(reader["a"], values["a"])  # not committed
    td.rollback()
    assert torch.equal(td["a"], values["a"])
    td[-1] = {"c": torch.zeros(3)}
    td.commit()
    assert reader.refresh() and reader["c"][3].tolist() == [0, 0, 0]
    assert reader.compression_of("c") != "none" and reader.verify() == []
    with pytest.raises(tdstore.ReadOnlyError):
        reader[0] = 0


@pytest.mark.parametrize("kind", KINDS)
def test_row_assignment_refusals_are_typed(kind, tmp_path):
    td, values = make(kind, tmp_path)
    with pytest.raises(tdstore.KeyError, match="'zz'"):
        td[0] = {"zz": torch.zeros(3)}
    with pytest.raises(tdstore.ShapeError, match="'a'.*\\[4\\].*\\[3\\]"):
        td[0] = {"a": torch.zeros(4)}
    with pytest.raises(tdstore.IndexError):
        td[7] = 0
    with pytest.raises(tdstore.IndexError):
        td[:, 0] = 0
    with pytest.raises(tdstore.IndexError):
        td[torch.tensor([0, 9])] = 0
    with pytest.raises(tdstore.ShapeError):
        td[torch.tensor([True])] = 0
    with pytest.raises(tdstore.ArgumentError):
        td[::-1] = 0
    with pytest.raises(TypeError):
        td[0] = "text"
    assert all(torch.equal(td[k], v) for k, v in values.items())  # nothing written


def test_row_assignment_refuses_ragged_keys(tmp_path):
    td = tdstore.TensorDict(batch_size=[2])
    td.set_ragged("r", [torch.arange(2), torch.arange(3)])
    with pytest.raises(tdstore.ShapeError, match="'r'.*set_ragged"):
        td[0] = {"r": torch.zeros(2)}


@pytest.mark.parametrize("kind", KINDS)
def test_row_assignment_matches_torch_setitem(kind, tmp_path):
    """Differential: random indices and values written into the dict and, by torch's own
    t[index] = value, into plain tensors; equal after every write (and after reopening)."""
    rng = random.Random(48)
    n = 7
    td, _ = make(kind, tmp_path, n)
    if kind == "store":
        td.set("z", torch.randn(n, 1024), compression="zstd:1:4096")  # a block per row
        td.commit()
    ref = {k: td[k].clone() for k in td.keys()}
    for step in range(60):
        kind_of_index = rng.choice(["int", "slice", "tensor", "mask", "list"])
        if kind_of_index == "int":
            idx = rng.randrange(-n, n)
        elif kind_of_index == "slice":
            idx = slice(rng.choice([None, rng.randrange(-n, n)]), rng.choice([None, rng.randrange(-n, n + 2)]),
                        rng.choice([None, 1, 2, 3]))
        elif kind_of_index == "tensor":
            idx = torch.tensor([rng.randrange(-n, n) for _ in range(rng.randrange(0, 4))], dtype=torch.long)
        elif kind_of_index == "mask":
            idx = torch.tensor([rng.random() < 0.5 for _ in range(n)])
        else:
            idx = [rng.randrange(0, n) for _ in range(2)]
        keys = rng.sample(sorted(ref), rng.randrange(1, len(ref) + 1))
        rows = {}
        for k in keys:
            shape = ref[k][idx].shape
            if rng.random() < 0.3 and len(shape) > 1:
                shape = shape[1:]  # broadcast along the rows
            rows[k] = (torch.randn(shape) * 10).to(torch.float64)  # cast to the key's dtype
        value = tdstore.TensorDict(batch_size=[])
        for k, v in rows.items():
            value[k] = v
        td[idx] = value
        for k, v in rows.items():
            ref[k][idx] = v.to(ref[k].dtype)
        for k in ref:
            assert torch.equal(td[k], ref[k]), (step, k, idx)
        if kind == "store" and step % 20 == 19:
            td.commit()
            r = tdstore.open(td.path)
            assert all(torch.equal(r[k], ref[k]) for k in ref)


# ---- inside compiled functions: each idiom compiled equals eager, call after call


def _pair(rows, keys=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    values = {f"k{i}": torch.randn(rows, 3, generator=g) for i in range(keys)}
    values["x"] = torch.randn(rows, 2, generator=g)
    return (tdstore.TensorDict({k: v.clone() for k, v in values.items()}, batch_size=[rows]),
            tdstore.TensorDict({k: v.clone() for k, v in values.items()}, batch_size=[rows]))


@pytest.mark.parametrize("name", ["iterate", "split", "compare", "to", "write_rows", "rename",
                                  "pop", "batch_size"])
def test_compiled_functions_using_the_api_equal_eager(name):
    def iterate(td):
        return torch.stack([row["x"].sum() for row in td])

    def split(td):
        return torch.cat([p["x"].sum(0) for p in td.split(2)] + [c["x"][0] for c in torch.chunk(td, 2)])

    def compare(td):
        return (td == td["x"][0, 0])["x"].float() + float((td != 0).any())

    def to(td):
        return td.to(torch.float64)["x"] * 2

    def write_rows(td):
        td[0] = {"x": td["x"][-1] + 1}
        return td["x"] * 2

    def rename(td):
        td.rename_key_("x", "y")
        out = td["y"] + 1
        td.rename_key_("y", "x")
        return out

    def pop(td):
        v = td.pop("x")
        td["x"] = v * 2
        return v

    def batch_size(td):
        td.batch_size = [len(td)]
        return td["x"].sum(0)

    fn = locals()[name]
    step = tdstore.compile(fn, persist=False)
    for call, (rows, keys) in enumerate([(4, 0), (4, 3), (5, 1), (4, 0), (6, 2)]):
        a, b = _pair(rows, keys, seed=call)
        out, ref = step(a), fn(b)
        assert torch.equal(out, ref), (name, call)
        assert (a == b).all() and a.keys() == b.keys(), (name, call)  # the same writes


# ---- found by an adversarial review of the above; each failed before its fix


def test_a_refused_row_write_in_memory_puts_back_what_it_wrote():
    for b in (torch.zeros(4, requires_grad=True), torch.inference_mode()(torch.zeros)(4)):
        td = tdstore.TensorDict({"a": torch.zeros(4), "b": b}, batch_size=[4])
        with pytest.raises(tdstore.ArgumentError, match="'b'"):
            td[0] = 5
        assert td["a"].tolist() == [0, 0, 0, 0] and td["b"].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("kind", KINDS)
def test_values_are_read_before_any_leaf_is_written(kind, tmp_path):
    td, values = make(kind, tmp_path)
    td["b"] = values["a"] + 100
    td[0:2] = {"a": td["b"][0:2], "b": td["a"][0:2]}  # a swap: each reads the other's old rows
    assert torch.equal(td["a"][0:2], values["a"][0:2] + 100) and torch.equal(td["b"][0:2], values["a"][0:2])
    m = tdstore.TensorDict({"a": torch.arange(6.0)}, batch_size=[6])
    m[1:6] = {"a": m["a"][0:5]}  # overlapping shift, as torch's t[1:6] = t[0:5].clone()
    assert m["a"].tolist() == [0, 0, 1, 2, 3, 4]


def test_lazy_properties_see_writes_through_any_view():
    t = torch.zeros(4)
    m = tdstore.TensorDict({"a": t, "b": t}, batch_size=[4])  # two keys over one tensor
    m.get_or_compute("c", ["b"], lambda d: d["b"] + 1)
    m[0] = {"a": torch.tensor(5.0)}
    assert not m.lazy_valid("c") and m.get_or_compute("c", ["b"], lambda d: d["b"] + 1)[0] == 6
    x = torch.zeros(4)
    m = tdstore.TensorDict({"x": x}, batch_size=[4])
    m.get_or_compute("c", ["x"], lambda d: d["x"] + 1)
    m[0:2][0] = 9.0  # a view of the dict
    assert not m.lazy_valid("c") and m.get_or_compute("c", ["x"], lambda d: d["x"] + 1)[0] == 10
    x.add_(1)  # the user's own tensor, written in place
    assert not m.lazy_valid("c") and m.get_or_compute("c", ["x"], lambda d: d["x"] + 1)[0] == 11
    m["c"][1] = -1  # the property's own tensor
    assert not m.lazy_valid("c")


def test_pieces_along_a_later_dim_are_views_that_take_writes():
    td = tdstore.TensorDict({"a": torch.zeros(2, 4)}, batch_size=[2, 4])
    piece = td.split(2, dim=1)[0]
    piece[0] = 7.0
    assert td["a"][0].tolist() == [7, 7, 0, 0]


@pytest.mark.parametrize("kind", KINDS)
def test_indices_and_values_as_torch_reads_them(kind, tmp_path):
    td, values = make(kind, tmp_path)
    u8 = torch.tensor([1, 0, 1, 0], dtype=torch.uint8)  # a mask, as for a tensor
    assert td[u8]["n/x"].tolist() == [0, 2]
    td[u8] = {"n": {"x": torch.tensor([7, 8])}}
    assert td["n/x"].tolist() == [7, 1, 8, 3]
    for bad in (torch.tensor(2.0), torch.tensor([0.0, 1.0]), np.float64(2.7)):
        with pytest.raises(tdstore.IndexError):
            td[bad] = 0
        with pytest.raises(tdstore.IndexError):
            td[bad]
    td[[]] = 1  # no rows
    assert td[[]].batch_size == torch.Size([0])
    td[0] = {"a": torch.ones(1, 3)}  # leading dims of 1 dropped, as torch does
    td[1:3] = {"a": torch.full((1, 1, 3), 2.0)}
    assert td["a"][:3, 0].tolist() == [1, 2, 2]


@pytest.mark.parametrize("kind", KINDS)
def test_bad_arguments_are_typed_errors(kind, tmp_path):
    td, values = make(kind, tmp_path)
    for call, error in [(lambda: td.pop(0), tdstore.ArgumentTypeError),
                        (lambda: td.setdefault(1, 5.0), tdstore.ArgumentTypeError),
                        (lambda: td.split([1.5, 2.5]), tdstore.ArgumentTypeError),
                        (lambda: td.split(2 ** 70), tdstore.ArgumentError),
                        (lambda: td.chunk(2.0), tdstore.ArgumentTypeError),
                        (lambda: td.unbind("0"), tdstore.ArgumentTypeError),
                        (lambda: setattr(td, "batch_size", "x"), tdstore.ArgumentTypeError),
                        (lambda: setattr(td, "batch_size", None), tdstore.ArgumentTypeError),
                        (lambda: td.to("cuda"), tdstore.ArgumentError),
                        (lambda: td.to(torch.qint8), tdstore.DTypeError),
                        (lambda: td.to(), tdstore.ArgumentTypeError),
                        (lambda: torch.stack([values["a"], td]), TypeError),
                        (lambda: torch.cat([td, values["a"]]), tdstore.ArgumentTypeError),
                        (lambda: td.__setitem__(slice(None, None, 0), 1), tdstore.ArgumentError)]:
        with pytest.raises(error):
            call()
    assert td.to(dtype=torch.float64, device="cpu")["n/x"].dtype == torch.float64
    assert td.to(device="cpu:0") is td
    td["h"] = torch.zeros(4, dtype=torch.bfloat16)
    with pytest.raises(tdstore.DTypeError, match="'h'"):
        td.numpy()


def test_chunk_of_an_empty_dim_and_number_fills_beside_ragged_keys(tmp_path):
    td = tdstore.TensorDict({"a": torch.zeros(0, 3)}, batch_size=[0])
    assert [p.batch_size[0] for p in td.chunk(3)] == [len(c) for c in torch.zeros(0).chunk(3)]
    r = tdstore.TensorDict({"a": torch.zeros(2)}, batch_size=[2])
    r.set_ragged("r", [torch.arange(2), torch.arange(3)])
    r[0] = 4  # every dense key; ragged rows are set whole
    assert r["a"].tolist() == [4, 0] and r.get_ragged("r")[0].tolist() == [0, 1, 0, 1, 2]


def test_selecting_no_row_on_a_store_changes_nothing(tmp_path):
    td, _ = make("store", tmp_path)
    generation = td.generation
    td[torch.zeros(4, dtype=torch.bool)] = 5
    td.commit()
    assert td.generation == generation
