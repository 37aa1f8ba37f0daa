"""Bad input to the SB3 adapters and conversions: refused with an error naming the argument before anything is
stored, so the adapter's arrays, `pos` and `full` stay byte-identical and it stays usable, in any order of calls."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

th = pytest.importorskip("torch")
pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer, RolloutBuffer  # noqa: E402

import jaxbuffers as jb  # noqa: E402
from bad_inputs import SETTINGS, bad_static_ints, names, refused, snapshot  # noqa: E402
from jaxbuffers.interop.sb3 import JaxReplayBuffer, JaxRolloutBuffer, replay_from_jax, replay_to_jax, rollout_from_jax, rollout_to_jax  # noqa: E402

N = 2
OBS, ACT = spaces.Box(-5, 5, (3,), np.float32), spaces.Discrete(3)
NOT_NUMBERS = st.sampled_from([None, "x", np.array([None, None], object), np.array(["a", "b"]), {"a": 1}, object()])


def state(buf):
    return lambda: (buf._state, buf.pos, buf.full)


def replay_args(i: int = 0) -> dict:
    o = np.full((N, 3), i, np.float32)
    return {"obs": o, "next_obs": o + 1, "action": np.array([[i % 3], [0]]), "reward": np.ones(N), "done": np.zeros(N), "infos": [{}] * N}


def rollout_args(i: int = 0) -> dict:
    return {"obs": np.full((N, 3), i, np.float32), "action": np.array([[i % 3], [0]]), "reward": np.ones(N), "episode_start": np.zeros(N),
            "value": th.zeros(N, 1), "log_prob": th.zeros(N)}


def replay() -> JaxReplayBuffer:
    buf = JaxReplayBuffer(8, OBS, ACT, device="cpu", n_envs=N)
    for i in range(2):
        buf.add(**replay_args(i))
    return buf


def rollout(full: bool = False) -> JaxRolloutBuffer:
    buf = JaxRolloutBuffer(3, OBS, ACT, device="cpu", n_envs=N, gamma=0.9, gae_lambda=0.9)
    for i in range(3 if full else 1):
        buf.add(**rollout_args(i))
    if full:
        buf.compute_returns_and_advantage(th.zeros(N, 1), np.zeros(N))
    return buf


@SETTINGS
@given(name=st.sampled_from(["obs", "next_obs", "action", "reward", "done"]), bad=NOT_NUMBERS | st.sampled_from([np.zeros(7), np.zeros((N, 4)), np.full(N, 2)]))
def test_replay_add_bad_argument(name, bad):
    buf = replay()
    if name != "done" and isinstance(bad, np.ndarray) and bad.shape == (N,) and bad.dtype.kind == "i":
        return  # 2 is a valid value there
    refused(lambda: buf.add(**{**replay_args(), name: bad}), name, state=state(buf))
    buf.add(**replay_args(5))


@SETTINGS
@given(infos=st.sampled_from([None, [None, None], [{}], [{}] * 3, "x", ({}, 1)]))
def test_replay_add_bad_infos(infos):
    buf = replay()
    refused(lambda: buf.add(**{**replay_args(), "infos": infos}), "infos", state=state(buf))


@SETTINGS
@given(batch_size=bad_static_ints())
def test_replay_sample_bad_batch_size(batch_size):
    buf = replay()
    refused(lambda: buf.sample(batch_size), "batch_size", state=state(buf))


@SETTINGS
@given(which=st.sampled_from(["batch_inds", "env_indices"]), bad=NOT_NUMBERS | st.sampled_from([np.array([0.5]), np.array([-1]), np.array([99]), np.zeros((1, 1), int)]))
def test_replay_samples_at_bad_indices(which, bad):
    buf = replay()
    args = {"batch_inds": np.array([0]), "env_indices": np.array([1]), which: bad}
    refused(lambda: buf.samples_at(**args), which, state=state(buf), exc=(TypeError, ValueError, IndexError))


@SETTINGS
@given(batch_size=bad_static_ints().filter(lambda b: b is not None))
def test_rollout_get_refuses_batch_sizes_that_loop_or_misbehave(batch_size):
    """`get(0)`, `get(-1)`, `get(2.5)`, `get(True)`: refused at the call, before anything is drawn."""
    buf = rollout(full=True)
    refused(lambda: buf.get(batch_size), "batch_size", state=state(buf))
    assert sum(len(s.actions) for s in buf.get(4)) == 3 * N  # still usable


def test_rollout_get_on_a_buffer_that_is_not_full_names_the_steps_filled():
    """SB3 fails there on a bare `assert`: ours names the steps filled and `buffer_size`, before anything is drawn;
    the rest of the rollout added, `get` serves every step."""
    buf = rollout()
    refused(lambda: buf.get(4), ("get: the buffer holds 1 of buffer_size=3 steps per env",), state=state(buf), exc=(RuntimeError,))
    refused(lambda: buf.get(), ("buffer_size=3",), state=state(buf), exc=(RuntimeError,))
    for i in (1, 2):
        buf.add(**rollout_args(i))
    buf.compute_returns_and_advantage(th.zeros(N, 1), np.zeros(N))
    assert sum(len(s.actions) for s in buf.get(4)) == 3 * N


@SETTINGS
@given(name=st.sampled_from(sorted(rollout_args())), bad=NOT_NUMBERS | st.sampled_from([np.zeros(7), np.full(N, 2)]))
def test_rollout_add_bad_argument(name, bad):
    buf = rollout()
    if name != "episode_start" and isinstance(bad, np.ndarray) and bad.shape == (N,):
        return  # numbers of the right size: valid there
    refused(lambda: buf.add(**{**rollout_args(), name: bad}), name, state=state(buf))


@SETTINGS
@given(bad=NOT_NUMBERS | st.sampled_from([np.array([0.5]), np.array([-1]), np.array([99])]))
def test_rollout_get_samples_bad_indices(bad):
    buf = rollout(full=True)
    refused(lambda: buf._get_samples(bad), "batch_inds", state=state(buf), exc=(TypeError, ValueError, IndexError))


@SETTINGS
@given(size=bad_static_ints(), unit=st.sampled_from([7.0, -0.5, float("nan"), "x", None]))
def test_constructors_bad_arguments(size, unit):
    refused(lambda: JaxReplayBuffer(size, OBS, ACT, device="cpu"), "buffer_size")
    refused(lambda: JaxReplayBuffer(8, OBS, ACT, device="cpu", n_envs=size), "n_envs")
    refused(lambda: JaxRolloutBuffer(size, OBS, ACT, device="cpu"), "buffer_size")
    refused(lambda: JaxRolloutBuffer(4, OBS, ACT, device="cpu", gamma=unit), "gamma")
    refused(lambda: JaxRolloutBuffer(4, OBS, ACT, device="cpu", gae_lambda=unit), "gae_lambda")


@SETTINGS
@given(bad=st.sampled_from([None, 3, "x", jb.ReplayBuffer.create({"a": jnp.zeros(1)}, 2)]))
def test_conversions_refuse_what_is_not_a_buffer(bad):
    refused(lambda: replay_to_jax(bad), "buffer")
    refused(lambda: rollout_to_jax(bad), "buffer")
    if not isinstance(bad, jb.ReplayBuffer):
        refused(lambda: replay_from_jax(bad, OBS, ACT), "buffer")
    refused(lambda: rollout_from_jax(bad, OBS, ACT), "buffer")
    assert not isinstance(bad, (ReplayBuffer, RolloutBuffer))


@SETTINGS
@given(ops=st.lists(st.sampled_from(["add", "bad_add", "bad_infos", "bad_sample", "sample"]), min_size=1, max_size=8))
def test_replay_refused_calls_in_any_order_change_nothing(ops):
    buf, ref = replay(), replay()
    for n, op in enumerate(ops):
        if op == "add":
            buf.add(**replay_args(n))
            ref.add(**replay_args(n))
        elif op == "sample":
            buf.sample(2)
        elif op == "bad_add":
            refused(lambda: buf.add(**{**replay_args(), "reward": None}), "reward", state=state(buf))
        elif op == "bad_infos":
            refused(lambda: buf.add(**{**replay_args(), "infos": None}), "infos", state=state(buf))
        else:
            refused(lambda: buf.sample(0), "batch_size", state=state(buf))
        assert (buf.pos, buf.full) == (ref.pos, ref.full)
        np.testing.assert_array_equal(np.asarray(buf.observations), np.asarray(ref.observations))


@SETTINGS
@given(field=st.sampled_from(["dones", "timeouts", "actions", "rewards"]), value=st.sampled_from([2, 0.5, None, "x", -1]))
def test_field_view_writes_cast_nothing_silently(field, value):
    """SB3 writes `dones[pos] = True`; other values a field does not hold (a flag of 2, an int64 action of 0.5) are
    refused naming the field, the buffer unchanged."""
    buf = replay()
    if field == "rewards" and isinstance(value, (int, float)) or field == "actions" and value in (2, -1):
        getattr(buf, field)[0, 0] = value  # numpy's own cast, as SB3's arrays take it
        return
    refused(lambda: getattr(buf, field).__setitem__((0, 0), value), field, state=state(buf))


@pytest.mark.parametrize("obs", [np.full((N, 2, 2), 300, np.int64), np.full((N, 2, 2), -1, np.int16), np.full((N, 2, 2), 0.5)])
def test_integer_observations_are_never_wrapped_or_truncated(obs):
    from jaxbuffers.interop.sb3 import CompressedRolloutBuffer

    image = spaces.Box(0, 255, (2, 2), np.uint8)
    rb = JaxReplayBuffer(8, image, ACT, device="cpu", n_envs=N)
    args = {**replay_args(), "obs": obs.astype(np.uint8), "next_obs": obs}
    refused(lambda: rb.add(**args), "next_obs", state=state(rb), exc=(TypeError,))
    for cls in (JaxRolloutBuffer, CompressedRolloutBuffer):
        buf = cls(3, image, ACT, device="cpu", n_envs=N)
        refused(lambda: buf.add(**{**rollout_args(), "obs": obs}), "obs", state=state(buf), exc=(TypeError,))
    buf.add(**{**rollout_args(), "obs": np.full((N, 2, 2), 7, np.int64)})  # values it holds: stored as they are
    assert buf.observations[0].dtype == np.uint8 and (buf.observations[0] == 7).all()


IMAGE = spaces.Box(0, 255, (4, 4), np.uint8)


def _compressed(kind: str):
    """A compressed adapter (host-compressed image observations) with two steps added, and the reader of everything
    it stores: the device state, the cursors and every host store slot."""
    from compressed_bad_input import host_record, record
    from jaxbuffers.interop.sb3 import CompressedReplayBuffer, CompressedRolloutBuffer

    if kind == "replay":
        buf = CompressedReplayBuffer(8, IMAGE, ACT, device="cpu", n_envs=N)
        args = lambda i: {**replay_args(i), "obs": np.full((N, 4, 4), i, np.uint8), "next_obs": np.full((N, 4, 4), i + 1, np.uint8)}  # noqa: E731
    else:
        buf = CompressedRolloutBuffer(3, IMAGE, ACT, device="cpu", n_envs=N, gamma=0.9, gae_lambda=0.9)
        args = lambda i: {**rollout_args(i), "obs": np.full((N, 4, 4), i, np.uint8)}  # noqa: E731
    for i in range(2 if kind == "replay" else 1):
        buf.add(**args(i))
    if kind == "replay":  # rows staged in a StagingWriter (its staged rows and wrapped buffer), the newest next_obs
        return buf, args, lambda: (record(buf._writer), buf._pending, buf.pos, buf.full)
    return buf, args, lambda: (buf._state, buf.pos, buf.full, host_record(buf._state.host))  # reading it flushes the writer


@settings(SETTINGS, max_examples=8)
@given(data=st.data(), kind=st.sampled_from(["replay", "rollout"]))
def test_compressed_adapters_refuse_each_wrong_argument_and_store_nothing(data, kind):
    """The compressed adapters check as the plain ones do, before any frame reaches the host store: the device
    state, the cursors and every host slot byte-identical, and the next add stored as if nothing happened."""
    buf, args, stored = _compressed(kind)
    good = args(5)
    name = data.draw(st.sampled_from(sorted(k for k in good if k != "infos")), "argument")
    bad = data.draw(NOT_NUMBERS | st.sampled_from([np.zeros(7), np.zeros((N, 5)), np.full((N, 4, 4), 300, np.int64), np.full((N, 4, 4), 0.5)]), name)
    if name not in ("obs", "next_obs") and isinstance(bad, np.ndarray) and bad.dtype.kind in "iuf" and bad.shape[:1] == (N,) and bad.ndim <= 2 \
            and bad.size in (N, N * getattr(good[name], "shape", (N, 1))[-1]):
        return  # numbers of the right size: valid there
    refused(lambda: buf.add(**{**good, name: bad}), name, state=stored, exc=(TypeError, ValueError))
    buf.add(**good)


SB3_ROLLOUT_FIELDS = ("observations", "actions", "rewards", "episode_starts", "values", "log_probs", "advantages", "returns")


@settings(SETTINGS, max_examples=40)
@given(bad=NOT_NUMBERS | st.sampled_from([np.zeros(7), np.zeros((N, 4)), np.zeros((1, N)), np.zeros(N), np.zeros((N, 1)), np.zeros((N, 3)),
                                          th.zeros(7), th.zeros(N), th.zeros(N, 1), th.zeros(1), th.zeros(()), th.zeros(N, 3),
                                          th.zeros(N, requires_grad=True)]))
def test_sb3_rollout_checks_refuse_what_sb3_would_half_store(bad):
    """The checks a `DummyVecRolloutBuffer` makes on SB3's own ``RolloutBuffer`` before any member is called, ``bad``
    as each argument of ``add`` and ``compute_returns_and_advantage`` in turn: a refusal names the argument and
    changes nothing; what they let through, SB3 takes whole."""
    from jaxbuffers._validate import sb3_rollout

    returns_args = {"last_values": th.zeros(N, 1), "dones": np.zeros(N)}
    for name in (*rollout_args(), *returns_args):
        buf = RolloutBuffer(3, OBS, ACT, "cpu", n_envs=N)
        method = "add" if name in rollout_args() else "compute_returns_and_advantage"
        args = {**(rollout_args() if method == "add" else returns_args), name: bad}
        fields = lambda: ([getattr(buf, f) for f in SB3_ROLLOUT_FIELDS], buf.pos)  # noqa: E731
        before = snapshot(fields())
        try:
            sb3_rollout.check(buf, method, **args)
        except (TypeError, ValueError) as e:
            assert names(str(e), name), str(e)
            assert snapshot(fields()) == before
            continue
        getattr(buf, method)(**args)  # not refused: SB3 takes it whole


FLOAT_ACT = spaces.Box(-1, 1, (2,), np.float32)


def _with_float64(value, overflow: float):
    """``value`` (an add argument) as a float64 numpy array whose first entry is ``overflow``."""
    a = np.array(value.numpy() if hasattr(value, "numpy") else value, np.float64)
    a.flat[0] = overflow
    return a


@pytest.mark.parametrize("kind", ["replay", "rollout", "compressed replay", "compressed rollout"])
def test_finite_float64_values_overflowing_float32_are_refused_not_stored_as_inf(kind):
    """SB3 passes float64 rewards (and values, log_probs, observations, actions of float spaces) that are stored as
    float32: a finite value beyond float32's range is refused naming the field, nothing stored; rounding to float32
    is allowed, and inf and NaN given as such are stored as they are."""
    if kind.startswith("compressed"):  # uint8 image observations, Discrete actions: the float fields are the rest
        buf, args, stored = _compressed(kind.split()[1])
        good = args(5)
    elif kind == "replay":
        buf, stored = JaxReplayBuffer(8, OBS, FLOAT_ACT, device="cpu", n_envs=N), None
        good = {**replay_args(), "action": np.zeros((N, 2), np.float32)}
    else:
        buf, stored = JaxRolloutBuffer(3, OBS, FLOAT_ACT, device="cpu", n_envs=N), None
        good = {**rollout_args(), "action": np.zeros((N, 2), np.float32)}
    stored = stored or state(buf)
    floats = [k for k in good if k not in ("infos", "done", "episode_start") and not (kind.startswith("compressed") and k in ("obs", "next_obs", "action"))]
    for name in floats:
        refused(lambda: buf.add(**{**good, name: _with_float64(good[name], 1e300)}), name, state=stored, exc=(ValueError,))
        refused(lambda: buf.add(**{**good, name: _with_float64(good[name], -1e39)}), name, state=stored, exc=(ValueError,))
    reward = np.array([0.1, np.inf, np.nan][:N])
    row = buf.pos
    buf.add(**{**good, "reward": reward})
    np.testing.assert_array_equal(np.asarray(buf.rewards)[row], reward.astype(np.float32))
    if kind == "replay":  # SB3 writes its numpy fields too: the same refusal
        refused(lambda: buf.rewards.__setitem__((0, 0), 1e300), "rewards", state=stored, exc=(ValueError,))


def test_integer_values_overflowing_a_float16_field_are_refused_not_stored_as_inf():
    """An integer observation beyond float16's range (70,000 > 65,504) into a float16 Box is refused naming the
    field, as a float64 one is; integers it holds are stored (rounded as numpy rounds them)."""
    obs16 = spaces.Box(-np.inf, np.inf, (2,), np.float16)
    buf = JaxReplayBuffer(8, obs16, FLOAT_ACT, device="cpu", n_envs=1)
    o = np.array([[70000, 1]], np.int64)
    args = dict(next_obs=np.zeros((1, 2), np.float16), action=np.zeros((1, 2), np.float32), reward=np.zeros(1),
                done=np.zeros(1, bool), infos=[{}])
    refused(lambda: buf.add(obs=o, **args), "obs", state=state(buf), exc=(ValueError,))
    buf.add(obs=np.array([[60000, -3]], np.int64), **args)
    np.testing.assert_array_equal(np.asarray(buf.observations)[0, 0], np.array([60000, -3], np.float16))
