"""examples/fashion_mnist.py, the main job in Python: >= 0.88 test accuracy, and a second run
imports nothing, traces nothing and recomputes no feature; so does another user's second run
over a read-only copy of the stores (its graphs from its own graph cache)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = "/usr/share/datasets/fashion-mnist"


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")),
                    reason="needs Debian's dataset-fashion-mnist")
def test_fashion_mnist_example_trains_and_reuses_everything(tmp_path):
    def run(store=tmp_path / "stores", via=(), env=os.environ, epochs=10):
        r = subprocess.run([*via, sys.executable, os.path.join(ROOT, "examples", "fashion_mnist.py"),
                            "--store", str(store), "--epochs", str(epochs)],
                           capture_output=True, text=True, env=env)
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
    assert "feature images_f32 (train): read from the store" in second, second
    assert "feature images_f32 (test): read from the store" in second, second
    if os.geteuid() != 0:
        return
    # Another user, over a read-only copy of the stores: root's graphs are never run (another
    # key), its own go to its graph cache, and its second run traces nothing.
    shared = tempfile.mkdtemp(prefix="tdstore-shared-")
    try:
        os.chmod(shared, 0o755)
        shutil.copytree(tmp_path / "stores", os.path.join(shared, "stores"))
        home = os.path.join(shared, "home")
        os.makedirs(home)
        shutil.chown(home, "nobody", "nogroup")
        for root, dirs, files in os.walk(os.path.join(shared, "stores")):
            for n in files:
                os.chmod(os.path.join(root, n), 0o444)
            for n in dirs:
                os.chmod(os.path.join(root, n), 0o555)
        os.chmod(os.path.join(shared, "stores"), 0o555)
        as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        env = dict(os.environ, HOME=home, XDG_CONFIG_HOME=os.path.join(home, "config"),
                   XDG_CACHE_HOME=os.path.join(home, "cache"),
                   PYTHONPATH=os.pathsep.join(sys.path))
        env.pop("TDSTORE_KEY_FILE", None)
        b1 = run(os.path.join(shared, "stores"), as_nobody, env, epochs=1)
        assert "reused the cached stores, no import" in b1, b1
        assert re.search(r"fmnist_py_train_step: [1-9]\d* traced, 0 loaded", b1), b1
        b2 = run(os.path.join(shared, "stores"), as_nobody, env, epochs=1)
        assert re.search(r"fmnist_py_train_step: 0 traced, [1-9]\d* loaded", b2), b2
        assert re.search(r"fmnist_py_predict: 0 traced, 1 loaded", b2), b2
        assert "feature images_f32 (train): read from the store" in b2, b2
        assert "feature images_f32 (test): read from the store" in b2, b2
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")),
                    reason="needs Debian's dataset-fashion-mnist")
def test_fashion_mnist_example_over_compressed_stores_trains_alike(tmp_path):
    def run(store, *extra):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "fashion_mnist.py"),
                            "--store", str(store), "--epochs", "2", *extra], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout, float(re.search(r"test accuracy: ([0-9.]+)", r.stdout).group(1))

    _, raw = run(tmp_path / "raw")
    first, zstd = run(tmp_path / "zstd", "--compress", "zstd")
    assert zstd == raw, first  # the same rows, the same seeded run
    import tdstore
    td = tdstore.open(str(tmp_path / "zstd" / "train"))
    assert td.compression == "zstd:1:1048576"  # --compress zstd: the default level
    td.close()
    info = subprocess.run([os.path.join(ROOT, "build", "tools", "tdstore"), "info", "--json",
                           str(tmp_path / "zstd" / "train")], capture_output=True, text=True)
    if info.returncode == 0:  # the CLI is built beside the wheel in the suite
        import json
        assert json.loads(info.stdout)["compressed_keys"] >= 3, info.stdout  # images, labels, feature
    second, again = run(tmp_path / "zstd", "--compress", "zstd")
    assert "reused the cached stores, no import" in second and again == raw, second
    assert "feature images_f32 (train): read from the store" in second, second
    # Asked for raw keys, the compressed copy is not reused: it is imported again.
    third, _ = run(tmp_path / "zstd")
    assert "imported into" in third, third
