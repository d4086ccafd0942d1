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
