"""The documentation: the site builds without a warning, the maths renders, every public symbol
has a docstring and a place in the site, and the Markdown pages read well on GitHub too."""

import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaxbuffers

ROOT = Path(__file__).resolve().parents[1]
# Each module's `__all__` is public; a name it shares with `jaxbuffers` is documented there.
PUBLIC_MODULES = [
    "jaxbuffers",
    "jaxbuffers.compressed",
    "jaxbuffers.checkpoint",
    "jaxbuffers.disk",
    "jaxbuffers.datasets",
    "host_codecs",
    "jaxbuffers.interop.torch",
    "jaxbuffers.interop.sb3",
]
MARKDOWN_PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def public_objects():
    """(documented qualified name, object) of every public name."""
    for mod_name in PUBLIC_MODULES:
        mod = importlib.import_module(mod_name)
        assert mod.__doc__, f"{mod_name} has no module docstring"
        names = getattr(mod, "__all__", None)
        assert names, f"{mod_name} must list its public names in __all__"
        for name in names:
            obj = getattr(mod, name)
            if mod_name != "jaxbuffers" and name in jaxbuffers.__all__ and getattr(jaxbuffers, name) is obj:
                continue  # documented as jaxbuffers.<name>
            yield f"{mod_name}.{name}", obj


def public_members(cls):
    """(name, function) of the public methods and properties a class defines itself."""
    for attr, member in vars(cls).items():
        if attr.startswith("_"):
            continue
        target = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
        if inspect.isfunction(target) and target.__qualname__.startswith(f"{cls.__qualname__}."):
            yield attr, target  # written in the class body (not flax's generated `replace`)


PUBLIC = list(public_objects())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as `mkdocs build --strict` writes it (it writes the pages even when it aborts):
    (return code, build log, {page path: html})."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    pages = {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*.html")}
    return proc.returncode, proc.stdout + proc.stderr, pages


def test_docs_build_strict(site):
    """No warning at all: broken links or anchors, unknown docstring parameters, malformed
    `Raises:` entries, pages missing from the nav all fail the build."""
    returncode, log, _ = site
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert returncode == 0 and not warnings, "\n".join(warnings) or log


def test_gae_equation_rendered_as_maths(site):
    """gae's docstring equation reaches the page as arithmatex maths (KaTeX renders it in the browser)."""
    _, _, pages = site
    page = next((html for html in pages.values() if 'id="jaxbuffers.gae"' in html), None)
    assert page is not None, "no page documents jaxbuffers.gae"
    section = page.split('id="jaxbuffers.gae"', 1)[1].split('<div class="doc doc-object', 1)[0]
    maths = re.findall(r'class="arithmatex">(.*?)</(?:div|span)>', section, flags=re.S)
    assert any(r"\delta" in m for m in maths), "gae's TD-error equation is not rendered as maths"


@pytest.mark.parametrize("qualname, obj", PUBLIC, ids=[q for q, _ in PUBLIC])
def test_public_symbol_documented(qualname, obj):
    if not (inspect.isclass(obj) or callable(obj)):
        return  # constants: documented in their module's docstring
    assert inspect.getdoc(obj), f"{qualname} has no docstring"
    if inspect.isclass(obj):
        missing = [attr for attr, fn in public_members(obj) if not inspect.getdoc(fn)]
        assert not missing, f"{qualname}: public members without a docstring: {missing}"


def test_public_symbols_in_site(site):
    """Every public name, and every public method and property of a public class, has an anchor."""
    _, _, pages = site
    ids = set(re.findall(r'id="([^"]+)"', "".join(pages.values())))
    expected = []
    for qualname, obj in PUBLIC:
        expected.append(qualname)
        if inspect.isclass(obj):
            expected += [f"{qualname}.{attr}" for attr, _ in public_members(obj)]
    missing = [name for name in expected if name not in ids]
    assert not missing, f"not in the built site: {missing}"


