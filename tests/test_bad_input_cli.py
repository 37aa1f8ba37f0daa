"""Bad input to the `jaxbuffers` console script (`inspect`, `video`, `sheet`): each wrong option value is refused
with exit status 2 and one error line of ours naming the option, what was expected and what came (no traceback),
before anything is written: the saved folder is byte-identical and no output file appears; the documented accepted
values (any episode in range, any `--scale` >= 1, any finite `--fps` > 0 (for a GIF, at most 655.35 s a frame),
`--count` beyond the steps held) write their output."""

from __future__ import annotations

import hashlib
import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS
from jaxbuffers.cli import main

pytest.importorskip("PIL")
pytest.importorskip("rich")

E, H, STEPS = 2, 8, 6
EPISODES = 3  # lane 0 ends an episode after step 2: episodes (0, 0..2), (0, 3..5) and (1, 0..5)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    step = {"obs": jnp.zeros((H, H), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = jb.TrajectoryBuffer.create(step, num_envs=E, length=8)
    for t in range(STEPS):
        obs = np.stack([np.full((H, H), 10 * t + e, np.uint8) for e in range(E)])
        buf = buf.add({"obs": obs, "action": np.zeros(E, np.int32), "reward": np.full(E, t, np.float32)},
                      terminated=np.array([t == 2, False]))
    path = jb.save(tmp_path_factory.mktemp("cli") / "buf", buf, progress=False)
    from jaxbuffers.cli import _commands

    loaded = _commands.load(path)  # restored once: each example runs the command on it (the folder is still checked)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_commands, "load", lambda p, progress=None: loaded if str(p) == str(path) else _commands.load(p, progress))
        yield path


def _digest(folder) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["--no-progress", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


BAD = {  # option -> (commands that take it, wrong values)
    "--episode": (("video", "sheet"), st.integers(-(10**6), -1) | st.integers(EPISODES, 10**6)),
    "--scale": (("video", "sheet"), st.integers(-(10**6), 0)),
    "--fps": (("video",), st.sampled_from([0.0, -1.0, math.nan, math.inf, -math.inf]) | st.floats(max_value=0.0)),
    "--count": (("sheet",), st.integers(-(10**6), 0)),
    "--columns": (("sheet",), st.integers(-(10**6), 0)),
    "--seed": (("sheet",), st.integers(-(10**6), -1)),
    "--image": (("video", "sheet"), st.sampled_from(["reward", "action", "nope", "obs.x"])),
    "--member": (("inspect", "video", "sheet"), st.sampled_from(["0", "1,2", "x", "-1"])),
}


def _argv(command: str, out) -> list:
    if command == "video":
        return ["video", "--episode", 0, "--out", out / "v.gif"]
    if command == "sheet":
        return ["sheet", "--out", out / "s.png"]
    return ["inspect"]


@SETTINGS
@given(data=st.data(), option=st.sampled_from(sorted(BAD)))
def test_each_wrong_option_is_one_error_line_naming_it_and_writes_nothing(saved, tmp_path_factory, capsys, data, option):
    commands, values = BAD[option]
    command = data.draw(st.sampled_from(commands), "command")
    value = data.draw(values, option)
    out = tmp_path_factory.mktemp("out")
    argv = _argv(command, out)
    if option in argv:  # `--option=value`: argparse reads "-inf" or "-1e+300" after a space as another option
        del argv[argv.index(option) : argv.index(option) + 2]
    argv.append(f"{option}={value}")
    before = _digest(saved)
    code, _, err = _run(capsys, argv[0], saved, *argv[1:])
    assert code == 2, (argv, err)
    assert err.startswith(f"jaxbuffers {command}: error: ") and err.count("\n") == 1, err
    assert option in err, err
    assert _digest(saved) == before and not any(out.iterdir())


@settings(SETTINGS, max_examples=4)
@given(data=st.data())
def test_accepted_values_write_their_output(saved, tmp_path_factory, capsys, data):
    out = tmp_path_factory.mktemp("out")
    episode, scale = data.draw(st.integers(0, EPISODES - 1), "episode"), data.draw(st.integers(1, 3), "scale")
    if data.draw(st.booleans(), "video"):
        fps = data.draw(st.floats(min_value=1000 / 655_350, max_value=1e3), "fps")  # a GIF frame lasts at most 655.35 s
        code, _, err = _run(capsys, "video", saved, "--episode", episode, "--out", out / "v.gif", "--scale", scale, "--fps", fps)
        assert code == 0 and (out / "v.gif").stat().st_size > 0, err
    else:
        count = data.draw(st.integers(1, 100), "count")  # more than the steps held: every step once
        code, _, err = _run(capsys, "sheet", saved, "--out", out / "s.png", "--count", count, "--columns", data.draw(st.integers(1, 9)),
                            "--seed", data.draw(st.integers(0, 2**31)), "--episode", episode, "--scale", scale)
        assert code == 0 and (out / "s.png").stat().st_size > 0, err


def test_png_frames_are_refused_into_a_non_empty_folder_and_leave_it_unchanged(saved, tmp_path, capsys):
    """A folder holding an earlier export (or anything else) is refused: its files would mix with the new frames."""
    code, _, err = _run(capsys, "video", saved, "--episode", 2, "--out", tmp_path / "png")
    assert code == 0, err
    before = _digest(tmp_path / "png")
    assert len(before) == STEPS  # episode 2 is lane 1's six steps
    for out in (tmp_path / "png", f"{tmp_path / 'png'}/"):
        code, _, err = _run(capsys, "video", saved, "--episode", 0, "--out", out)
        assert code == 2 and err.startswith("jaxbuffers video: error: --out: the folder ") and "not empty" in err, err
        assert err.count("\n") == 1 and _digest(tmp_path / "png") == before
    (tmp_path / "empty").mkdir()
    code, _, err = _run(capsys, "video", saved, "--episode", 0, "--out", tmp_path / "empty")
    assert code == 0 and sorted(p.name for p in (tmp_path / "empty").iterdir()) == [f"frame_{t:05d}.png" for t in range(3)], err


def test_a_gif_frame_longer_than_the_format_holds_is_refused(saved, tmp_path, capsys):
    """A GIF frame's delay is 16 bits of hundredths of a second: `--fps 0.001` (1000 s a frame) is refused by name,
    before anything is written, instead of failing inside the image writer."""
    code, _, err = _run(capsys, "video", saved, "--episode", 0, "--out", tmp_path / "v.gif", "--fps", 0.001)
    assert code != 0 and "--fps: a GIF frame lasts at most 655.35 s" in err, err
    assert not (tmp_path / "v.gif").exists()
