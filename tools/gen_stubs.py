"""Writes python/tdstore/_tdstore.pyi, the type stubs of the extension module, from the module
itself (pybind11's signatures and docstrings). tests/python/test_stubs.py fails when the shipped
stubs differ from what this prints: run it after changing the binding.

    PYTHONPATH=build/python /usr/bin/python3 tools/gen_stubs.py > python/tdstore/_tdstore.pyi
"""
import inspect
import re
import sys

HEADER = '''"""Type stubs of tdstore._tdstore, the C++ extension (written by tools/gen_stubs.py)."""
import builtins
import os
from typing import Any, Callable, Iterator, List, Tuple, Union

import torch
'''

TYPES = [
    (r"\bat::Tensor\b", "torch.Tensor"),
    (r"tdstore\._tdstore\.", ""),
    (r"\bfunction\b", "Callable[..., Any]"),
    (r"\bobject\b", "Any"),
    (r"\bIterator\b(?!\[)", "Iterator[str]"),
    (r"\bos\.PathLike\b", "Union[str, os.PathLike[str]]"),
    (r"\btuple\b", "Tuple[Any, ...]"),
    (r"\blist\b", "List[Any]"),
    (r"\bdict\b", "dict[str, Any]"),
]
SKIP = {"__doc__", "__module__", "__dict__", "__weakref__", "__new__", "_pybind11_conduit_v1_",
        "__getstate__", "__setstate__"}


def typed(text):
    for pat, rep in TYPES:
        text = re.sub(pat, rep, text)
    return text


def signatures(fn):
    """(params, returns, doc) of each overload in a pybind11 function's docstring."""
    doc = (fn.__doc__ or "").strip()
    name = fn.__name__
    sigs = []
    lines = doc.splitlines()
    body = [ln for ln in lines if not re.match(rf"^(\d+\. )?{re.escape(name)}\(", ln) and ln != "Overloaded function."]
    for ln in lines:
        m = re.match(rf"^(?:\d+\. )?{re.escape(name)}\((.*)\) -> (.*)$", ln)
        if m:
            sigs.append((m.group(1), m.group(2)))
    text = "\n".join(body).strip()
    return sigs, text


def params(raw, method):
    parts, depth, cur = [], 0, ""
    for ch in raw:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    out = []
    for i, p in enumerate(parts):
        if method and i == 0:
            out.append("self")
            continue
        if p.startswith("*"):
            out.append(p.split(":")[0])
            continue
        name, _, rest = p.partition(": ")
        annot, eq, default = rest.partition(" = ")
        out.append(f"{name}: {typed(annot)}" + (" = ..." if eq else ""))
    return ", ".join(out)


def docstring(text, indent):
    if not text:
        return ""
    pad = " " * indent
    text = text.replace('"""', "'''").replace("\\", "\\\\")
    return f'{pad}"""{text}"""\n' if "\n" not in text else f'{pad}"""{text}\n{pad}"""\n'


def emit_function(name, fn, indent, kind):
    sigs, text = signatures(fn)
    pad = " " * indent
    out = ""
    for raw, ret in sigs or [("self" if kind == "method" else "", "Any")]:
        deco = f"{pad}@staticmethod\n" if kind == "static" else ""
        args = params(raw, kind == "method")
        out += f"{deco}{pad}def {name}({args}) -> {typed(ret)}:\n"
        out += docstring(text, indent + 4) or ""
        out += f"{pad}    ...\n"
    return out


def emit_python_function(name, fn):
    """A method written in Python (tdstore/_tensordict_api.py): its own signature."""
    args = []
    for p in inspect.signature(fn).parameters.values():
        prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(p.kind, "")
        args.append(prefix + p.name + (" = ..." if p.default is not inspect.Parameter.empty else ""))
    return (f"    def {name}({', '.join(args)}) -> Any:\n" +
            docstring(inspect.cleandoc(fn.__doc__ or ""), 8) + "        ...\n")


def emit_class(name, cls):
    bases = [("builtins." if b.__module__ == "builtins" else "") + b.__name__
             for b in cls.__bases__ if b.__name__ not in ("pybind11_object", "object")]
    out = f"class {name}({', '.join(bases)}):\n" if bases else f"class {name}:\n"
    out += docstring((cls.__doc__ or "").strip(), 4)
    if issubclass(cls, BaseException):
        return out + "    ...\n"
    for k, v in sorted(vars(cls).items()):
        if k in SKIP or (k == "__init__" and not (getattr(v, "__doc__", "") or "").startswith("__init__(")):
            continue
        if isinstance(v, property):
            ret = "Any"
            if v.fget is not None:
                sigs, _ = signatures(v.fget)
                ret = typed(sigs[0][1]) if sigs else "Any"
            out += f"    @property\n    def {k}(self) -> {ret}:\n"
            out += docstring((v.__doc__ or "").strip(), 8) + "        ...\n"
        elif isinstance(v, staticmethod):
            out += emit_function(k, v.__func__, 4, "static")
        elif inspect.isfunction(v):
            out += emit_python_function(k, v)
        elif callable(v):
            method = emit_function(k, v, 4, "method")
            if k == "__enter__":  # returns the handle itself
                method = method.replace("-> Any:", f"-> {name}:")
            out += method
    return out


def generate(module):
    out = HEADER
    def order(kv):  # tdstore.Error first, then the other errors, then the rest, by name
        name, obj = kv
        is_error = inspect.isclass(obj) and issubclass(obj, BaseException)
        return (not is_error, name != "Error", name)

    for name, obj in sorted(vars(module).items(), key=order):
        if name.startswith("__"):
            continue
        if inspect.isclass(obj):
            out += "\n\n" + emit_class(name, obj)
        elif callable(obj):
            out += "\n\n" + emit_function(name, obj, 0, "function")
    return out


def main():
    import tdstore._tdstore as module
    sys.stdout.write(generate(module))


if __name__ == "__main__":
    main()
