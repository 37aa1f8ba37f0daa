"""Docs coverage: every public symbol and every public method has a docstring; every document the docs name exists."""

import importlib
import inspect

import pytest

PUBLIC_MODULES = ["jaxbuffers", "host_codecs", "jaxbuffers.interop.torch", "jaxbuffers.interop.sb3"]


def public_objects():
    for mod_name in PUBLIC_MODULES:
        mod = importlib.import_module(mod_name)
        assert mod.__doc__, f"{mod_name} has no module docstring"
        names = getattr(mod, "__all__", None)
        assert names, f"{mod_name} must list its public names in __all__"
        for name in names:
            yield f"{mod_name}.{name}", getattr(mod, name)


@pytest.mark.parametrize("qualname, obj", list(public_objects()), ids=lambda x: x if isinstance(x, str) else "")
def test_public_symbol_documented(qualname, obj):
    if not (inspect.isclass(obj) or inspect.isfunction(obj) or callable(obj)):
        return  # constants
    assert inspect.getdoc(obj), f"{qualname} has no docstring"
    if inspect.isclass(obj):
        missing = []
        for attr, member in vars(obj).items():
            if attr.startswith("_"):
                continue
            target = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
            if inspect.isfunction(target) and not inspect.getdoc(target):
                missing.append(attr)
        assert not missing, f"{qualname}: public members without a docstring: {missing}"


def test_host_codecs_imports_without_jax():
    import subprocess
    import sys

    code = "import host_codecs, sys; assert 'jax' not in sys.modules, 'host_codecs imported jax'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_jaxbuffers_import_does_not_pull_torch_or_sb3():
    import subprocess
    import sys

    code = (
        "import jaxbuffers, sys; bad = [m for m in ('torch', 'stable_baselines3') if m in sys.modules]; "
        "assert not bad, f'importing jaxbuffers imported {bad}'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_api_reference_is_current():
    """docs/api.md is generated from the docstrings; regenerate with `python docs/gen_api.py`."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "docs" / "gen_api.py"
    spec = importlib.util.spec_from_file_location("gen_api", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.OUT.read_text() == gen.render(), "docs/api.md is stale: run `python docs/gen_api.py`"


def test_documents_named_in_the_sources_exist():
    """Every ``*.md`` file the package sources, examples, benchmarks and docs name is in the
    repository (a docstring once pointed at a design note that only lived outside it)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    for folder in ("jaxbuffers", "host_codecs", "examples", "benchmarks"):
        files += sorted((root / folder).rglob("*.py"))
    missing = []
    for f in files:
        for name in set(re.findall(r"[A-Za-z0-9_./-]*[A-Za-z0-9_]\.md\b", f.read_text())):
            candidates = [root / name, f.parent / name, root / "docs" / name]
            if not any(c.is_file() for c in candidates):
                missing.append(f"{f.relative_to(root)}: {name}")
    assert not missing, missing
