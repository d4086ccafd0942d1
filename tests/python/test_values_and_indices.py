"""Values and indices keep what they mean (issue 45): a dict or TensorDict assigned under a key
puts its leaves under that prefix, prefixes are members, an index per batch dim indexes the
batch dims, ragged keys keep their rows' lengths through indexing and the DataLoader adapter,
bad arguments raise errors a user can catch by their builtin, and handles pickle to what the
other process can open. Each test failed before the change it names."""
import copy
import pickle

import numpy as np
import pytest
import torch

import tdstore
import tdstore.data


@pytest.fixture
def store(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[4])
    td["a"] = torch.arange(20.).reshape(4, 5)
    td["n/x"] = torch.zeros(4, 2)
    td.commit()
    yield td
    td.close()


def other():
    return tdstore.TensorDict.from_dict({"p": torch.arange(4.), "q/r": torch.ones(4, 3)}, batch_size=[4])


# ---- values

@pytest.mark.parametrize("persistent", [True, False])
def test_a_tensordict_value_puts_its_leaves_under_the_key(store, persistent):
    td = store if persistent else store.clone()
    td["d"] = other()
    assert sorted(td.keys()) == ["a", "d/p", "d/q/r", "n/x"]
    assert torch.equal(td["d/p"], torch.arange(4.))
    assert torch.equal(td["d", "q", "r"], torch.ones(4, 3))
    if persistent:
        td.commit()
        with tdstore.open(td.path) as r:
            assert sorted(r.keys()) == ["a", "d/p", "d/q/r", "n/x"]


def test_a_sub_dict_value_replaces_what_is_under_an_existing_prefix(store):
    store["n"] = other()  # tensordict: td["n"] = sub replaces the sub-dict
    assert sorted(store.keys()) == ["a", "n/p", "n/q/r"]
    store["a"] = {"b": torch.ones(4)}  # a leaf replaced by a sub-dict
    assert sorted(store.keys()) == ["a/b", "n/p", "n/q/r"]
    store.commit()
    assert sorted(tdstore.open(store.path).keys()) == ["a/b", "n/p", "n/q/r"]


def test_a_dict_value_holding_a_tensordict_keeps_both_prefixes(store):
    store["x"] = {"inner": other(), "t": np.ones((4, 2), dtype=np.float32)}
    assert sorted(k for k in store.keys() if k.startswith("x/")) == ["x/inner/p", "x/inner/q/r", "x/t"]
    assert "p" not in store and "q" not in store


def test_a_refused_leaf_changes_nothing(store):
    with pytest.raises(tdstore.ShapeError):
        store["n"] = {"ok": torch.ones(4), "bad": torch.ones(3)}
    assert sorted(store.keys()) == ["a", "n/x"]  # n/x is still there, nothing half-written


def test_a_sub_dict_of_the_same_dict_can_be_assigned_to_its_own_key(store):
    store["n"] = store["n"]
    assert sorted(store.keys()) == ["a", "n/x"]
    assert torch.equal(store["n/x"], torch.zeros(4, 2))


def test_a_tensor_under_an_existing_prefix_is_a_typed_error(store):
    with pytest.raises(KeyError, match="prefix"):
        store["n"] = torch.ones(4)


def test_ragged_leaves_of_a_value_stay_ragged(store):
    src = tdstore.TensorDict.from_dict({}, batch_size=[4])
    src.set_ragged("tok", [torch.arange(i) for i in range(4)])
    store["r"] = src
    assert store.is_ragged("r/tok")
    values, offsets = store.get_ragged("r/tok")
    assert offsets.tolist() == [0, 0, 1, 3, 6]


def test_update_takes_a_plain_dict(store):
    store.update({"u": torch.ones(4), "v": {"w": torch.zeros(4)}})
    assert {"u", "v/w"} <= set(store.keys())
    with pytest.raises(TypeError):
        store.update([1, 2])


def test_from_dict_keeps_the_prefix_of_a_tensordict_value():
    td = tdstore.TensorDict.from_dict({"d": other()}, batch_size=[4])
    assert sorted(td.keys()) == ["d/p", "d/q/r"]


# ---- prefixes are members

def test_a_prefix_is_in_the_dict_and_get_gives_the_sub_dict(store):
    assert "n" in store and ("n",) in store and "n/x" in store
    assert "zz" not in store and "n/zz" not in store and "a/b" not in store
    sub = store.get("n")
    assert isinstance(sub, tdstore.TensorDict) and sub.keys() == ["x"]
    assert store.get("zz") is None and store.get("zz", 7) == 7
    assert torch.equal(store.get("a"), store["a"])


# ---- one index per batch dim

@pytest.fixture
def grid():
    a = torch.arange(4 * 5 * 3.).reshape(4, 5, 3)
    return tdstore.TensorDict.from_dict({"a": a, "b/c": a[..., 0].long()}, batch_size=[4, 5]), a


