"""The shipped type stubs (tdstore/_tdstore.pyi) describe the extension as built, and every
public class, method, property and argument has a docstring and a name (help() shows them)."""
import ast
import inspect
import os
import runpy

import tdstore
import tdstore._tdstore as ext

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_shipped_stubs_match_the_extension():
    shipped = os.path.join(os.path.dirname(tdstore.__file__), "_tdstore.pyi")
    assert os.path.exists(shipped), "the package ships no _tdstore.pyi"
    gen = runpy.run_path(os.path.join(ROOT, "tools", "gen_stubs.py"))
    expected = gen["generate"](ext)
    ast.parse(expected)
    with open(shipped) as f:
        assert f.read() == expected, ("python/tdstore/_tdstore.pyi differs from the extension: "
                                      "PYTHONPATH=build/python /usr/bin/python3 tools/gen_stubs.py "
                                      "> python/tdstore/_tdstore.pyi")
    assert os.path.exists(os.path.join(os.path.dirname(tdstore.__file__), "py.typed"))


def _public_members(cls):
    for name, value in vars(cls).items():
        if name.startswith("_") and not name.startswith("__"):
            continue  # private
        if name in ("__doc__", "__module__", "__dict__", "__weakref__", "__new__", "__getstate__",
                    "__setstate__", "_pybind11_conduit_v1_"):
            continue
        if name == "__init__" and not (value.__doc__ or "").startswith("__init__("):
            continue  # made by the library (open, create, iter), not constructed by users
        if value is None:
            continue  # __hash__ = None: the class declares its objects unhashable
        yield name, value


def test_every_public_name_has_a_docstring_and_named_arguments():
    missing = []
    for cname in tdstore.__all__:
        obj = getattr(tdstore, cname)
        if cname == "__version__" or inspect.ismodule(obj):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(cname)
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        for name, value in _public_members(obj):
            fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            doc = (value.__doc__ if isinstance(value, property) else fn.__doc__) or ""
            lines = [ln for ln in doc.strip().splitlines() if not ln.startswith(name + "(")]
            if not "".join(lines).strip():
                missing.append(f"{cname}.{name}")
            if "arg0" in doc:
                missing.append(f"{cname}.{name} (unnamed arguments)")
    for fn in (tdstore.data.Dataset, tdstore.data.loader, tdstore.data.collate, tdstore.open,
               tdstore.compile, tdstore.cache_in_parallel, tdstore.TensorDict.to_tensordict):
        if not (fn.__doc__ or "").strip():
            missing.append(fn.__qualname__)
    assert not missing, "without a docstring: " + ", ".join(missing)
