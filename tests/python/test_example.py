"""examples/fashion_mnist.py, the main job in Python: >= 0.88 test accuracy, and a second run
imports nothing, traces nothing and recomputes no feature."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")),
                    reason="needs Debian's dataset-fashion-mnist")
def test_fashion_mnist_example_trains_and_reuses_everything(tmp_path):
    def run():
        r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "fashion_mnist.py"),
                            "--store", str(tmp_path / "stores")], capture_output=True, text=True,
                           env=os.environ)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    first = run()
    assert "imported into" in first
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", first).group(1))
    assert accuracy >= 0.88, first
    assert re.search(r"fmnist_py_train_step: [1-9]\d* traced", first)
    second = run()
    assert "reused the cached stores, no import" in second
    assert re.search(r"fmnist_py_train_step: 0 traced, [1-9]\d* loaded", second), second
    assert re.search(r"fmnist_py_predict: 0 traced, 1 loaded", second), second
    assert float(re.search(r"test accuracy: ([0-9.]+)", second).group(1)) == accuracy  # seeded: same run
