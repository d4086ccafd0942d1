"""The PEP 517 backend of pyproject.toml: meson-python (mesonpy) for wheels and sdists, plus
editable installs, which Debian 12's meson-python (0.12) does not provide.

An editable install builds the project into build/ (the tree scripts/setup.sh and the README
use) and installs a wheel holding only a .pth file that puts build/python on sys.path: the
package imported is the one the build tree holds, so `ninja -C build` after an edit (to C++ or
to python/tdstore/*.py, which the build copies beside the extension) is all a rebuild takes.
"""
import base64
import hashlib
import os
import pathlib
import subprocess
import sys
import tomllib
import zipfile

from mesonpy import (build_sdist, build_wheel, get_requires_for_build_sdist,  # noqa: F401
                     get_requires_for_build_wheel)

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _version():
    for line in (ROOT / "meson.build").read_text().splitlines():
        line = line.strip()
        if line.startswith("version"):
            return line.split("'")[1]
    raise RuntimeError("meson.build names no project version")


def _build_tree(config_settings):
    builddir = (config_settings or {}).get("builddir", "build")
    build = (ROOT / builddir).resolve()
    if not (build / "build.ninja").exists():
        subprocess.run(["meson", "setup", str(build), "--buildtype=release",
                        f"-Dpython_interpreter={sys.executable}"], cwd=ROOT, check=True)
    subprocess.run(["ninja", "-C", str(build)], check=True)
    return build


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_editable(config_settings=None):
    return []


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    build = _build_tree(config_settings)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    version = _version()
    dist_info = f"tdstore-{version}.dist-info"
    metadata = "\n".join([
        "Metadata-Version: 2.1", "Name: tdstore", f"Version: {version}",
        f"Summary: {project['description']}", f"License: {project['license']['text']}",
        *(f"Requires-Dist: {d}" for d in project.get("dependencies", [])), ""])
    files = {
        "tdstore-editable.pth": f"{build / 'python'}\n",
        f"{dist_info}/METADATA": metadata,
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tdstore_build\nRoot-Is-Purelib: false\n"
                              "Tag: py3-none-any\n",
    }
    name = f"tdstore-{version}-0editable-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        for path, text in files.items():
            data = text.encode()
            whl.writestr(path, data)
            record.append(_record_line(path, data))
        record.append(f"{dist_info}/RECORD,,")
        whl.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return name
