"""The `jaxbuffers` console script on saved buffers of every type: inspect, video, sheet, serve."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import threading
import time
import typing
import urllib.error
import urllib.request
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxbuffers as jb
from jaxbuffers.cli import main
from jaxbuffers.cli._view import BufferView
from jaxbuffers.compressed import (
    CompressedEpisodeBuffer, CompressedPrioritisedTrajectoryBuffer, CompressedRolloutBuffer, CompressedTrajectoryBuffer,
)

pytest.importorskip("PIL")
pytest.importorskip("rich")

E, T, K, H = 2, 12, 4, 16  # lanes, steps added, frame stack, frame side
TERM_AT, TRUNC_AT = 5, 8  # lane 0 terminates after step 5; lane 1 is truncated after step 8


def frame(e: int, t: int) -> np.ndarray:
    """A frame unique to (lane, step)."""
    return ((np.arange(H * H).reshape(H, H) * 3 + 17 * t + 101 * e) % 256).astype(np.uint8)


def stacks() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """obs uint8 [T, E, K, H, H] as a reset-padding frame stacker makes them, terminated and truncated [T, E]."""
    obs = np.zeros((T, E, K, H, H), np.uint8)
    term, trunc = np.zeros((T, E), bool), np.zeros((T, E), bool)
    term[TERM_AT, 0], trunc[TRUNC_AT, 1] = True, True
    start = [0] * E
    for t in range(T):
        for e in range(E):
            obs[t, e] = np.stack([frame(e, max(start[e], t - K + 1 + i)) for i in range(K)])
        for e in range(E):
            if term[t, e] or trunc[t, e]:
                start[e] = t + 1
    return obs, term, trunc


def tiled(stack: np.ndarray) -> np.ndarray:
    return np.concatenate(list(stack), axis=1)


def _step(obs_shape=(K, H, H)):
    return {"obs": jnp.zeros(obs_shape, jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}


def _fill_trajectory(buf):
    obs, term, trunc = stacks()
    for t in range(T):
        step = {"obs": jnp.asarray(obs[t]), "action": jnp.full(E, t, jnp.int32), "reward": jnp.full(E, t / 2, jnp.float32)}
        final = np.concatenate([obs[t][:, 1:], obs[t][:, -1:]], axis=1)  # the step's stack shifted by one frame
        buf = buf.add(step, terminated=jnp.asarray(term[t]), truncated=jnp.asarray(trunc[t]), final_obs=jnp.asarray(final))
    return buf


def _replay():
    obs, term, trunc = stacks()
    item = {"obs": jnp.zeros((K, H, H), jnp.uint8), "reward": jnp.float32(0), "terminated": jnp.bool_(False)}
    buf = jb.ReplayBuffer.create(item, capacity=64)
    return buf.add({"obs": jnp.asarray(obs[:, 0]), "reward": jnp.arange(T, dtype=jnp.float32), "terminated": jnp.asarray(term[:, 0])})


def _prioritised():
    item = {"x": jnp.zeros(3), "reward": jnp.float32(0)}
    buf = jb.PrioritisedReplayBuffer.create(item, capacity=16, metrics=True)
    buf = buf.add({"x": jnp.ones((10, 3)), "reward": jnp.arange(10, dtype=jnp.float32)})
    buf = buf.record(buf.sample(jax.random.key(0), 4))
    return buf.set_priorities(jnp.arange(4), jnp.array([1.0, 2.0, 3.0, 4.0]), buf.generations_at(jnp.arange(4)))


def _rollout(compressed: bool):
    obs, term, trunc = stacks()
    kw = dict(num_envs=E, num_steps=T)
    buf = CompressedRolloutBuffer.create(_step(), compress=("obs",), **kw) if compressed else jb.RolloutBuffer.create(_step(), **kw)
    for t in range(T):
        step = {"obs": jnp.asarray(obs[t]), "action": jnp.full(E, t, jnp.int32), "reward": jnp.zeros(E, jnp.float32)}
        buf = buf.add(step, reward=jnp.full(E, t / 2), value=jnp.zeros(E), terminated=jnp.asarray(term[t]), truncated=jnp.asarray(trunc[t]), final_value=jnp.zeros(E))
    return buf


# the episodes of stacks(): (lane, first step, steps, terminated, meta task), added in this order
EPISODES = [(0, 0, TERM_AT + 1, True, 0), (0, TERM_AT + 1, T - TERM_AT - 1, False, 1), (1, 0, TRUNC_AT + 1, False, 1),
            (1, TRUNC_AT + 1, T - TRUNC_AT - 1, False, 2)]
MAX_T = 10


def _episodes(buf):
    """The four episodes of stacks() added whole, into three slots: the first one is replaced."""
    obs, _, _ = stacks()
    for lane, t0, n, term, task in EPISODES:
        pad = lambda x: np.concatenate([x, np.zeros((MAX_T - n, *x.shape[1:]), x.dtype)])  # noqa: E731
        ep = {"obs": jnp.asarray(pad(obs[t0 : t0 + n, lane])), "action": jnp.asarray(pad(np.arange(t0, t0 + n, dtype=np.int32))),
              "reward": jnp.asarray(pad(np.arange(t0, t0 + n, dtype=np.float32) / 2))}
        final = np.concatenate([obs[t0 + n - 1, lane, 1:], frame(lane, t0 + n)[None]])  # the stack after the last step
        buf = buf.add_episode(ep, n, terminated=term, truncated=not term, final_obs=jnp.asarray(final),
                              meta={"task": jnp.int32(task)})
    return buf


def _episode_buffer(compressed: bool):
    kw = dict(max_episodes=3, max_timesteps=MAX_T, meta={"task": jnp.int32(7)})
    return _episodes(CompressedEpisodeBuffer.create(_step(), frame_stack=K, **kw) if compressed else jb.EpisodeBuffer.create(_step(), **kw))


BUILDERS = {
    "ReplayBuffer": _replay,
    "PrioritisedReplayBuffer": _prioritised,
    "TrajectoryBuffer": lambda: _fill_trajectory(jb.TrajectoryBuffer.create(_step(), num_envs=E, length=8)),
    "PrioritisedTrajectoryBuffer": lambda: _fill_trajectory(jb.PrioritisedTrajectoryBuffer.create(_step(), num_envs=E, length=32, window_length=2)),
    "RolloutBuffer": lambda: _rollout(False),
    "CompressedTrajectoryBuffer": lambda: _fill_trajectory(CompressedTrajectoryBuffer.create(_step(), num_envs=E, length=32, frame_stack=K)),
    "CompressedPrioritisedTrajectoryBuffer": lambda: _fill_trajectory(
        CompressedPrioritisedTrajectoryBuffer.create(_step(), num_envs=E, length=32, window_length=2, frame_stack=K)),
    "CompressedRolloutBuffer": lambda: _rollout(True),
    "EpisodeBuffer": lambda: _episode_buffer(False),
    "CompressedEpisodeBuffer": lambda: _episode_buffer(True),
}
# (steps held, episodes, complete episodes) of each, counted by hand from stacks()
EXPECTED = {
    "ReplayBuffer": (12, 2, 1),  # one lane's 12 items: [0..5] terminated, [6..11] still running
    "PrioritisedReplayBuffer": (10, 0, 0),  # no flag field: no episodes
    "TrajectoryBuffer": (16, 4, 0),  # steps 4..11 per lane (length 8): lane 0 [4,5] [6..11], lane 1 [4..8] [9..11]
    "PrioritisedTrajectoryBuffer": (24, 4, 2),
    "RolloutBuffer": (24, 4, 0),  # a rollout's first run never counts as a whole episode
    "CompressedTrajectoryBuffer": (24, 4, 2),
    "CompressedPrioritisedTrajectoryBuffer": (24, 4, 2),
    "CompressedRolloutBuffer": (24, 4, 0),
    "EpisodeBuffer": (24 - TERM_AT - 1, 3, 3),  # the last three episodes, each whole
    "CompressedEpisodeBuffer": (24 - TERM_AT - 1, 3, 3),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    return {name: jb.save(root / name, build(), progress=False) for name, build in BUILDERS.items()}


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["--no-progress", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("name", list(BUILDERS))
def test_inspect_json(saved, capsys, name):
    code, out, err = run(capsys, "inspect", saved[name], "--json")
    assert code == 0, err
    s = json.loads(out)
    held, count, complete = EXPECTED[name]
    assert s["type"] == name
    assert (s["steps_held"], s["episodes"]["count"], s["episodes"]["complete"]) == (held, count, complete)
    assert s["bytes"]["disk"] > 0 and s["bytes"]["device"] > 0
    assert (s["bytes"]["host"] > 0) == name.startswith("Compressed")
    fields = {f["field"]: f for f in s["fields"]}
    assert "reward" in fields and fields["reward"]["dtype"] == "float32"
    if "obs" in fields:
        assert fields["obs"]["shape"] == [K, H, H] and fields["obs"]["compressed"] == name.startswith("Compressed")
        assert s["image_field"] == {"field": "obs", "shape": [K, H, H], "stack_axis": 0}
    assert s["config"].get("compress") == (["obs"] if name.startswith("Compressed") else None)
    assert (s["priorities"] is not None) == ("Prioritised" in name)
    assert (s["metrics"] is not None) == ("Rollout" not in name)  # through the wrapped buffer of a compressed one
    assert (s["rollout"] is not None) == ("Rollout" in name)
    if s["rollout"] is not None:  # no compute_gae: no advantage or return statistics (NaN, shown as null)
        assert s["rollout"]["has_advantages"] is False and s["rollout"]["learnt_steps"] == held
        assert s["rollout"]["return_max"] is None and s["rollout"]["explained_variance"] is None
    if s["metrics"] is not None:  # per-position counts are on by default: one per item, lane step or episode held
        assert s["metrics"]["inserts"] > 0
        assert s["metrics"]["sample_count"]["positions_held"] == (count if "Episode" in name else held)


def test_a_checkpoint_saved_with_x64_is_read(tmp_path, capsys):
    """64-bit fields (saved with jax_enable_x64 on) are read as saved: the command turns x64 on while it runs (and
    back off after), where it used to refuse the checkpoint ("cannot be stored without narrowing")."""
    big = 2**40
    with jax.enable_x64(True):
        buf = jb.ReplayBuffer.create({"obs": jnp.zeros((3,), jnp.float64), "action": jnp.int64(0), "reward": jnp.float32(0)}, capacity=8)
        buf = buf.add({"obs": jnp.full((5, 3), 0.1, jnp.float64) + jnp.arange(5.0)[:, None],
                       "action": big + jnp.arange(5, dtype=jnp.int64), "reward": jnp.arange(5, dtype=jnp.float32)})
        jb.save(tmp_path / "ck", buf, progress=False)
    code, out, err = run(capsys, "inspect", tmp_path / "ck", "--json")
    assert code == 0, err
    assert jax.config.jax_enable_x64 is False
    fields = {f["field"]: f for f in json.loads(out)["fields"]}
    assert (fields["action"]["dtype"], fields["action"]["min"], fields["action"]["max"]) == ("int64", big, big + 4)
    assert (fields["obs"]["dtype"], fields["obs"]["min"], fields["obs"]["max"]) == ("float64", 0.1, 4.1)


def test_inspect_reads_float8_and_int4_fields(tmp_path, capsys):
    """Fields of the ml_dtypes JAX holds (float8, float4, int4, uint4, bfloat16) are read and summarised as held."""
    names = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "int4", "uint4", "bfloat16")
    buf = jb.ReplayBuffer.create({n: np.zeros((2,), n) for n in names}, capacity=8)
    buf = buf.add({n: jnp.asarray(np.array([[-1, 2], [3, 0], [1, 1]] if n != "uint4" else [[1, 2], [3, 0], [1, 1]], n))
                   for n in names})
    jb.save(tmp_path / "ck", buf, progress=False)
    code, out, err = run(capsys, "inspect", tmp_path / "ck", "--json")
    assert code == 0, err
    fields = {f["field"]: f for f in json.loads(out)["fields"]}
    for n in names:
        assert (fields[n]["dtype"], fields[n]["min"], fields[n]["max"]) == (n, 0 if n == "uint4" else -1, 3), fields[n]


@pytest.mark.parametrize("name", ["[/bold]", "[red]x", "a[/b]", ":smile:", "a:thumbs_up:b"])
def test_inspect_shows_field_and_folder_names_as_written(tmp_path, capsys, name):
    """A field or folder named like rich markup or an emoji code is printed as written: no markup error, nothing
    dropped or replaced."""
    buf = jb.ReplayBuffer.create({"obs": jnp.zeros(2), name: jnp.int32(0)}, capacity=4)
    buf = buf.add({"obs": jnp.zeros((1, 2)), name: jnp.zeros(1, jnp.int32)})
    path = jb.save(tmp_path / name / "buf", buf, progress=False)
    code, out, err = run(capsys, "inspect", path)
    assert code == 0, err
    assert f"{name}/buf" in "".join(out.split()) and any(line.split("│")[1].strip() == name for line in out.splitlines()
                                                          if line.count("│") > 2), out


@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_32_bit_checkpoint_reads_the_same_with_x64(saved, capsys, name):
    """The command's x64 changes nothing for a 32-bit checkpoint: its summary is the one computed with x64 off."""
    from jaxbuffers.cli._commands import load, summary

    assert jax.config.jax_enable_x64 is False
    buffer, meta, root = load(saved[name], progress=False)
    want = json.loads(json.dumps(summary(buffer, meta, root, progress=False)))
    code, out, err = run(capsys, "inspect", saved[name], "--json")
    assert code == 0, err
    assert json.loads(out) == want


