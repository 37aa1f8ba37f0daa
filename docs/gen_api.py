"""Generate docs/api.md, the API reference, from the public docstrings.

Run ``python docs/gen_api.py`` after changing a public docstring or signature;
``tests/test_docs.py`` fails when docs/api.md is out of date.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re

MODULES = [
    ("jaxbuffers", "The device side: buffers, sample types, return functions."),
    ("host_codecs", "The host side (no JAX): codecs and the compressed store."),
    ("jaxbuffers.interop.torch", "DLPack hand-off between JAX and torch (needs the `torch` extra)."),
    ("jaxbuffers.interop.sb3", "Stable-Baselines3 buffer classes and conversions (needs the `sb3` extra)."),
]

OUT = pathlib.Path(__file__).with_name("api.md")


def _signature(obj) -> str:
    """Parameters and defaults only: the docstrings give types, shapes and dtypes."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def _fields(cls) -> list[str]:
    """One Markdown line per public field annotated in the class body (``name: type = ...  # what
    it holds``; class variables left out): name, type, ``static`` for a non-pytree field, and the
    inline comment."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return []
    found = []
    for line in source.splitlines()[1:]:
        m = re.match(r"^    ([a-z][A-Za-z0-9_]*): ([^#=]+?)( = [^#]*?)?(?:  # (.*))?$", line)
        if m and not m.group(2).startswith("ClassVar"):
            name, kind, default, comment = m.groups()
            static = ", static" if default and "pytree_node=False" in default else ""
            found.append(f"- `{name}` ({kind.strip()}{static})" + (f": {comment}" if comment else ""))
    return found


def _members(cls):
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            yield name, member.fget, "property"
        elif isinstance(member, (classmethod, staticmethod)):
            yield name, member.__func__, "classmethod" if isinstance(member, classmethod) else "staticmethod"
        elif inspect.isfunction(member):
            yield name, member, "method"


def render() -> str:
    lines = [
        "# API reference",
        "",
        "Generated from the docstrings by `python docs/gen_api.py`; do not edit by hand.",
        "The conventions every function follows are in `docs/guide.md`.",
        "",
    ]
    for mod_name, blurb in MODULES:
        mod = importlib.import_module(mod_name)
        lines += [f"## `{mod_name}`", "", blurb, ""]
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.isclass(obj):
                lines += [f"### class `{mod_name}.{name}`", ""]
                lines += [inspect.getdoc(obj) or "", ""]
                fields = _fields(obj)
                if fields:
                    lines += ["Fields:", ""] + fields + [""]
                for mname, fn, kind in _members(obj):
                    sig = "" if kind == "property" else _signature(fn)
                    prefix = f"{kind} " if kind != "method" else ""
                    lines += [f"#### {prefix}`{name}.{mname}{sig}`", "", inspect.getdoc(fn) or "", ""]
            elif callable(obj):
                lines += [f"### `{mod_name}.{name}{_signature(obj)}`", "", inspect.getdoc(obj) or "", ""]
            else:
                lines += [f"### `{mod_name}.{name}` = `{obj!r}`", ""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