SPHINX = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj|ref|doc|py:\w+):`|^\s*\.\. (?:[\w-]+::|_)", re.M)
DEVELOPMENT = re.compile(
    r"\bsessions?\b|\breview(?:s|ed|er|ers)?\b|\b\d+-core\b|\bissue #?\d+|\bwas lent\b|\bhelpers?\b", re.I
)


def docstrings(path):
    """(line, docstring) of the module, every class and every function in a source file."""
    import ast

    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc


def test_docstrings_use_no_sphinx_markup():
    """Docstrings are Markdown for mkdocstrings: names in backticks, maths between `$$` lines,
    examples fenced; Sphinx roles, directives and `::` literal blocks show as raw text."""
    literal = re.compile(r"\S+::\s*$", re.M)  # a reST literal block
    found = []
    for folder in ("jaxbuffers", "host_codecs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for line, doc in docstrings(path):
                hits = [m.group(0).strip() for m in (*SPHINX.finditer(doc), *literal.finditer(doc))]
                if hits:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {sorted(set(hits))}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", MARKDOWN_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_markdown_renders_on_github(path):
    """No Sphinx roles or directives: GitHub and mkdocs show them as raw text."""
    found = [m.group(0) for m in SPHINX.finditer(path.read_text())]
    assert not found, f"{path.name}: Sphinx markup {found[:5]}"


@pytest.mark.parametrize("path", MARKDOWN_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_markdown_says_nothing_about_development(path):
    """The pages describe the library, not how it was made."""
    text = path.read_text()
    found = [text[max(0, m.start() - 30) : m.end() + 30] for m in DEVELOPMENT.finditer(text)]
    assert not found, f"{path.name}: {found[:5]}"


def test_host_codecs_imports_without_jax():
    code = "import host_codecs, sys; assert 'jax' not in sys.modules, 'host_codecs imported jax'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_jaxbuffers_import_does_not_pull_torch_or_sb3():
    code = (
        "import jaxbuffers, sys; bad = [m for m in ('torch', 'stable_baselines3') if m in sys.modules]; "
        "assert not bad, f'importing jaxbuffers imported {bad}'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_documents_named_in_the_sources_exist():
    """Every `*.md` file the package sources, examples, benchmarks and docs name is in the
    repository."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for folder in ("jaxbuffers", "host_codecs", "examples", "benchmarks"):
        files += sorted((ROOT / folder).rglob("*.py"))
    missing = []
    for f in files:
        for name in set(re.findall(r"[A-Za-z0-9_./-]*[A-Za-z0-9_]\.md\b", f.read_text())):
            candidates = [ROOT / name, f.parent / name, ROOT / "docs" / name]
            if not any(c.is_file() for c in candidates):
                missing.append(f"{f.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_readme_says_of_the_ppo_example_only_what_the_benchmarks_record():
    """The README said the PPO example "compiles in seconds" where the benchmark page records tens of seconds: it
    gives no time of its own, points to the page, and its claim (compiling takes longer than training to 475) is the
    one the page's PPO table holds."""
    job = (ROOT / "README.md").read_text().split("**Run the main job**", 1)[1].split("```", 1)[0]
    assert "docs/benchmarks.md" in job and "compiling it takes longer than that training" in " ".join(job.split())
    assert not re.search(r"\d+ ?s\b|seconds|instant", job), job
    table = (ROOT / "docs" / "benchmarks.md").read_text()
    median = lambda row: float(re.search(rf"\| cartpole/{row} \| ours \| [^|]*\| ([\d.]+) s \|", table).group(1))  # noqa: E731
    assert median("compile_s") > median("train_s_to_475")


RUNNABLE_PAGES = ["docs/api/torch.md", "docs/api/rollout.md"]  # pages whose Python code blocks are complete programs


@pytest.mark.parametrize("page", RUNNABLE_PAGES)
def test_the_code_blocks_of_a_page_run_as_written(page):
    """The page's ```python blocks, in order, run in one fresh interpreter (a name a block uses is defined above it)."""
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / page).read_text(), re.S | re.M)
    assert blocks, f"{page} has no python code block"
    if "import torch" in "".join(blocks):
        pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", "\n".join(blocks)], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