def test_inspect_statistics_and_priorities(saved, capsys):
    s = json.loads(run(capsys, "inspect", saved["PrioritisedReplayBuffer"], "--json")[1])
    reward = next(f for f in s["fields"] if f["field"] == "reward")
    assert (reward["min"], reward["max"], reward["mean"]) == (0.0, 9.0, 4.5)
    p = s["priorities"]
    assert p["count"] == 10 and p["min"] == pytest.approx(1.0) and p["max"] == pytest.approx(4.0)  # others keep max 1
    m = s["metrics"]
    assert (m["inserts"], m["samples"], m["record_calls"], m["stale"]) == (10, 4, 1, 0)
    assert m["sample_count"]["positions_held"] == 10 and sum(h["count"] for h in m["age_histogram"]) == 4
    s = json.loads(run(capsys, "inspect", saved["CompressedTrajectoryBuffer"], "--json")[1])
    obs = next(f for f in s["fields"] if f["field"] == "obs")  # decoded frames, every stored stack
    all_obs = stacks()[0]
    assert (obs["min"], obs["max"]) == (float(all_obs.min()), float(all_obs.max()))
    assert obs["mean"] == pytest.approx(all_obs.mean())
    hist = s["episodes"]["length_histogram"]
    assert sum(h["count"] for h in hist) == 2 and hist[0]["from"] == TERM_AT + 1 and hist[-1]["to"] == TRUNC_AT + 1
    assert (s["episodes"]["length_min"], s["episodes"]["length_max"]) == (TERM_AT + 1, TRUNC_AT + 1)


def test_inspect_without_decoding(saved, capsys):
    s = json.loads(run(capsys, "inspect", saved["CompressedRolloutBuffer"], "--json", "--no-decode")[1])
    obs = next(f for f in s["fields"] if f["field"] == "obs")
    assert obs["compressed"] and obs["min"] is None and obs["shape"] == [K, H, H]
    assert next(f for f in s["fields"] if f["field"] == "reward")["max"] == (T - 1) / 2