ALL = slice(None)


@pytest.mark.parametrize("index,leaf_index", [
    ((2, 2), None), ((-1, 0), None), ((slice(1, 3), 2), None), ((2, slice(None, None, 2)), None),
    ((Ellipsis, 1), (ALL, 1)),  # an Ellipsis spans the batch dims, never a leaf's own dims
    ((1, Ellipsis), (1, ALL)), ((Ellipsis, 1, 2), (1, 2)),
    ((torch.tensor([0, 3]), torch.tensor([1, 4])), None),
    ((torch.tensor([True, False, True, False]), 1), None), (([0, 1], slice(2, 4)), None), ((), None)])
def test_a_tuple_indexes_the_batch_dims_as_numpy_does(grid, index, leaf_index):
    td, a = grid
    out = td[index]
    b = a[..., 0].long()  # a key without dims of its own: numpy's answer as it is
    assert out.batch_size == b[index].shape
    assert torch.equal(out["b/c"], b[index])
    assert torch.equal(out["a"], a[index if leaf_index is None else leaf_index])


def test_a_one_tuple_is_its_element(grid):
    td, a = grid
    assert td[(1,)].batch_size == td[1].batch_size == torch.Size([5])
    assert torch.equal(td[(1,)]["a"], a[1])


def test_batch_indices_on_a_store(tmp_path):
    with tdstore.TensorDict.create(tmp_path / "g", batch_size=[4, 5]) as td:
        td["a"] = torch.arange(20.).reshape(4, 5)
        td.commit()
        assert td[2, 3]["a"].item() == 13.0 and td[2, 3].batch_size == torch.Size([])
        assert td[1:3, 4]["a"].tolist() == [9.0, 14.0]
        with pytest.raises(IndexError):
            td[4, 0]


def test_too_many_or_out_of_range_indices_are_index_errors(grid):
    td, _ = grid
    with pytest.raises(IndexError) as e:
        td[1, 2, 0]  # a's feature dim is not a batch dim
    assert isinstance(e.value, tdstore.IndexError) and "too many indices" in str(e.value)
    with pytest.raises(tdstore.IndexError):
        td[1, 5]
    with pytest.raises(tdstore.IndexError):
        td[..., ..., 1]


def test_an_out_of_range_row_is_an_index_error(store):
    with pytest.raises(IndexError):
        store[4]
    with pytest.raises(IndexError):
        store[torch.tensor([0, 9])]


# ---- ragged keys keep their lengths

@pytest.fixture
def ragged_store(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "r", batch_size=[5])
    td.set_ragged("tok", [torch.arange(n) + 10 * n for n in [3, 0, 2, 4, 1]])
    td["y"] = torch.arange(5)
    td.commit()
    yield td
    td.close()


