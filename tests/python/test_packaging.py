"""pip install -e: a development install imports the package from the build tree (build/python),
so `ninja -C build` is the whole rebuild. (scripts/test.sh runs this suite against a wheel
installed with `pip install .` into a virtual environment.)"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "build", "build.ninja")),
                    reason="needs the build tree (scripts/setup.sh)")
def test_editable_install_imports_the_build_tree(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TDSTORE_PYTHONPATH")}
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--no-build-isolation",
                        "-e", ROOT], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([str(venv / "bin" / "python"), "-c",
                        "import tdstore, torch; td = tdstore.TensorDict({'a': torch.ones(2)}, batch_size=[2]);"
                        "print(tdstore.__file__, tdstore.__version__, td['a'].sum().item())"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    path, version, total = r.stdout.split()
    assert path == os.path.join(ROOT, "build", "python", "tdstore", "__init__.py")
    assert total == "2.0"
    r = subprocess.run([str(venv / "bin" / "pip"), "show", "tdstore"], capture_output=True, text=True, env=env)
    assert f"Version: {version}" in r.stdout