def test_stacked_buffer(tmp_path, capsys):
    def make(i):  # member i: three items, the one at i terminates an episode
        buf = jb.ReplayBuffer.create({"x": jnp.zeros(2), "terminated": jnp.bool_(False)}, capacity=4)
        return buf.add({"x": jnp.ones((3, 2)) * i, "terminated": jnp.arange(3) == i})

    path = jb.save(tmp_path / "stacked", jax.vmap(make)(jnp.arange(3)), progress=False)
    s = json.loads(run(capsys, "inspect", path, "--json")[1])
    assert s["stack_shape"] == [3] and [m["member"] for m in s["members"]] == [[0], [1], [2]]
    assert [(m["episodes"]["count"], m["episodes"]["complete"]) for m in s["members"]] == [(2, 1), (2, 1), (1, 1)]
    assert [next(f["mean"] for f in m["fields"] if f["field"] == "x") for m in s["members"]] == [0.0, 1.0, 2.0]
    code, out, _ = run(capsys, "inspect", path)
    assert code == 0 and "stacked (3,)" in out and "--member" in out
    one = json.loads(run(capsys, "inspect", path, "--json", "--member", 1)[1])
    assert {k: v for k, v in one.items() if k not in ("path", "bytes")} == {k: v for k, v in s["members"][1].items() if k != "member"}
    code, _, err = run(capsys, "sheet", path, "--out", tmp_path / "s.png")
    assert code == 2 and "stacked" in err and "--member 0..2" in err
    code, _, err = run(capsys, "inspect", path, "--member", "3")
    assert code == 2 and "--member" in err and "(3,)" in err and "'3'" in err


@pytest.mark.parametrize("cls", [jb.TrajectoryBuffer, CompressedTrajectoryBuffer])
def test_sharded_buffer_one_member_per_shard(tmp_path, capsys, cls):
    from PIL import Image

    mesh = jax.make_mesh((jax.device_count(),), ("data",))  # one shard per device: 4 in the run on forced devices
    buf = jb.ShardedBuffer.create(lambda: cls.create(_step(), num_envs=E, length=32), mesh, "data")  # compressed: a store per shard
    s = buf.num_shards
    obs, term, trunc = stacks()
    shard_obs = [((obs.astype(np.int32) + 40 * i) % 256).astype(np.uint8) for i in range(s)]  # frames of shard i
    lanes = lambda x: jnp.asarray(np.concatenate(x, axis=0))  # noqa: E731 - [S * E, ...]: shard i's lanes i*E..
    for t in range(T):
        o = lanes([x[t] for x in shard_obs])
        buf = buf.add({"obs": o, "action": jnp.full(s * E, t, jnp.int32), "reward": jnp.full(s * E, t / 2, jnp.float32)},
                      terminated=lanes([term[t]] * s), truncated=lanes([trunc[t]] * s), final_obs=o)
    path = jb.save(tmp_path / "sharded", buf, progress=False)
    out = json.loads(run(capsys, "inspect", path, "--json")[1])
    assert out["sharded"] == {"axis": "data", "num_shards": s} and out["stack_shape"] == [s]
    assert [(m["steps_held"], m["episodes"]["count"], m["episodes"]["complete"]) for m in out["members"]] == [(24, 4, 2)] * s
    code, text, _ = run(capsys, "inspect", path)
    assert code == 0 and f"ShardedBuffer of {s} shards" in text and "'data'" in text
    code, _, err = run(capsys, "sheet", path, "--out", tmp_path / "s.png")
    assert code == 2 and "ShardedBuffer" in err and f"--member 0..{s - 1}" in err
    last = s - 1
    code, _, err = run(capsys, "video", path, "--member", last, "--episode", 0, "--out", f"{tmp_path}/png/", "--no-overlay",
                       "--scale", 1)
    assert code == 0, err
    pngs = sorted((tmp_path / "png").glob("frame_*.png"))
    assert len(pngs) == TERM_AT + 1  # episode 0: lane 0 up to its termination
    for t, p in enumerate(pngs):
        np.testing.assert_array_equal(np.asarray(Image.open(p)), tiled(shard_obs[last][t, 0]))


def test_unsupported_type_is_named(saved, capsys, tmp_path):
    import shutil

    from jaxbuffers.cli._view import ViewError

    shutil.copytree(saved["ReplayBuffer"], tmp_path / "other")
    meta = json.loads((tmp_path / "other" / "buffer.json").read_text())
    (tmp_path / "other" / "buffer.json").write_text(json.dumps({**meta, "class": "SomeNewBuffer"}))
    code, _, err = run(capsys, "inspect", tmp_path / "other")
    assert code == 2 and "'SomeNewBuffer'" in err and "CompressedEpisodeBuffer" in err and "ReplayBuffer" in err
    with pytest.raises(ViewError, match="CompressedEpisodeBuffer.*got a SumMinTree"):
        BufferView(jb.SumMinTree.create(8))


def test_inspect_tables(saved, capsys):
    code, out, _ = run(capsys, "inspect", saved["CompressedPrioritisedTrajectoryBuffer"])
    assert code == 0
    for text in ("CompressedPrioritisedTrajectoryBuffer", "obs (compressed)", "episodes", "priorities", "frame_stack",
                 "record_calls"):
        assert text in out


def test_step_field_named_like_a_buffer_field_keeps_both():
    """A step field named like one of the buffer's own per-step fields (a trajectory's `terminated` flag, a
    rollout's `value`) is read under `step.<name>`; the buffer's field keeps its name, its dtype and its values."""
    step = {"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0), "terminated": jnp.float32(0)}
    buf = jb.TrajectoryBuffer.create(step, num_envs=1, length=4)
    for t in range(3):
        buf = buf.add({"obs": np.zeros((1, 2), np.float32), "action": np.zeros(1, np.int32), "reward": np.ones(1, np.float32),
                       "terminated": np.full(1, 7.0, np.float32)}, terminated=np.array([t == 1]))
    rollout = jb.RolloutBuffer.create({"obs": jnp.zeros(2), "value": jnp.int32(0)}, num_envs=1, num_steps=2)
    rollout = rollout.add({"obs": jnp.zeros((1, 2)), "value": jnp.full(1, 5, jnp.int32)}, reward=jnp.ones(1), value=jnp.full(1, 0.5),
                          terminated=jnp.zeros(1, bool))
    for b, name, own, dtype, mine in ((buf, "terminated", [False, True, False], np.bool_, 7.0), (rollout, "value", [0.5], np.float32, 5)):
        view = BufferView(b)
        assert view.fields.count(name) == 1 and f"step.{name}" in view.fields
        assert view.column(name).tolist() == own and view.spec(name)[1] == dtype
        assert view.column(f"step.{name}").tolist() == [mine] * len(own)


@pytest.mark.parametrize("name", ["TrajectoryBuffer", "CompressedTrajectoryBuffer", "CompressedRolloutBuffer", "ReplayBuffer"])
def test_video_frames_equal_stored_frames(saved, capsys, tmp_path, name):
    from PIL import Image

    obs, _, _ = stacks()
    view = BufferView(jb.restore(saved[name], progress=False))
    ep = view.episodes[1]
    # the stored stacks of that episode, from the inputs (not from the buffer)
    lane = max(ep.lane, 0)
    t0 = {"TrajectoryBuffer": 6, "ReplayBuffer": 6}.get(name, 0)  # first step of episode 1 in the lane
    if name in ("CompressedTrajectoryBuffer", "CompressedRolloutBuffer"):
        t0, lane = TERM_AT + 1, 0
    want = [tiled(obs[t0 + t, lane]) for t in range(ep.length)]
    code, _, err = run(capsys, "video", saved[name], "--episode", 1, "--out", f"{tmp_path}/png/", "--no-overlay", "--scale", 1)
    assert code == 0, err
    pngs = sorted((tmp_path / "png").glob("frame_*.png"))
    assert len(pngs) == ep.length
    for p, w in zip(pngs, want):
        np.testing.assert_array_equal(np.asarray(Image.open(p)), w)
    code, _, err = run(capsys, "video", saved[name], "--episode", 1, "--out", tmp_path / "ep.gif", "--no-overlay", "--scale", 1)
    assert code == 0, err
    gif = Image.open(tmp_path / "ep.gif")
    got = []
    for i in range(gif.n_frames):  # identical consecutive frames are merged into a longer one
        gif.seek(i)
        got += [np.asarray(gif.convert("L"))] * round(gif.info["duration"] / round(1000 / 15))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_video_mp4_with_overlay(saved, capsys, tmp_path):
    iio = pytest.importorskip("imageio.v2")
    pytest.importorskip("imageio_ffmpeg")
    code, out, err = run(capsys, "video", saved["CompressedTrajectoryBuffer"], "--episode", 0, "--out", tmp_path / "ep.mp4")
    assert code == 0, err
    with iio.get_reader(tmp_path / "ep.mp4") as r:
        frames = [f for f in r]
    assert len(frames) == TERM_AT + 1
    assert frames[0].shape[1] >= K * H * 2 and frames[0].shape[0] > H * 2  # scaled x2, plus the text band


def test_video_mp4_forks_no_copy_of_this_process(saved, capsys, tmp_path):
    """The encoder starts without a fork of this (multithreaded, JAX) process running Python: no at-fork handler runs,
    so JAX's "os.fork() was called ... deadlock" warning is not given (imageio's writer gave it on every .mp4)."""
    pytest.importorskip("imageio_ffmpeg")
    import os
    import warnings

    forks = []
    os.register_at_fork(before=lambda: forks.append(1))  # runs only where Python forks itself (os.fork, preexec_fn)
    jax.devices()  # JAX's own at-fork warning is installed with its backends
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run(capsys, "video", saved["CompressedTrajectoryBuffer"], "--episode", 0, "--out", tmp_path / "ep.mp4")
    assert code == 0, err
    assert (tmp_path / "ep.mp4").stat().st_size > 0
    assert not forks and not [w for w in caught if "fork" in str(w.message)], [str(w.message) for w in caught]


def test_video_mp4_encoder_errors_are_one_line(saved, capsys, tmp_path, monkeypatch):
    """An encoder that fails is one error line with its exit status, the file not claimed written."""
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lambda: "false")
    code, out, err = run(capsys, "video", saved["CompressedTrajectoryBuffer"], "--episode", 0, "--out", tmp_path / "ep.mp4")
    assert code == 2 and "--out: ffmpeg could not write" in err and "exit status 1" in err and out == ""