def rows_of(td, key):
    values, offsets = td.get_ragged(key)
    return [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


def test_row_selections_keep_a_ragged_key_ragged(ragged_store):
    all_rows = rows_of(ragged_store, "tok")
    assert rows_of(ragged_store[0:3], "tok") == all_rows[0:3]
    assert rows_of(ragged_store[1::2], "tok") == all_rows[1::2]
    assert rows_of(ragged_store[torch.tensor([4, 0, -1])], "tok") == [all_rows[4], all_rows[0], all_rows[4]]
    mask = torch.tensor([True, True, False, False, True])
    assert rows_of(ragged_store[mask], "tok") == [all_rows[0], all_rows[1], all_rows[4]]
    assert rows_of(ragged_store[torch.tensor([], dtype=torch.long)], "tok") == []
    for i in range(5):
        assert ragged_store[i]["tok"].tolist() == all_rows[i]  # the row itself, not padded
    assert ragged_store[1]["tok"].shape == (0,)
    with pytest.raises(tdstore.ShapeError, match="ragged"):
        ragged_store[torch.tensor([[0, 1]])]


def test_data_dataset_items_are_the_true_rows_and_collate_adds_lengths(ragged_store):
    ds = tdstore.data.Dataset(ragged_store.path)
    assert ds[1]["tok"].shape == (0,)  # the empty row, not [0, 0, 0, 0]
    assert ds[3]["tok"].tolist() == [40, 41, 42, 43]
    for batch in [tdstore.data.collate([ds[i] for i in [1, 3, 4]]),
                  tdstore.data.collate(ds.__getitems__([1, 3, 4]))]:
        assert batch["tok.lengths"].tolist() == [0, 4, 1]
        assert batch["tok"].tolist() == [[0, 0, 0, 0], [40, 41, 42, 43], [10, 0, 0, 0]]
        assert batch["y"].tolist() == [1, 3, 4]
    rows = ds.__getitems__([4, 1])
    assert rows[0]["tok"].tolist() == [10] and rows[1]["tok"].tolist() == []
    dl = torch.utils.data.DataLoader(ds, batch_size=2, collate_fn=tdstore.data.collate)
    seen = []
    for batch in dl:
        for row, n in zip(batch["tok"], batch["tok.lengths"]):
            seen.append(row[:n].tolist())
    assert seen == rows_of(ragged_store, "tok")


def test_a_sharded_dataset_row_of_a_ragged_key_is_the_true_row(tmp_path):
    ds = tdstore.Dataset.create(tmp_path / "ds")
    shard = ds.shard(0)
    rows = tdstore.TensorDict.from_dict({}, batch_size=[3])
    rows.set_ragged("tok", [torch.arange(2), torch.arange(0), torch.arange(3)])
    shard.append(rows)
    shard.commit()
    ds.publish()
    assert ds[1]["tok"].shape == (0,)
    assert ds[2]["tok"].tolist() == [0, 1, 2]
    assert rows_of(ds[0:3], "tok") == [[0, 1], [], [0, 1, 2]]


# ---- errors a user catches by their builtin

@pytest.mark.parametrize("kwargs", [
    dict(batch_size=0), dict(world_size=0), dict(rank=5, world_size=2), dict(rank=-1),
    dict(block_bytes=0), dict(memory_budget=-1), dict(seed=-1), dict(seed=2 ** 64), dict(order="zigzag")])
def test_bad_loader_arguments_are_value_errors(store, kwargs):
    with pytest.raises(ValueError) as e:
        tdstore.Loader(store, **kwargs)
    assert isinstance(e.value, tdstore.ArgumentError)


def test_bad_types_are_type_errors(store):
    with pytest.raises(TypeError) as e:
        tdstore.Loader({"a": torch.zeros(3)}, batch_size=2)
    assert isinstance(e.value, tdstore.ArgumentTypeError) and "source" in str(e.value)
    state = tdstore.Loader(store, batch_size=2).state_dict()
    state["shuffle"] = "yes"
    with pytest.raises(TypeError, match="'shuffle'"):
        tdstore.Loader(store, batch_size=2).load_state_dict(state)


def test_a_str_of_keys_is_one_key(store):
    batch = next(iter(tdstore.Loader(store, batch_size=2, keys="a")))
    assert batch.keys() == ["a"]


def test_bad_store_and_join_arguments_are_value_errors(tmp_path):
    for kw in [dict(key_capacity=0), dict(alignment=3)]:
        with pytest.raises(ValueError) as e:
            tdstore.TensorDict.create(tmp_path / "bad", batch_size=[2], **kw)
        assert isinstance(e.value, tdstore.ArgumentError)
    for join in [tdstore.TensorDict.stack, tdstore.TensorDict.cat]:
        with pytest.raises(tdstore.ArgumentError):
            join([])
    ds = tdstore.Dataset.create(tmp_path / "ds")
    with pytest.raises(ValueError):
        ds.shard(-1)


def test_mode_w_is_refused_rather_than_read_as_r_plus(store):
    path = store.path
    store.close()
    with pytest.raises(ValueError) as e:
        tdstore.open(path, "w")
    assert isinstance(e.value, tdstore.ArgumentError) and "create" in str(e.value)
    with pytest.raises(tdstore.ArgumentError, match="'r'"):
        tdstore.open(path, "a")


# ---- pickling and copies

def test_a_writer_pickles_as_a_reader_of_its_committed_state(store):
    store["staged"] = torch.ones(4)
    for copied in [pickle.loads(pickle.dumps(store)), copy.deepcopy(store)]:
        assert not copied.is_writable
        assert "staged" not in copied and torch.equal(copied["a"], store["a"])
    store.commit()  # the writer keeps its lock and its staged change
    assert "staged" in tdstore.open(store.path)


def test_spawned_dataloader_workers_read_a_writers_store(store):
    ds = tdstore.data.Dataset(store)
    dl = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context="spawn",
                                     collate_fn=tdstore.data.collate)
    got = torch.cat([b["a"] for b in dl])
    assert torch.equal(got, store["a"])


def test_a_dataset_pickles_as_its_path(tmp_path):
    ds = tdstore.Dataset.create(tmp_path / "ds")
    shard = ds.shard(0)
    shard.append(tdstore.TensorDict.from_dict({"x": torch.arange(3)}, batch_size=[3]))
    shard.commit()
    ds.publish()
    for copied in [pickle.loads(pickle.dumps(ds)), copy.deepcopy(ds)]:
        assert len(copied) == 3 and copied.path == ds.path
        assert copied[2]["x"].item() == 2


