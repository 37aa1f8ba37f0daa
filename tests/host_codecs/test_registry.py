"""Registry: names, levels, tags, errors, optional packages, no JAX import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import host_codecs
from host_codecs import available_codecs, get_codec, known_codecs
from host_codecs.registry import CODECS, codec_for_tag


def test_names_levels_and_specs():
    assert known_codecs() == ["none", "rle", "igzip", "zstd"]
    assert get_codec("igzip:3").level == 3
    assert get_codec("igzip").level == 1
    assert get_codec(" IGZIP:0 ").spec == "igzip:0"
    assert get_codec("none").level is None
    assert get_codec("zstd:3") is get_codec("zstd:3")  # cached
    c = get_codec("rle:16")
    assert get_codec(c) is c


def test_tags_are_unique_and_stable():
    # tags are stored with every entry: renumbering them would corrupt stored data
    assert {n: c.tag for n, c in CODECS.items()} == {"none": 0, "rle": 1, "igzip": 2, "zstd": 3}
    assert codec_for_tag(2).name == "igzip"
    with pytest.raises(ValueError, match="tag 9"):
        codec_for_tag(9)


def test_unknown_name_lists_known():
    with pytest.raises(ValueError, match=r"unknown codec 'lz5'.*\['none', 'rle', 'igzip', 'zstd'\]"):
        get_codec("lz5")


@pytest.mark.parametrize(
    "spec, msg",
    [
        ("igzip:4", r"level must be one of \[0, 1, 2, 3\]"),
        ("igzip:fast", "level must be an integer"),
        ("zstd:0", "level must be one of"),
        ("rle:7", r"level must be one of \[8, 16, 32\]"),
        ("none:1", "takes no level"),
    ],
)
def test_bad_levels(spec, msg):
    with pytest.raises(ValueError, match=msg):
        get_codec(spec)


def test_bad_spec_type():
    with pytest.raises(TypeError, match="codec"):
        get_codec(3)


def test_available_codecs_include_installed():
    avail = available_codecs()
    assert avail[0] == "none"
    assert set(avail) <= set(known_codecs())


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_without_jax_numba_isal():
    r = _run(
        "import host_codecs, sys; "
        "assert 'jax' not in sys.modules, 'jax'; "
        "assert 'numba' not in sys.modules and 'isal' not in sys.modules, 'lazy imports'"
    )
    assert r.returncode == 0, r.stderr


def test_import_and_round_trip_with_jax_blocked():
    """host_codecs never needs JAX: with `import jax` failing, it imports and round-trips."""
    r = _run(
        "import sys; sys.modules['jax'] = None\n"
        "import numpy as np, host_codecs\n"
        "specs = [s for s in ('none', 'rle', 'zstd:-1', 'igzip:1') if s.split(':')[0] in host_codecs.available_codecs()]\n"
        "x = np.arange(3 * 84 * 84, dtype=np.uint8).reshape(3, 84, 84) // 50\n"
        "for spec in specs:\n"
        "    s = host_codecs.CompressedStore(4, codec=spec)\n"
        "    s.put([0, 2, 3], x)\n"
        "    assert (s.get([3, 0]) == x[[2, 0]]).all(), spec\n"
        "print(len(specs))\n"
    )
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) >= 1


@pytest.mark.parametrize("spec, package", [("rle", "numba"), ("igzip:1", "isal"), ("zstd", "zstandard")])
def test_missing_package_names_the_extra(spec, package):
    # Simulate an environment without the package: a None entry makes `import pkg` fail.
    r = _run(
        f"import sys; sys.modules[{package!r}] = None\n"
        "import numpy as np, host_codecs\n"
        f"assert {spec.split(':')[0]!r} not in host_codecs.available_codecs() or {package!r} != 'x'\n"
        "s = host_codecs.CompressedStore(4, codec='none')\n"
        "s.put([0], np.ones((1, 3), np.uint8)); assert s.get([0]).sum() == 3\n"
        "try:\n"
        f"    host_codecs.get_codec({spec!r})\n"
        "except ImportError as e:\n"
        "    print(e)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n"
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert "jaxbuffers[codecs]" in r.stdout and package in r.stdout


def test_public_api():
    for name in ("CompressedStore", "get_codec", "available_codecs", "NoneCodec", "RLECodec", "IgzipCodec", "ZstdCodec"):
        assert name in host_codecs.__all__
        assert getattr(host_codecs, name).__doc__