def test_inspect_shows_the_compressed_leaves_by_their_field_names(capsys, tmp_path):
    step = {"obs": {"pixels": jnp.zeros((4, 4), jnp.uint8), "pos": jnp.zeros(2)}, "action": jnp.int32(0), "reward": jnp.float32(0)}
    path = jb.save(tmp_path / "b", CompressedTrajectoryBuffer.create(step, num_envs=1, length=4, compress=["pixels"]), progress=False)
    code, out, err = run(capsys, "inspect", path, "--json")
    assert code == 0, err
    assert json.loads(out)["config"]["compress"] == ["obs.pixels"]
    code, out, err = run(capsys, "inspect", path)
    assert code == 0, err
    row = next(line for line in out.splitlines() if " compress " in line)
    assert "obs.pixels" in row and "[" not in row and "'" not in row


def test_sheet(saved, capsys, tmp_path):
    from PIL import Image

    code, _, err = run(capsys, "sheet", saved["CompressedTrajectoryBuffer"], "--out", tmp_path / "s.png", "--count", 6, "--columns", 3)
    assert code == 0, err
    img = np.asarray(Image.open(tmp_path / "s.png"))
    assert img.ndim == 3 and img.shape[1] > 3 * K * H and img.shape[0] > 2 * H  # 3 columns of 4 tiled frames, 2 rows
    # every cell holds a stored stack: find the first cell's pixels among the stored stacks
    cell = img[4 : 4 + H, 4 : 4 + K * H, 0]
    obs = stacks()[0].reshape(-1, K, H, H)
    assert any(np.array_equal(cell, tiled(s)) for s in obs)


def test_sheet_says_when_count_is_more_than_the_buffer_holds(saved, capsys, tmp_path):
    """`--count` above the steps held (or the episode's steps) draws every step, and says so on stderr (it wrote
    fewer frames than asked without a word)."""
    path = saved["TrajectoryBuffer"]
    held = BufferView(jb.restore(path)).num_steps
    code, out, err = run(capsys, "sheet", path, "--out", tmp_path / "s.png", "--count", 1000)
    assert code == 0 and out.startswith("wrote ")
    assert err == f"jaxbuffers sheet: --count 1000 is more than the {held} steps the buffer holds: drew all {held}\n"
    code, _, err = run(capsys, "sheet", path, "--out", tmp_path / "s.png", "--count", held)
    assert code == 0 and err == ""
    code, _, err = run(capsys, "sheet", path, "--out", tmp_path / "s.png", "--episode", 0)
    assert code == 0 and re.fullmatch(r"jaxbuffers sheet: --count 16 is more than the \d+ steps episode 0 holds: drew all \d+\n", err)


def test_sheet_larger_than_the_pixel_bound_is_refused_before_drawing(saved, capsys, tmp_path):
    """A sheet over `MAX_SHEET_PIXELS` (many frames at a large `--scale`) is refused, naming the options and the size,
    and nothing is written; the same frames at scale 1 are drawn."""
    from jaxbuffers.cli._images import MAX_SHEET_PIXELS

    path = saved["CompressedTrajectoryBuffer"]
    code, _, err = run(capsys, "sheet", path, "--out", tmp_path / "s.png", "--scale", 10**6)
    most = int(re.search(r"in \[1, (\d+)\]", err).group(1))
    code, _, err = run(capsys, "sheet", path, "--out", tmp_path / "s.png", "--count", 1000, "--scale", most)
    size = re.search(r"\((\d+)x(\d+) pixels\)", err)
    assert code != 0 and "--count/--columns/--scale: expected a sheet of at most" in err
    assert int(size.group(1)) * int(size.group(2)) > MAX_SHEET_PIXELS and not (tmp_path / "s.png").exists()
    code, _, err = run(capsys, "sheet", path, "--out", tmp_path / "s.png", "--count", 1000)
    assert code == 0 and (tmp_path / "s.png").exists()


def test_sheet_cells_are_wide_enough_for_their_labels():
    """Labels of small frames are not cut to the picture's width: the cell is as wide as the widest label, and its
    text reaches past the picture."""
    from jaxbuffers.cli._images import contact_sheet, label_width

    pics, labels = [np.full((4, 4), 255, np.uint8)] * 2, ["ep 12 t 345", "ep 3 t 7"]
    sheet = contact_sheet(pics, labels, columns=2)
    width = label_width(labels)
    assert width > 4 and sheet.shape[1] == 2 * (width + 4) + 4
    band = sheet[4 + 4 :, 4 + 4 : 4 + width]  # the first cell's band, right of the picture's 4 columns
    assert band.max() > 128  # the label's text is drawn there


def test_sheet_writes_the_format_its_extension_names(saved, capsys, tmp_path):
    magic = {"s.png": b"\x89PNG", "s.jpg": b"\xff\xd8\xff", "s.JPEG": b"\xff\xd8\xff", "s.gif": b"GIF8", "s.bmp": b"BM"}
    for name, head in magic.items():
        code, _, err = run(capsys, "sheet", saved["CompressedTrajectoryBuffer"], "--out", tmp_path / name, "--count", 2)
        assert code == 0, err
        assert (tmp_path / name).read_bytes()[: len(head)] == head, name
    for name in ("s.xyz", "s"):
        code, out, err = run(capsys, "sheet", saved["CompressedTrajectoryBuffer"], "--out", tmp_path / name)
        assert code == 2 and "--out" in err and name in err and ".png" in err and out == ""
        assert not (tmp_path / name).exists()


def test_errors_name_the_argument(saved, capsys, tmp_path):
    code, _, err = run(capsys, "inspect", tmp_path / "nope")
    assert code == 2 and "PATH" in err and "nope" in err and "no such" in err
    (tmp_path / "plain").mkdir()
    code, _, err = run(capsys, "video", tmp_path / "plain", "--episode", 0, "--out", tmp_path / "x.gif")
    assert code == 2 and "buffer.json" in err
    code, _, err = run(capsys, "video", saved["TrajectoryBuffer"], "--episode", 9, "--out", tmp_path / "x.gif")
    assert code == 2 and "--episode" in err and "[0, 3]" in err and "9" in err
    code, _, err = run(capsys, "video", saved["PrioritisedReplayBuffer"], "--episode", 0, "--out", tmp_path / "x.gif")
    assert code == 2 and "image field" in err and "'x': [3]" in err
    code, _, err = run(capsys, "video", saved["TrajectoryBuffer"], "--episode", 0, "--out", tmp_path / "x.avi")
    assert code == 2 and "--out" in err and "x.avi" in err
    code, _, err = run(capsys, "sheet", saved["TrajectoryBuffer"], "--out", tmp_path / "s.png", "--image", "reward")
    assert code == 2 and "--image" in err and "reward" in err