def test_a_handle_whose_setstate_failed_raises_typed_errors(tmp_path):
    for cls, state in [(tdstore.TensorDict, ("store", str(tmp_path / "missing"), "r", "")),
                       (tdstore.Dataset, (str(tmp_path / "missing"),))]:
        obj = cls.__new__(cls)
        with pytest.raises(tdstore.Error):
            obj.__setstate__(state)
        for call in [repr, len, lambda o: o.keys(), lambda o: o[0]]:
            with pytest.raises(tdstore.Error):
                call(obj)


# ---- found by an adversarial review of the above

def test_a_sub_dict_refused_by_the_store_changes_nothing(tmp_path):
    td = tdstore.TensorDict.create(tmp_path / "s", batch_size=[4], key_capacity=4)
    td["n/x"] = torch.zeros(4)
    td["n/y"] = torch.ones(4)
    td.commit()
    with pytest.raises(tdstore.CapacityError):
        td["n"] = {k: torch.full((4,), float(i)) for i, k in enumerate("abcde")}  # 5 keys > 4 slots
    assert td.keys() == ["n/x", "n/y"]
    with pytest.raises(tdstore.CapacityError):
        td.update({"a": torch.ones(4), "b": torch.ones(4), "c": torch.ones(4)})
    assert td.keys() == ["n/x", "n/y"]
    with pytest.raises(tdstore.CapacityError):  # the store cannot allocate the second leaf
        td["n"] = {"a": torch.ones(4), "z": torch.ones(1).expand(4, 2 ** 40)}
    assert td.keys() == ["n/x", "n/y"]
    td.commit()
    with tdstore.open(td.path) as r:
        assert r.keys() == ["n/x", "n/y"] and torch.equal(r["n/y"], torch.ones(4))
        assert r.verify() == []


def test_del_of_a_prefix_removes_the_sub_dict(store):
    del store["n"]
    assert store.keys() == ["a"] and "n" not in store
    with pytest.raises(KeyError):
        del store["n"]
    store.commit()
    assert tdstore.open(store.path).keys() == ["a"]


@pytest.mark.parametrize("index", [
    None, True, False, torch.tensor(True), (None,), (None, 1), (1, None), (Ellipsis, None),
    (Ellipsis, True), (0, 1, True), (Ellipsis, torch.tensor(True))])
def test_indices_that_add_a_batch_dim_are_refused(grid, index):
    td, _ = grid
    with pytest.raises(TypeError) as e:  # numpy adds a dim there; a dict's keys would not agree
        td[index]
    assert isinstance(e.value, tdstore.DTypeError) and "index None or a bool" in str(e.value)


@pytest.mark.parametrize("index,error", [
    ((slice(None, None, -1), 0), ValueError), ((slice(None, None, 0), 0), ValueError),
    ((slice(0, "a"), 0), TypeError), ((2 ** 70, 0), IndexError),
    (2 ** 70, IndexError), (-2 ** 70, IndexError), (slice(None, None, -1), ValueError)])
def test_bad_indices_are_typed_errors(grid, index, error):
    td, _ = grid
    with pytest.raises(error) as e:
        td[index]
    assert isinstance(e.value, tdstore.Error)


def test_every_form_of_a_row_index_keeps_ragged_rows(ragged_store):
    all_rows = rows_of(ragged_store, "tok")
    assert ragged_store[torch.tensor(3)]["tok"].tolist() == all_rows[3]
    assert ragged_store[2, ...]["tok"].tolist() == all_rows[2]
    assert rows_of(ragged_store[0:2, ...], "tok") == all_rows[0:2]
    mask = torch.tensor([False, True, True, False, False])
    assert rows_of(ragged_store[..., mask], "tok") == all_rows[1:3]
    assert rows_of(ragged_store[[4, 0]], "tok") == [all_rows[4], all_rows[0]]


def test_a_handle_opened_by_a_relative_path_pickles_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with tdstore.TensorDict.create("rel", batch_size=[2]) as td:
        td["x"] = torch.arange(2)
    ds = tdstore.Dataset.create("ds")
    blobs = [pickle.dumps(tdstore.open("rel")), pickle.dumps(ds)]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    back = pickle.loads(blobs[0])
    assert torch.equal(back["x"], torch.arange(2))
    assert len(pickle.loads(blobs[1])) == 0


def test_ragged_rows_of_other_dims_or_dtypes_are_refused_naming_the_key():
    td = tdstore.TensorDict.from_dict({}, batch_size=[2])
    with pytest.raises(tdstore.ShapeError, match="'tok'.*row 1"):
        td.set_ragged("tok", [torch.zeros(2, 3), torch.zeros(2)])
    with pytest.raises(tdstore.ShapeError, match="row 1"):
        td.set_ragged("tok", [torch.zeros(2, 3), torch.zeros(2, 4)])
    with pytest.raises(tdstore.DTypeError, match="row 1"):
        td.set_ragged("tok", [torch.zeros(2), torch.zeros(2, dtype=torch.long)])
    assert "tok" not in td
