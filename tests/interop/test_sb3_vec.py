"""DummyVecRolloutBuffer: one rollout buffer object over buffers of different sizes and types."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.buffers import RolloutBuffer  # noqa: E402

from bad_inputs import SETTINGS, refused, snapshot  # noqa: E402
from jaxbuffers.interop.sb3 import CompressedRolloutBuffer, DummyVecRolloutBuffer, JaxRolloutBuffer  # noqa: E402

OBS, ACT, N = spaces.Box(0, 255, (2, 4, 4), np.uint8), spaces.Discrete(3), 2


def _buffers():
    return [RolloutBuffer(3, OBS, ACT, "cpu", n_envs=N), JaxRolloutBuffer(4, OBS, ACT, "cpu", n_envs=N),
            CompressedRolloutBuffer(5, OBS, ACT, "cpu", n_envs=N, compression_method="zstd-1")]


def _step(rng):
    return (rng.integers(0, 4, (N, *OBS.shape)).astype(np.uint8), rng.integers(0, 3, (N, 1)), rng.normal(size=N).astype(np.float32),
            np.zeros(N, np.float32), th.from_numpy(rng.normal(size=(N, 1)).astype(np.float32)), th.from_numpy(rng.normal(size=N).astype(np.float32)))


@pytest.mark.parametrize("use_threads", [False, True])
def test_delegates_to_every_buffer_and_is_full_when_all_are(use_threads):
    bufs = _buffers()
    vec = DummyVecRolloutBuffer(5, OBS, ACT, "cpu", n_envs=N, use_threads=use_threads, buffers=bufs)
    assert isinstance(vec, RolloutBuffer) and vec.buffers == tuple(bufs) and not vec.full
    rng, fulls = np.random.default_rng(0), []
    for t in range(5):
        step = _step(rng)
        vec.call("add", *step) if t < 3 else [b.add(*step) for b in bufs[1 + (t == 4):]]
        fulls.append(vec.full)
    assert fulls == [False, False, False, False, True]
    assert vec.pos == 3 and [b.pos for b in bufs] == [3, 4, 5]  # the smallest buffer's
    assert vec.size() == vec.call("size") == [3, 4, 5]
    last = th.zeros(N, 1)
    vec.compute_returns_and_advantage(last, np.zeros(N))
    np.testing.assert_allclose(vec.advantages[0], bufs[0].advantages)  # an attribute read from every buffer
    np.random.seed(1)
    batches = [list(g) for g in vec.get(4)]
    assert [len(b) for b in batches] == [2, 2, 3]  # 6, 8 and 10 steps in minibatches of 4
    vec.reset()
    assert not vec.full and [b.pos for b in bufs] == [0, 0, 0]
    vec.close()


def test_errors_name_the_buffer():
    with pytest.raises(TypeError, match=r"buffers\[1\]"):
        DummyVecRolloutBuffer(4, OBS, ACT, n_envs=N, buffers=[_buffers()[0], object()])
    for bad in (1, "True", None):
        with pytest.raises(TypeError, match="use_threads: expected a Python bool, got"):
            DummyVecRolloutBuffer(4, OBS, ACT, use_threads=bad)
    DummyVecRolloutBuffer(4, OBS, ACT, use_threads=np.bool_(False))  # a flag as every static flag is
    with pytest.raises(ValueError, match="gae"):
        DummyVecRolloutBuffer(4, OBS, ACT, gae=0.9)
    bufs = _buffers()
    vec = DummyVecRolloutBuffer(4, OBS, ACT, "cpu", n_envs=N, buffers=bufs, use_threads=True)
    rng = np.random.default_rng(0)
    for _ in range(3):
        vec.add(*_step(rng))
    with pytest.raises(IndexError, match=r"^buffers\[0\] \(RolloutBuffer\.add\): add: the rollout buffer is full"):
        vec.add(*_step(rng))  # SB3's buffer of 3 steps is full: refused before the others add
    assert [b.pos for b in bufs] == [3, 3, 3]
    with pytest.raises(AttributeError, match=r"buffers \[0\]"):
        vec.jax_buffer  # noqa: B018  SB3's buffer has none


def _stored(b):
    """Everything a member holds: SB3's numpy fields, or the device state (and every host slot of a compressed
    buffer), with the cursors."""
    from compressed_bad_input import host_record

    if isinstance(b, JaxRolloutBuffer):
        return (b._state, b.pos, b.full)
    if isinstance(b, CompressedRolloutBuffer):
        return (b._state, b.pos, b.full, host_record(b._state.host))
    return ([getattr(b, f) for f in ("observations", "actions", "rewards", "episode_starts", "values", "log_probs", "returns", "advantages")],
            b.pos, b.full, b.generator_ready)


#: (call, its arguments but the step, the argument named, the exception) of refused calls; ``add`` takes a step.
_REFUSED = {
    "add_to_a_full_member": ("add", {}, "add", IndexError),
    "obs_a_uint8_member_cannot_hold": ("add", {0: np.full((N, *OBS.shape), 300, np.int64)}, "obs", TypeError),
    "reward_of_wrong_size": ("add", {2: np.zeros(7, np.float32)}, "reward", ValueError),
    "value_not_numbers": ("add", {4: None}, "value", TypeError),
    "log_prob_of_wrong_size": ("add", {5: th.zeros(N, 3)}, "log_prob", ValueError),
    "get_before_every_member_is_full": ("get", None, "get", RuntimeError),
    "get_batch_size_0": ("get", 0, "batch_size", ValueError),
    "last_values_of_wrong_size": ("compute_returns_and_advantage", (th.zeros(7), np.zeros(N)), "last_values", ValueError),
}


@settings(SETTINGS, max_examples=40)
@given(case=st.sampled_from(sorted(_REFUSED)), order=st.permutations([0, 1, 2]), steps=st.integers(0, 3), use_threads=st.booleans())
def test_a_call_any_member_refuses_changes_no_member(case, order, steps, use_threads):
    """Members of sizes 3, 4, 5 (SB3's, jaxbuffers', compressed) in any order, ``steps`` steps added: a call that
    one member refuses (a full SB3 buffer, an observation only the uint8 members refuse, a member not yet full) or
    every member refuses is refused naming the first refusing member's index and the argument, every member's
    storage and cursors byte-identical, with and without threads."""
    name, arg, what, exc = _REFUSED[case]
    if name == "add":  # room in every member but for the one case
        steps = 3 if case == "add_to_a_full_member" else min(steps, 2)
    made = _buffers()
    bufs = [made[i] for i in order]
    vec = DummyVecRolloutBuffer(5, OBS, ACT, "cpu", n_envs=N, use_threads=use_threads, buffers=bufs)
    rng = np.random.default_rng(steps)
    for _ in range(steps):
        vec.add(*_step(rng))
    step = list(_step(rng))
    if name == "add":
        args = [arg.get(k, x) for k, x in enumerate(step)]
    else:
        args = list(arg) if isinstance(arg, tuple) else [arg]
    refusing = {  # which members refuse: the error names the first in list order
        "add_to_a_full_member": [type(b) is RolloutBuffer for b in bufs],
        "obs_a_uint8_member_cannot_hold": [type(b) is not RolloutBuffer for b in bufs],
        "get_before_every_member_is_full": [b.buffer_size > steps for b in bufs],
    }.get(case, [True] * 3)
    first = refusing.index(True)
    before = [snapshot(_stored(b)) for b in bufs]
    err = refused(lambda: vec.call(name, *args), what, exc=(exc,))
    assert str(err).startswith(f"buffers[{first}] ({type(bufs[first]).__name__}.{name}): "), str(err)
    assert [snapshot(_stored(b)) for b in bufs] == before
    vec.close()


def test_dict_members_other_buffers_and_nested_facades_are_checked_before_any_call():
    """SB3's ``DictRolloutBuffer`` is checked per key (a Discrete key reshaped as SB3 reshapes it); a buffer of
    another kind by its method's signature; a facade inside a facade by its own members' checks."""
    from stable_baselines3.common.buffers import DictRolloutBuffer

    from jaxbuffers.interop.sb3 import JaxDictRolloutBuffer

    space = spaces.Dict({"a": spaces.Box(0, 1, (3,), np.float32), "b": spaces.Discrete(4)})
    bufs = [DictRolloutBuffer(3, space, ACT, "cpu", n_envs=N), JaxDictRolloutBuffer(3, space, ACT, "cpu", n_envs=N)]
    inner = DummyVecRolloutBuffer(3, space, ACT, "cpu", n_envs=N, buffers=bufs)
    outer = DummyVecRolloutBuffer(3, space, ACT, "cpu", n_envs=N, buffers=[inner], use_threads=True)
    rest = (np.zeros((N, 1)), np.zeros(N), np.zeros(N), th.zeros(N, 1), th.zeros(N))
    assert outer.add({"a": np.zeros((N, 3), np.float32), "b": np.zeros((N, 1), np.int64)}, *rest) == [[None, None]]
    for obs, what in [({"a": np.zeros((N, 3))}, "obs"), ({"a": np.zeros((N, 4)), "b": np.zeros((N, 1))}, "obs['a']"),
                      ({"a": np.zeros((N, 3)), "b": np.zeros((N, 2))}, "obs['b']")]:
        with pytest.raises(ValueError, match=r"^buffers\[0\] \(DummyVecRolloutBuffer.add\): buffers\[0\] \(DictRolloutBuffer.add\): ") as e:
            outer.add(obs, *rest)
        assert what + ":" in str(e.value)
    assert [b.pos for b in bufs] == [1, 1]
    outer.close()

    class Other:
        full = False

        def add(self, x):
            self.x = x

        def reset(self):
            pass

    other = Other()
    vec = DummyVecRolloutBuffer(3, OBS, ACT, "cpu", n_envs=N, buffers=[_buffers()[1], other])
    with pytest.raises(TypeError, match=r"^buffers\[1\] \(Other.add\): too many positional arguments"):
        vec.add(*_step(np.random.default_rng(0)))
    assert vec.buffers[0].pos == 0 and not hasattr(other, "x")


def test_thread_pool_is_shut_down_when_the_facade_goes():
    """``use_threads``: collecting the facade shuts its pool down, and one left open is shut down at interpreter exit
    by a finaliser (run while the modules still exist: `test_thread_pool_left_open_shuts_down_quietly_at_exit`)."""
    import gc

    make = lambda: DummyVecRolloutBuffer(4, OBS, ACT, buffers=[JaxRolloutBuffer(4, OBS, ACT, device="cpu")], use_threads=True)  # noqa: E731
    gone = make()
    pool = gone._executor
    del gone
    gc.collect()
    assert pool._shutdown
    kept = make()
    assert kept._finalizer.alive and kept._finalizer.atexit
    kept.close()
    assert not kept._finalizer.alive and kept._executor is None


@pytest.mark.slow  # a fresh interpreter importing JAX, torch and SB3
def test_thread_pool_left_open_shuts_down_quietly_at_exit():
    """A facade with ``use_threads`` that is never closed: its pool is shut down at interpreter exit without a word
    on stderr (no traceback from a teardown that finds the modules gone); one collected earlier shuts its pool too."""
    import os
    import pathlib
    import subprocess
    import sys

    script = (
        "import gc, numpy as np\n"
        "from gymnasium import spaces\n"
        "from jaxbuffers.interop.sb3 import DummyVecRolloutBuffer, JaxRolloutBuffer\n"
        "obs, act = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)\n"
        "make = lambda: DummyVecRolloutBuffer(4, obs, act, buffers=[JaxRolloutBuffer(4, obs, act, device='cpu')], use_threads=True)\n"
        "gone = make(); pool = gone._executor; del gone; gc.collect()\n"
        "assert pool._shutdown\n"
        "kept = make()\n"
    )
    root = str(pathlib.Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), root])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


def test_add_converts_each_step_once_and_a_buffer_held_twice_stops_when_full(monkeypatch):
    from jaxbuffers.interop.sb3 import rollout

    calls = []
    real = rollout._JaxRolloutImpl._add_rows
    monkeypatch.setattr(rollout._JaxRolloutImpl, "_add_rows", lambda self, *a, **k: calls.append(type(self).__name__) or real(self, *a, **k))
    bufs = _buffers()
    vec = DummyVecRolloutBuffer(5, OBS, ACT, "cpu", n_envs=N, buffers=bufs)
    step = _step(np.random.default_rng(0))
    vec.add(*step)
    assert sorted(calls) == ["CompressedRolloutBuffer", "JaxRolloutBuffer"]  # checked and converted once, then stored
    assert [b.pos for b in bufs] == [1, 1, 1]
    one = JaxRolloutBuffer(1, OBS, ACT, "cpu", n_envs=N)
    twice = DummyVecRolloutBuffer(1, OBS, ACT, "cpu", n_envs=N, buffers=[one, one])
    with pytest.raises(IndexError, match="full"):  # both pass the check; the second store finds it full
        twice.add(*step)
    assert one.pos == 1 and one.full


def test_docs_example_fills_every_buffer_through_the_facade():
    """The facade of docs/api/sb3.md, built as written, is full after ``buffer_size`` adds through it: adds are not
    refused before every buffer is full (the smallest buffer bounds the rollout)."""
    import pathlib
    import re

    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "api" / "sb3.md").read_text()
    code = re.search(r"^ *(vec = DummyVecRolloutBuffer\(.*?\]\))$", page, re.S | re.M).group(1)
    scope = {"DummyVecRolloutBuffer": DummyVecRolloutBuffer, "JaxRolloutBuffer": JaxRolloutBuffer,
             "CompressedRolloutBuffer": CompressedRolloutBuffer, "obs_space": OBS, "act_space": ACT}
    exec(code.replace("\n", " "), scope)
    vec, rng = scope["vec"], np.random.default_rng(0)
    one_env = lambda step: tuple(x[:1] for x in step)  # noqa: E731  the example's buffers have n_envs=1
    for _ in range(vec.buffer_size):
        assert not vec.full
        vec.add(*one_env(_step(rng)))
    assert vec.full and [b.full for b in vec.buffers] == [True] * len(vec.buffers)


def test_members_must_fit_the_facade_and_pos_is_theirs():
    # a member of other n_envs or shapes was accepted until the first add refused it
    for bad, what in [(JaxRolloutBuffer(4, OBS, ACT, "cpu", n_envs=N + 1), "n_envs=3, the facade's is 2"),
                      (JaxRolloutBuffer(4, spaces.Box(0, 255, (2, 4, 5), np.uint8), ACT, "cpu", n_envs=N), r"obs_shape=\(2, 4, 5\)"),
                      (RolloutBuffer(4, OBS, spaces.Box(-1, 1, (2,), np.float32), "cpu", n_envs=N), "action_dim=2, the facade's is 1")]:
        with pytest.raises(ValueError, match=rf"buffers\[1\]: a {type(bad).__name__} with {what}"):
            DummyVecRolloutBuffer(4, OBS, ACT, "cpu", n_envs=N, buffers=[JaxRolloutBuffer(4, OBS, ACT, "cpu", n_envs=N), bad])
    bufs = _buffers()
    vec = DummyVecRolloutBuffer(5, OBS, ACT, "cpu", n_envs=N, buffers=bufs[1:])
    rng = np.random.default_rng(0)
    for t in range(1, 5):
        vec.add(*_step(rng))
        assert vec.pos == t == bufs[1].pos
    vec.reset()
    assert vec.pos == 0 and [b.pos for b in bufs[1:]] == [0, 0]