def test_help_of_every_command():
    for cmd in ([], ["inspect"], ["video"], ["sheet"], ["serve"]):
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--help"])
        assert e.value.code == 0
    out = subprocess.run([sys.executable, "-m", "jaxbuffers.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and all(c in out.stdout for c in ("inspect", "video", "sheet", "serve"))


@pytest.mark.parametrize("cmd", [["inspect", "P"], ["video", "P", "--episode", "0", "--out", "x.gif"],
                                 ["sheet", "P", "--out", "x.png"], ["serve", "P"]], ids=lambda c: c[0])
def test_global_options_go_before_or_after_the_command(cmd):
    """`--no-progress` is taken before the sub-command, after it, or both (was "unrecognized arguments" after)."""
    from jaxbuffers.cli import build_parser

    for argv, want in (([*cmd], False), (["--no-progress", *cmd], True), ([*cmd, "--no-progress"], True),
                       ([cmd[0], "--no-progress", *cmd[1:]], True), (["--no-progress", *cmd, "--no-progress"], True)):
        assert build_parser().parse_args(argv).no_progress is want, argv


def test_no_progress_after_the_command_runs_it(saved, capsys):
    code = main(["inspect", str(saved["ReplayBuffer"]), "--json", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["type"] == "ReplayBuffer" and err == ""


def test_console_script_declared():
    import importlib
    import tomllib

    scripts = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["scripts"]
    module, func = scripts["jaxbuffers"].split(":")
    assert getattr(importlib.import_module(module), func) is main


def test_episode_buffer_view():
    obs, _, _ = stacks()
    step = _step()
    buf = jb.EpisodeBuffer.create(step, max_episodes=2, max_timesteps=8, meta={"task": jnp.int32(0)})
    for i, (a, n) in enumerate([(0, 3), (3, 6), (9, 2)]):  # three episodes into two slots: the first is replaced
        ep = {"obs": jnp.asarray(np.pad(obs[a : a + n, 0], ((0, 8 - n),) + ((0, 0),) * 3)),
              "action": jnp.zeros(8, jnp.int32), "reward": jnp.arange(8, dtype=jnp.float32)}
        buf = buf.add_episode(ep, n, terminated=i == 1, truncated=i == 2, final_obs=jnp.asarray(obs[0, 0]), meta={"task": jnp.int32(i)})
    view = BufferView(buf)
    assert [(e.length, e.terminated, e.truncated, e.partial) for e in view.episodes] == [(6, True, False, False), (2, False, True, False)]
    np.testing.assert_array_equal(view.column("obs", view.episodes[1].positions), obs[9:11, 0])
    np.testing.assert_array_equal(view.column("meta.task"), [1] * 6 + [2] * 2)
    np.testing.assert_array_equal(view.column("truncated"), [False] * 7 + [True])


@pytest.mark.parametrize("name", ["EpisodeBuffer", "CompressedEpisodeBuffer"])
def test_episode_buffers(saved, capsys, tmp_path, name):
    """inspect (labels, meta fields, decoded frames), the lossless video of an episode, and a sheet of one episode."""
    from PIL import Image

    obs = stacks()[0]
    held = [obs[t0 : t0 + n, lane] for lane, t0, n, _, _ in EPISODES[1:]]  # the last three episodes' stacks
    s = json.loads(run(capsys, "inspect", saved[name], "--json")[1])
    assert (s["steps_held_label"], s["num_added"], s["num_added_unit"]) == ("steps held (all 3 episodes)", 4, "episodes")
    assert s["config"]["meta"] == {"task": "int32[]"}
    assert s["meta"] == [{"name": "task", "dtype": "int32", "shape": [], "default": 7, "min": 1, "max": 2,
                          "values": [{"value": 1, "episodes": 2}, {"value": 2, "episodes": 1}]}]
    f = next(f for f in s["fields"] if f["field"] == "obs")
    all_held = np.concatenate(held)
    assert f["compressed"] == name.startswith("Compressed") and (f["min"], f["max"]) == (all_held.min(), all_held.max())
    assert f["mean"] == pytest.approx(all_held.mean())
    code, out, _ = run(capsys, "inspect", saved[name])
    assert code == 0 and "steps held (all 3 episodes)" in out and "ever added (episodes)" in out and "1: 2, 2: 1" in out

    code, _, err = run(capsys, "video", saved[name], "--episode", 1, "--out", f"{tmp_path}/png/", "--no-overlay", "--scale", 1)
    assert code == 0, err
    got = [np.asarray(Image.open(p)) for p in sorted((tmp_path / "png").glob("frame_*.png"))]
    np.testing.assert_array_equal(got, [tiled(x) for x in held[1]])  # frame stacks rebuilt, bytes exact
    code, _, err = run(capsys, "sheet", saved[name], "--out", tmp_path / "s.png", "--episode", 2, "--columns", 8)
    assert code == 0, err
    img = np.asarray(Image.open(tmp_path / "s.png"))
    w = K * H + 4  # a cell and its gap
    cells = [img[4 : 4 + H, 4 + i * w : 4 + i * w + K * H, 0] for i in range(len(held[2]))]
    assert img.shape[1] == 4 + len(held[2]) * w  # the episode's three steps, no more
    np.testing.assert_array_equal(cells, [tiled(x) for x in held[2]])


def test_compressed_episode_buffer_served(saved):
    import io

    from PIL import Image

    from jaxbuffers.cli._images import find_image
    from jaxbuffers.cli._server import make_server

    view = BufferView(jb.restore(saved["CompressedEpisodeBuffer"], progress=False))
    srv = make_server(view, find_image(view), port=0, scale=1)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        s = json.loads(_get(url + "/api/summary")[1])
        assert [e["length"] for e in s["episodes"]] == [n for _, _, n, _, _ in EPISODES[1:]]
        code, body = _get(url + "/frame.png?k=1&t=3")
        assert code == 200 and np.array_equal(np.asarray(Image.open(io.BytesIO(body))), tiled(stacks()[0][3, 1]))
        ep = json.loads(_get(url + "/api/episode?k=2")[1])
        assert ep["steps"][0]["fields"]["meta.task"] == 2 and ep["steps"][-1]["fields"]["truncated"] is True
    finally:
        srv.shutdown()
        srv.server_close()


def test_disk_backed_folder(tmp_path, capsys):
    from PIL import Image

    from jaxbuffers import disk

    buf = disk.open(tmp_path / "d", "w", CompressedTrajectoryBuffer.create(_step(), num_envs=E, length=32, frame_stack=K, codec="none"))
    disk.flush(_fill_trajectory(buf))
    s = json.loads(run(capsys, "inspect", tmp_path / "d", "--json")[1])
    assert (s["type"], s["steps_held"], s["num_added_unit"]) == ("CompressedTrajectoryBuffer", E * T, "steps per lane")
    code, _, err = run(capsys, "video", tmp_path / "d", "--episode", 2, "--out", f"{tmp_path}/png/", "--no-overlay", "--scale", 1)
    assert code == 0, err
    got = [np.asarray(Image.open(p)) for p in sorted((tmp_path / "png").glob("*.png"))]
    np.testing.assert_array_equal(got, [tiled(x) for x in stacks()[0][: TRUNC_AT + 1, 1]])
    if os.path.isdir("/proc/self/fd"):  # each command closes the folder it opened
        gc.collect()
        before = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            assert run(capsys, "inspect", tmp_path / "d", "--json")[0] == 0
        gc.collect()
        assert len(os.listdir("/proc/self/fd")) == before


def test_disk_bytes_are_the_space_used(tmp_path, capsys):
    """A `codec="none"` disk folder's files are sparse: `disk` is the space they take (allocated blocks), which grows
    as frames are written, while their apparent size (`disk_apparent`) is the same empty or filled."""
    from jaxbuffers import disk

    def folder(name: str, fill: bool) -> dict:
        buf = disk.open(tmp_path / name, "w", CompressedTrajectoryBuffer.create(_step((H, H)), num_envs=E, length=512, codec="none"))
        if fill:
            rng = np.random.default_rng(0)
            n = 256
            buf = buf.add({"obs": rng.integers(0, 255, (E, n, H, H), np.uint8), "action": np.zeros((E, n), np.int32),
                           "reward": np.zeros((E, n), np.float32)}, terminated=np.zeros((E, n), bool))
        disk.flush(buf)
        buf.close()
        code, out, err = run(capsys, "inspect", tmp_path / name, "--json", "--no-decode")
        assert code == 0, err
        files = [p.stat() for p in (tmp_path / name).rglob("*") if p.is_file()]
        b = json.loads(out)["bytes"]
        assert b["disk"] == sum(st.st_blocks * 512 for st in files) and b["disk_apparent"] == sum(st.st_size for st in files)
        return b

    empty, full = folder("empty", False), folder("full", True)
    if empty["disk"] >= empty["disk_apparent"]:
        pytest.skip("this file system does not keep the files sparse")
    assert abs(full["disk_apparent"] - empty["disk_apparent"]) < 8192  # the same data files, the state beside them
    assert full["disk"] - empty["disk"] >= E * 256 * H * H  # the frames written take space
    code, out, _ = run(capsys, "inspect", tmp_path / "empty", "--no-decode")
    assert code == 0 and "apparent" in out


def test_serve_command(saved):
    """The real command in its own process: it prints its loopback URL and answers on it."""
    proc = subprocess.Popen([sys.executable, "-m", "jaxbuffers.cli", "--no-progress", "serve", str(saved["TrajectoryBuffer"]), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split("http://", 1)[1].split("/", 1)[0]
        code, body = _get(f"http://{url}/api/summary")
        assert code == 200 and json.loads(body)["type"] == "TrajectoryBuffer" and len(json.loads(body)["episodes"]) == 4
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("json_out", [True, False])
def test_a_reader_that_closes_stdout_early_ends_the_command_quietly(saved, json_out):
    """`jaxbuffers inspect --json PATH | head`: the pipe closed before the command writes ends it with status 1 and
    nothing on stderr, as the tables (rich) do (the JSON ended with a BrokenPipeError traceback)."""
    cmd = [sys.executable, "-m", "jaxbuffers.cli", "--no-progress", "inspect", str(saved["CompressedTrajectoryBuffer"])]
    proc = subprocess.Popen(cmd + ["--json"] * json_out, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command has imported JAX
    try:
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 1 and err == "", err[-2000:]
    finally:
        proc.kill()
        proc.wait()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def server(saved):
    from jaxbuffers.cli._images import find_image
    from jaxbuffers.cli._server import make_server

    view = BufferView(jb.restore(saved["CompressedTrajectoryBuffer"], progress=False))
    srv = make_server(view, find_image(view), port=0, scale=4)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_serve_routes(server):
    import io

    from PIL import Image

    code, body = _get(server + "/api/summary")
    s = json.loads(body)
    assert code == 200 and s["image"] == "obs" and [e["length"] for e in s["episodes"]] == [TERM_AT + 1, T - TERM_AT - 1, TRUNC_AT + 1, T - TRUNC_AT - 1]
    code, body = _get(server + "/api/episode?k=0")
    ep = json.loads(body)
    assert code == 200 and ep["length"] == TERM_AT + 1 and ep["steps"][TERM_AT]["fields"]["terminated"] is True
    code, body = _get(server + "/frame.png?k=2&t=3")
    got = np.asarray(Image.open(io.BytesIO(body)))
    want = np.repeat(np.repeat(tiled(stacks()[0][3, 1]), 4, 0), 4, 1)
    assert code == 200 and np.array_equal(got, want)
    code, body = _get(server + "/frame.png?k=2&t=99")
    assert code == 400 and "t: expected a step in [0, 8]" in json.loads(body)["error"]
    code, body = _get(server + "/api/episode?k=x")
    assert code == 400 and "k: expected an integer" in json.loads(body)["error"]
    for path in ("/api/episode?k=9", "/frame.png?k=-1&t=0"):  # the query parameter is named, not a command option
        code, body = _get(server + path)
        assert code == 400 and json.loads(body)["error"].startswith("k: expected an episode number in [0, 3], got "), body
    assert _get(server + "/elsewhere")[0] == 404


def test_serve_step_field_named_t_keeps_its_values():
    """A step field named `t` is served under `fields`, beside the step number, and neither hides the other."""
    from jaxbuffers.cli._server import make_server

    step = {"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0), "t": jnp.float32(0)}
    buf = jb.TrajectoryBuffer.create(step, num_envs=1, length=4)
    for i in range(3):
        buf = buf.add({"obs": np.zeros((1, 2), np.float32), "action": np.zeros(1, np.int32), "reward": np.zeros(1, np.float32),
                       "t": np.full(1, 10.0 + i, np.float32)}, terminated=np.array([i == 2]))
    srv = make_server(BufferView(buf), None, port=0, scale=1)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        ep = json.loads(_get(f"http://127.0.0.1:{srv.server_address[1]}/api/episode?k=0")[1])
        assert [(s["t"], s["fields"]["t"]) for s in ep["steps"]] == [(0, 10.0), (1, 11.0), (2, 12.0)]
    finally:
        srv.shutdown()
        srv.server_close()


def test_viewer_in_headless_chromium(server, tmp_path):
    from chromium import Chromium, chromium_path

    if chromium_path() is None:
        pytest.skip("no chromium executable (Debian package `chromium`; .ci/run installs it)")
    pytest.importorskip("websocket", reason="websocket-client drives Chromium (dev extra)")
    from PIL import Image

    with Chromium(tmp_path) as browser:
        browser.open(server + "/#k=2&t=0")
        browser.wait_frame(2, 0)
        shot0 = browser.screenshot(tmp_path / "step0.png")
        browser.click("next")
        browser.wait_frame(2, 1)
        shot1 = browser.screenshot(tmp_path / "step1.png")
        box = browser.box("frame")
    obs = stacks()[0]
    crop = lambda s: np.asarray(Image.open(s).convert("L"))[box[1] : box[1] + box[3], box[0] : box[0] + box[2]]  # noqa: E731
    scale4 = lambda x: np.repeat(np.repeat(x, 4, 0), 4, 1)  # noqa: E731
    np.testing.assert_array_equal(crop(shot0), scale4(tiled(obs[0, 1])))  # episode 2 is lane 1 from step 0
    np.testing.assert_array_equal(crop(shot1), scale4(tiled(obs[1, 1])))
    assert not np.array_equal(crop(shot0), crop(shot1))


def test_viewer_shows_field_names_as_text_and_runs_none_as_markup(tmp_path):
    """A field named like an HTML tag (its handler would retitle the page) is shown as its text in the viewer's
    table, and nothing in it runs: a checkpoint cannot run code in the page."""
    from chromium import Chromium, chromium_path

    if chromium_path() is None:
        pytest.skip("no chromium executable (Debian package `chromium`; .ci/run installs it)")
    pytest.importorskip("websocket", reason="websocket-client drives Chromium (dev extra)")
    from jaxbuffers.cli._images import find_image
    from jaxbuffers.cli._server import make_server

    name = "<img src=x onerror=\"document.title='INJECTED'\">"
    ex = {"obs": jnp.zeros((8, 8), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0), name: jnp.float32(0)}
    buf = jb.TrajectoryBuffer.create(ex, num_envs=1, length=4).add(
        {"obs": jnp.zeros((1, 2, 8, 8), jnp.uint8), "action": jnp.zeros((1, 2), jnp.int32), "reward": jnp.zeros((1, 2)),
         name: jnp.zeros((1, 2))}, terminated=jnp.array([[False, True]]))
    view = BufferView(jb.restore(jb.save(tmp_path / "ck", buf, progress=False), progress=False))
    srv = make_server(view, find_image(view), port=0, scale=4)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with Chromium(tmp_path) as browser:
            browser.open(f"http://127.0.0.1:{srv.server_address[1]}/#k=0&t=0")
            browser.wait("document.querySelectorAll('#fields td.k').length > 0", "the field table shown")
            names = browser.eval("[...document.querySelectorAll('#fields td.k')].map((e) => e.textContent)")
            time.sleep(0.5)  # an injected image's error handler would have run by now
            title, images = browser.eval("[document.title, document.querySelectorAll('#fields img').length]")
    finally:
        srv.shutdown()
        srv.server_close()
    assert name in names and title == "jaxbuffers viewer" and images == 0


def test_viewer_serves_complex_fields_as_text(tmp_path):
    """JSON has no complex numbers: a complex field's values come as their text ("(1+2j)"), and an array over 16
    values as its shape without a min or max (as `inspect` gives none), never a dropped connection."""
    from jaxbuffers.cli._server import make_server

    ex = {"obs": jnp.zeros(2), "action": jnp.int32(0), "reward": jnp.float32(0), "z": jnp.zeros(2, jnp.complex64),
          "big": jnp.zeros(20, jnp.complex64)}
    buf = jb.TrajectoryBuffer.create(ex, num_envs=1, length=4).add(
        {"obs": jnp.zeros((1, 2, 2)), "action": jnp.zeros((1, 2), jnp.int32), "reward": jnp.zeros((1, 2)),
         "z": jnp.full((1, 2, 2), 1 + 2j, jnp.complex64), "big": jnp.ones((1, 2, 20), jnp.complex64)},
        terminated=jnp.array([[False, True]]))
    view = BufferView(jb.restore(jb.save(tmp_path / "ck", buf, progress=False), progress=False))
    srv = make_server(view, None, port=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        code, body = _get(f"http://127.0.0.1:{srv.server_address[1]}/api/episode?k=0")
    finally:
        srv.shutdown()
        srv.server_close()
    assert code == 200, body
    step = json.loads(body)["steps"][1]["fields"]
    assert step["z"] == ["(1+2j)", "(1+2j)"] and step["big"] == {"shape": [20], "min": None, "max": None}


def test_video_layout_and_stack_axis(saved, capsys, tmp_path):
    from PIL import Image

    obs = stacks()[0]
    code, _, err = run(capsys, "video", saved["TrajectoryBuffer"], "--episode", 0, "--out", f"{tmp_path}/n/", "--no-overlay",
                       "--scale", 1, "--layout", "newest")
    assert code == 0, err
    got = [np.asarray(Image.open(p)) for p in sorted((tmp_path / "n").glob("*.png"))]
    np.testing.assert_array_equal(got, obs[4:6, 0, -1])  # lane 0 holds steps 4..11; episode 0 is steps 4, 5
    code, _, err = run(capsys, "video", saved["TrajectoryBuffer"], "--episode", 0, "--out", f"{tmp_path}/c/", "--no-overlay",
                       "--scale", 1, "--stack-axis", "none")
    assert code == 2 and "--stack-axis" in err and "[4, 16, 16]" in err and "none" in err  # 16 channels: not a frame


def test_nonfinite_values_are_counted_and_served(tmp_path, capsys):
    from jaxbuffers.cli._server import _jsonable

    item = {"x": jnp.zeros(2), "reward": jnp.float32(0)}
    buf = jb.ReplayBuffer.create(item, capacity=4).add({"x": jnp.array([[1.0, jnp.nan], [2.0, 3.0]]), "reward": jnp.array([jnp.inf, 1.0])})
    s = json.loads(run(capsys, "inspect", jb.save(tmp_path / "nan", buf, progress=False), "--json")[1])
    x = next(f for f in s["fields"] if f["field"] == "x")
    assert (x["min"], x["max"], x["nonfinite"]) == (1.0, 3.0, 1)
    assert json.loads(json.dumps(_jsonable(np.array([1.5, np.nan, -np.inf])))) == [1.5, "nan", "-inf"]
    assert _jsonable(np.float32(np.inf)) == "inf" and _jsonable(np.bool_(True)) is True


def test_bfloat16_fields_have_statistics_and_images(tmp_path, capsys):
    """bfloat16 (which `np.issubdtype(.., np.floating)` does not count as floating) is a float like float16: its
    statistics and non-finite count are shown, an image field of it is found and drawn, and the page gets rounded
    numbers."""
    from jaxbuffers.cli._images import find_image
    from jaxbuffers.cli._server import _jsonable

    x = np.array([[1.0, 2.0, np.nan], [4.0, 5.0, 6.0]], np.float32)
    buf = jb.ReplayBuffer.create({"v": jnp.zeros(3, jnp.bfloat16), "img": jnp.zeros((H, H), jnp.bfloat16)}, capacity=4)
    buf = buf.add({"v": jnp.asarray(x, jnp.bfloat16), "img": jnp.full((2, H, H), 0.5, jnp.bfloat16)})
    s = json.loads(run(capsys, "inspect", jb.save(tmp_path / "bf", buf, progress=False), "--json")[1])
    v = next(f for f in s["fields"] if f["field"] == "v")
    assert (v["dtype"], v["min"], v["max"], v["mean"], v["nonfinite"]) == ("bfloat16", 1.0, 6.0, 3.6, 1)
    field = find_image(BufferView(buf))
    assert field is not None and field.name == "img"
    assert (field.picture(np.asarray(buf.storage["img"][0])) == 128).all()
    assert _jsonable(np.asarray([1 / 3], jnp.bfloat16)) == [0.333984]


def test_non_finite_float_pixels_are_drawn_without_a_warning():
    """NaN draws as 0, +inf as 255 and -inf as 0, with no numpy cast warning (warnings are errors here)."""
    import warnings

    from jaxbuffers.cli._images import ImageField

    field = ImageField("img", (2, 2), np.dtype(np.float32), None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = field.picture(np.array([[np.nan, 1.0], [np.inf, -np.inf]], np.float32))
    assert got.tolist() == [[0, 255], [255, 0]]


def test_nested_compressed_observation_view():
    from jaxbuffers.cli._images import find_image

    step = {"obs": {"pixels": jnp.zeros((H, H, 3), jnp.uint8), "vec": jnp.zeros(2)}, "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(step, num_envs=1, length=8, compress=("pixels",), normalize_images=True)
    px = np.random.default_rng(0).integers(0, 256, (5, 1, H, H, 3), dtype=np.uint8)
    for t in range(5):
        buf = buf.add({"obs": {"pixels": jnp.asarray(px[t]), "vec": jnp.ones((1, 2))}, "action": jnp.zeros(1, jnp.int32),
                       "reward": jnp.zeros(1)}, terminated=jnp.array([t == 2]))
    view = BufferView(buf)
    assert view.compressed_fields == ("obs.pixels",) and view.spec("obs.pixels") == ((H, H, 3), np.dtype(np.uint8))
    assert find_image(view).name == "obs.pixels" and find_image(view).stack_axis is None
    np.testing.assert_array_equal(view.column("obs.pixels"), px[:, 0])  # the stored bytes back from float32 samples
    assert [(e.length, e.partial) for e in view.episodes] == [(3, False), (2, True)]


def test_missing_extra_is_named(saved, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "rich.console", None)  # import of rich.console fails as if rich were absent
    monkeypatch.setitem(sys.modules, "rich", None)
    code, _, err = run(capsys, "inspect", saved["PrioritisedReplayBuffer"])
    assert code == 2 and "'rich'" in err and "jaxbuffers[inspect]" in err


def test_a_disk_folder_changed_after_its_flush_is_one_error_line(tmp_path, capsys):
    from jaxbuffers import disk

    kw = dict(max_episodes=3, max_timesteps=MAX_T, meta={"task": jnp.int32(7)})
    buf = _episodes(disk.open(tmp_path / "d", "w", CompressedEpisodeBuffer.create(_step(), frame_stack=K, codec="none", **kw)))
    disk.flush(buf)
    buf.close()
    frames = np.load(tmp_path / "d" / "store-0.npy", mmap_mode="r+")  # every frame changed behind the folder's back
    frames += 1
    frames.flush()
    del frames
    code, _, err = run(capsys, "video", tmp_path / "d", "--episode", 0, "--out", f"{tmp_path}/png/")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("jaxbuffers video: error: PATH: ") and "are corrupt (checksum mismatch)" in err and "restore them from a copy" in err


def test_bad_fps_and_unwritable_outputs_are_one_error_line(saved, tmp_path, capsys):
    path = saved["CompressedEpisodeBuffer"]
    code, _, err = run(capsys, "video", path, "--episode", 0, "--out", tmp_path / "v.gif", "--fps", 0)
    assert code == 2 and err == "jaxbuffers video: error: --fps: expected a finite number > 0, got 0.0\n", err
    (tmp_path / "file").write_text("not a folder")
    for argv in (("video", path, "--episode", 0, "--out", tmp_path / "file" / "v.gif"),
                 ("sheet", path, "--out", tmp_path / "file" / "s.png")):
        code, _, err = run(capsys, *argv)
        assert err == f"jaxbuffers {argv[0]}: error: --out: the folder {tmp_path / 'file'} is a file, not a folder; create it first (nothing was written)\n", err
    assert (tmp_path / "file").read_text() == "not a folder"


@pytest.mark.parametrize("out", ["v.gif", "v.mp4", "png/", "s.png"])
def test_an_out_in_a_missing_folder_is_refused_naming_it_and_nothing_is_made(saved, tmp_path, capsys, out):
    """`--out` goes into an existing folder: the commands never make the folders above it (a PNG frame folder
    itself is made, as before)."""
    path = saved["CompressedEpisodeBuffer"]
    cmd = ["sheet", path] if out == "s.png" else ["video", path, "--episode", 0]
    code, o, err = run(capsys, *cmd, "--out", f"{tmp_path}/no/such/{out}")
    assert code == 2 and o == "" and err == (f"jaxbuffers {cmd[0]}: error: --out: the folder {tmp_path / 'no' / 'such'} "
                                             "does not exist; create it first (nothing was written)\n"), err
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("scale", [0, 65, 100_000])
def test_a_scale_past_the_largest_picture_is_refused_naming_the_range(saved, tmp_path, capsys, scale):
    """`--scale` makes pictures of at most 4096 pixels a side (a row of 4 tiles of 16x16: scale <= 64): a larger one
    is refused before anything is drawn or allocated, as is 0; `serve` refuses it when it starts."""
    from jaxbuffers.cli._images import find_image
    from jaxbuffers.cli._server import make_server
    from jaxbuffers.cli._view import ViewError

    path = saved["CompressedEpisodeBuffer"]
    says = f"--scale: expected an integer in [1, 64] (a 16x64 picture scaled to at most 4096 pixels a side), got {scale}"
    for cmd in (["video", path, "--episode", 0, "--out", tmp_path / "v.gif"], ["sheet", path, "--out", tmp_path / "s.png"]):
        code, o, err = run(capsys, *cmd, "--scale", scale)
        assert code == 2 and err == f"jaxbuffers {cmd[0]}: error: {says}\n", err
    assert not any(tmp_path.iterdir())
    view = BufferView(jb.restore(path, progress=False))
    with pytest.raises(ViewError, match=re.escape(says)):
        make_server(view, find_image(view), port=0, scale=scale)


def test_a_sheet_of_an_empty_buffer_says_only_that_it_holds_no_steps(tmp_path, capsys):
    jb.save(tmp_path / "ck", jb.ReplayBuffer.create({"obs": jnp.zeros((H, H), jnp.uint8)}, capacity=4))
    code, _, err = run(capsys, "sheet", tmp_path / "ck", "--out", tmp_path / "s.png")
    assert code == 2 and err == "jaxbuffers sheet: error: sheet: no frames to show (the buffer holds no steps)\n", err
    assert not (tmp_path / "s.png").exists()


def test_small_frames_are_refused_with_the_rule_and_taken_with_a_stack_axis(capsys, tmp_path):
    """A [4, 4] uint8 field is not taken for an image on its own: the error states the rule (H, W >= 8 unless
    --stack-axis is given), and with `--stack-axis none` the sheet is drawn."""
    buf = jb.ReplayBuffer.create({"obs": jnp.zeros((4, 4), jnp.uint8)}, capacity=4).add({"obs": jnp.ones((2, 4, 4), jnp.uint8)})
    jb.save(tmp_path / "small", buf)
    code, _, err = run(capsys, "sheet", tmp_path / "small", "--out", tmp_path / "s.png")
    assert code == 2 and "H, W >= 8" in err and "--stack-axis" in err and "'obs': [4, 4]" in err
    code, _, err = run(capsys, "sheet", tmp_path / "small", "--out", tmp_path / "s.png", "--stack-axis", "none")
    assert code == 0, err


def test_python_dash_m_jaxbuffers_runs_the_command(capsys, monkeypatch):
    """`python -m jaxbuffers --help` is the `jaxbuffers` command's help (run in process with `runpy`)."""
    import runpy

    monkeypatch.setattr(sys, "argv", ["jaxbuffers", "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("jaxbuffers", run_name="__main__")
    assert exit_.value.code == 0 and "sheet" in capsys.readouterr().out


def test_progress_bars_only_on_a_terminal_unless_asked(saved, capsys, monkeypatch):
    from jaxbuffers.cli import _commands

    bar = _commands.tqdm
    monkeypatch.setattr(_commands, "tqdm", lambda *a, **k: bar(*a, **{**k, "delay": 0}))  # every bar at once
    path = saved["CompressedTrajectoryBuffer"]
    assert main(["inspect", str(path), "--json"]) == 0  # stderr is not a terminal here
    assert "decode obs" not in capsys.readouterr().err
    assert main(["--progress", "inspect", str(path), "--json"]) == 0
    assert "decode obs" in capsys.readouterr().err


def test_video_mp4_to_a_name_starting_with_a_dash_and_a_chatty_failing_encoder(saved, capsys, tmp_path, monkeypatch):
    """A relative output name starting with '-' is written (not read by ffmpeg as an option); an encoder that fails
    after writing more messages than a pipe holds does not block the command: one error line, the last of them."""
    imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "video", saved["CompressedTrajectoryBuffer"], "--episode", 0, "--out=-ep.mp4")
    assert code == 0, err
    assert (tmp_path / "-ep.mp4").stat().st_size > 0
    chatty = tmp_path / "chatty"
    chatty.write_text("#!/bin/sh\nhead -c 300000 /dev/zero | tr '\\0' x >&2\necho last words >&2\nexit 3\n")
    chatty.chmod(0o755)
    monkeypatch.setattr(imageio_ffmpeg, "get_ffmpeg_exe", lambda: str(chatty))
    code, out, err = run(capsys, "video", saved["CompressedTrajectoryBuffer"], "--episode", 0, "--out", tmp_path / "x.mp4")
    assert code == 2 and "exit status 3" in err and "last words" in err and out == ""


class _Step(typing.NamedTuple):
    obs: jax.Array
    reward: jax.Array


def test_a_checkpoint_of_namedtuple_items_is_read_from_its_recorded_layout(tmp_path, capsys):
    """buffer.json records a NamedTuple's layout, not its type: the tools read the checkpoint with stand-ins of it
    (nothing imported), under the saved field names."""
    buf = jb.ReplayBuffer.create(_Step(jnp.zeros((H, H), jnp.uint8), jnp.float32(0)), capacity=8)
    buf = buf.add(_Step(jnp.asarray(np.stack([frame(0, t) for t in range(3)])), jnp.arange(3, dtype=jnp.float32)))
    jb.save(tmp_path / "ck", buf)
    code, out, err = run(capsys, "inspect", tmp_path / "ck", "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["steps_held"] == 3 and {f["field"] for f in s["fields"]} == {"obs", "reward"}
    assert s["config"]["example"]["type"].endswith("_Step") and s["config"]["example"]["reward"] == "float32[]"
    code, _, err = run(capsys, "sheet", tmp_path / "ck", "--out", tmp_path / "s.png")
    assert code == 0 and (tmp_path / "s.png").is_file(), err
    meta = json.loads((tmp_path / "ck" / "buffer.json").read_text())  # written before layouts were recorded: its leaves
    (tmp_path / "ck" / "buffer.json").write_text(json.dumps({**meta, "config": {**meta["config"], "example": None}}))
    from jaxbuffers import checkpoint

    checkpoint._write_manifest(tmp_path / "ck", checkpoint._Progress(False, ""))
    code, out, err = run(capsys, "inspect", tmp_path / "ck", "--json")
    assert code == 0 and {f["field"] for f in json.loads(out)["fields"]} == {"obs", "reward"}, err
