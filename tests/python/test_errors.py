"""Bad input from Python gets a tdstore.Error that is also the matching builtin, naming what
was wrong, never a crash or a raw torch/pybind11 message."""
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
