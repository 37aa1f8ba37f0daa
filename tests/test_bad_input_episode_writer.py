"""Bad input to `EpisodeWriter` (construction, add_env, add_policy, add_step, discard, in_progress, pending), in any
order: refused with an error naming the argument; the committed buffer, the episodes in progress and the waiting
halves exactly as they were; the accepted forms of the guide's table commit exactly their episodes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

import jaxbuffers as jb
from bad_inputs import SETTINGS, corrupt, refused, snapshot

M = 3
STEP = {"obs": jnp.zeros((2,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}
BUFFER = jb.EpisodeBuffer.create(STEP, max_episodes=4, max_timesteps=M, meta={"task": jnp.int32(-1)})
ENVS = (0, "b")
BAD_IDS = st.sampled_from([-1, 1.5, 0.0, "0", None, True, np.float32(1), [0], np.zeros(2, np.int32)])
BAD_FLAGS = st.sampled_from([1, 0, "True", None, np.int32(1), np.array([True]), np.float32(1), [True]])
BAD_ENV_IDS = st.sampled_from([[0], {"a": 1}, {0}, np.zeros(2)])


def halves(t: int) -> tuple[dict, dict, np.ndarray]:
    """(env half, policy half, next_obs) of step `t`: values that tell the steps apart."""
    return ({"obs": np.array([t, 0.5], np.float32), "reward": np.float32(t)}, {"action": np.int32(t)},
            np.array([t + 1, 0.5], np.float32))


def writer(steps: int = 2) -> jb.EpisodeWriter:
    """A writer with one committed episode of env 0 (3 steps: auto-truncated) and `steps` more joined for each env,
    plus an env half of env "b" waiting for its policy half."""
    w = jb.EpisodeWriter(BUFFER)
    for env in ENVS:
        for t in range((M if env == 0 else 0) + steps):
            e, p, nxt = halves(t)
            w.add_step(env, {**e, **p}, next_obs=nxt, terminated=False)
    e, _, nxt = halves(steps)
    w.add_env("b", steps, e, next_obs=nxt, terminated=False)
    return w


def state(w: jb.EpisodeWriter):
    """What a refused call must leave as it was: the committed buffer's bytes, each env's episode in progress and
    its waiting halves."""
    return snapshot(w.buffer), [(w.in_progress(e), w.pending(e)) for e in ENVS]


W = writer()


@SETTINGS
@given(buffer=st.sampled_from([None, 1, "buf", jb.ReplayBuffer.create(STEP, 4)]),
       keys=st.sampled_from([5, "action", [1], [["action"]], [], ["action", "action"], ["nope"], ["obs"], ["reward"]]))
@example(buffer=None, keys=[])  # [] was accepted: no step could ever join
@example(buffer=None, keys=5)  # was Python's "'int' object is not iterable"
def test_constructor_bad_arguments(buffer, keys):
    refused(lambda: jb.EpisodeWriter(buffer), "buffer")
    refused(lambda: jb.EpisodeWriter(BUFFER, policy_keys=keys), "policy_keys")


@SETTINGS
@given(env_id=BAD_ENV_IDS, step_id=BAD_IDS)
@example(env_id=[0], step_id=-1)  # an unhashable env id was Python's "unhashable type: 'list'"
def test_bad_ids(env_id, step_id):
    e, p, nxt = halves(2)
    s = lambda: state(W)  # noqa: E731
    for call in (lambda i: W.add_env(i, 2, e, next_obs=nxt, terminated=False), lambda i: W.add_policy(i, 2, p),
                 lambda i: W.add_step(i, {**e, **p}, next_obs=nxt, terminated=False), W.discard, W.in_progress, W.pending):
        refused(lambda: call(env_id), "env_id", state=s)
    kind = (ValueError,) if isinstance(step_id, int) and not isinstance(step_id, bool) else (TypeError,)  # -1: a value
    refused(lambda: W.add_env("b", step_id, e, next_obs=nxt, terminated=False), "step_id", state=s, exc=kind)
    refused(lambda: W.add_policy("b", step_id, p), "step_id", state=s, exc=kind)
    if step_id is not None:  # None: the env's next id
        refused(lambda: W.add_step(7, {**e, **p}, next_obs=nxt, terminated=False, step_id=step_id), "step_id", state=s, exc=kind)
    refused(lambda: W.add_env("b", 2, e, next_obs=nxt, terminated=False), "step_id", state=s)  # given already
    refused(lambda: W.add_policy(0, 0, p), "step_id", state=s)  # joined already


@SETTINGS
@given(which=st.sampled_from(["env", "policy", "next_obs", "step"]), data=st.data())
def test_wrong_fields(which, data):
    e, p, nxt = halves(2)
    s = lambda: state(W)  # noqa: E731
    if which == "env":
        bad, name = data.draw(corrupt(e, "fields"))
        refused(lambda: W.add_env("b", 3, bad, next_obs=nxt, terminated=False), (name, "fields"), state=s)
    elif which == "policy":
        bad, name = data.draw(corrupt(p, "fields"))
        refused(lambda: W.add_policy("b", 2, bad), (name, "fields"), state=s)
    elif which == "step":
        bad, name = data.draw(corrupt({**e, **p}, "step"))
        refused(lambda: W.add_step(0, bad, next_obs=nxt, terminated=False), (name, "step"), state=s)
    else:
        bad = data.draw(st.sampled_from([None, "x", [1.0, 2.0], np.zeros(2), np.zeros(3, np.float32), np.zeros(2, np.int32), {"obs": nxt}]))
        refused(lambda: W.add_env("b", 3, e, next_obs=bad, terminated=False), "next_obs", state=s)


@SETTINGS
@given(flag=BAD_FLAGS, which=st.sampled_from(["terminated", "truncated"]),
       meta=st.sampled_from([[1], "task", {"task": 1.5}, {"zz": 1}, {"task": np.zeros(2, np.int32)}, {"task": 2**40}]))
def test_wrong_flags_and_meta(flag, which, meta):
    e, p, nxt = halves(2)
    s = lambda: state(W)  # noqa: E731
    flags = {"terminated": False, which: flag}
    refused(lambda: W.add_env("b", 3, e, next_obs=nxt, **flags), which, state=s)
    refused(lambda: W.add_step(0, {**e, **p}, next_obs=nxt, **flags), which, state=s)
    refused(lambda: W.add_env("b", 3, e, next_obs=nxt, terminated=False, meta=meta), "meta", state=s)


def test_a_flag_of_another_shape_is_a_value_error_as_in_add_episode():
    """Flags are checked as `EpisodeBuffer.add_episode` checks one episode's: the wrong kind or dtype is a TypeError,
    a bool array of another shape than `()` a ValueError."""
    e, p, nxt = halves(2)
    s = lambda: state(W)  # noqa: E731
    for which in ("terminated", "truncated"):
        flags = {"terminated": False, which: np.array([True])}
        refused(lambda: W.add_env("b", 3, e, next_obs=nxt, **flags), f"{which}: expected shape ()", state=s, exc=(ValueError,))
        refused(lambda: W.add_step(0, {**e, **p}, next_obs=nxt, **flags), which, state=s, exc=(ValueError,))
        for bad in (None, 1, np.float32(1)):
            refused(lambda: W.add_env("b", 3, e, next_obs=nxt, **{**flags, which: bad}), which, state=s, exc=(TypeError,))


@SETTINGS
@given(ops=st.lists(st.sampled_from(["good", "bad_env", "bad_policy", "bad_id", "bad_flag"]), min_size=1, max_size=8))
def test_refusals_in_any_order_change_nothing(ops):
    """Valid steps interleaved with refused calls commit exactly what the valid steps alone commit."""
    w, ref = writer(0), writer(0)
    t = 0
    for op in ops:
        e, p, nxt = halves(t)
        if op == "good":
            for x in (w, ref):
                x.add_step(0, {**e, **p}, next_obs=nxt, terminated=t % 4 == 3)
            t += 1
        elif op == "bad_env":
            refused(lambda: w.add_env(0, t, {**e, "obs": e["obs"].astype(np.float64)}, next_obs=nxt, terminated=False), "fields['obs']")
        elif op == "bad_policy":
            refused(lambda: w.add_policy(0, t, {"action": np.int64(t)}), "fields['action']")
        elif op == "bad_id":
            refused(lambda: w.add_step([0], {**e, **p}, next_obs=nxt, terminated=False), "env_id")
        else:
            refused(lambda: w.add_step(0, {**e, **p}, next_obs=nxt, terminated="yes"), "terminated")
        assert state(w) == state(ref)


@SETTINGS
@given(flag_form=st.sampled_from([True, np.bool_(True), np.array(True), jnp.bool_(True)]),
       array_form=st.sampled_from(["numpy", "jax"]), policy_first=st.booleans())
def test_accepted_forms_commit_the_same_episode(flag_form, array_form, policy_first):
    """The table: flags a Python or numpy bool or a 0-d bool array; fields numpy or JAX arrays of the stored dtypes;
    halves in either order. Each commits exactly the episode of plain numpy halves given together."""
    conv = (lambda x: jax.tree.map(jnp.asarray, x)) if array_form == "jax" else (lambda x: x)
    want, got = jb.EpisodeWriter(BUFFER), jb.EpisodeWriter(BUFFER)
    for t in range(2):
        e, p, nxt = halves(t)
        want.add_step(1, {**e, **p}, next_obs=nxt, terminated=t == 1)
        calls = [lambda: got.add_env(1, t, conv(e), next_obs=conv(nxt), terminated=flag_form if t == 1 else False),
                 lambda: got.add_policy(1, t, conv(p))]
        for call in calls[::-1] if policy_first else calls:
            call()
    assert snapshot(got.buffer) == snapshot(want.buffer)
    assert int(got.buffer.num_episodes()) == 1


@SETTINGS
@given(env=st.sampled_from(["b", 0, "new"]), past=st.booleans(), by=st.integers(1, 50))
@example(env="new", past=False, by=40)  # an env numbering its policy halves by a global step: they waited forever
def test_policy_halves_of_impossible_steps_are_refused(env, past, by):
    """A policy half of a step already joined or given, or more than `policy_lead` (default `max_timesteps`) steps
    from the step whose env half comes next: `ValueError` naming `step_id`, the env, the range taken and the id
    given; nothing kept (a new env leaves no trace)."""
    lo, nxt_env = {"b": (2, 3), 0: (M + 2, M + 2), "new": (0, 0)}[env]
    hi = nxt_env + M - 1
    sid = lo - by if past else hi + by
    if sid < 0:
        return
    _, p, _ = halves(0)
    err = refused(lambda: W.add_policy(env, sid, p), "step_id", state=lambda: state(W))
    assert f"env {env!r} takes policy halves of the steps in [{lo}, {hi}] not given yet" in str(err)
    assert str(err).endswith(f"got {sid}") if not past else f"step {sid} of env {env!r} was already given" in str(err)
    assert W.pending("new") == ([], [])


def test_policy_halves_ahead_of_their_env_halves_within_policy_lead_join():
    """Policy before env, up to `policy_lead - 1` steps after the env half expected next, in any order: accepted,
    waiting, and joined as their env halves come; `policy_lead` is the constructor's."""
    w = writer()  # env "b": steps 0, 1 joined, the env half of step 2 waiting: policy halves of [2, 5] taken
    for sid in (5, 3, 4):
        w.add_policy("b", sid, halves(sid)[1])
    assert w.pending("b") == ([2], [3, 4, 5])
    w.add_policy("b", 2, halves(2)[1])
    for sid in (3, 4, 5):
        e, _, nxt = halves(sid)
        w.add_env("b", sid, e, next_obs=nxt, terminated=False)
    assert w.pending("b") == ([], [])
    assert w.in_progress("b") == 0 and int(w.buffer.num_episodes()) == 3  # "b": steps 0-2 and 3-5, cut at M
    wide = jb.EpisodeWriter(BUFFER, policy_lead=100)
    wide.add_policy(9, 99, halves(0)[1])
    assert wide.pending(9) == ([], [99])
    for bad in (0, -1, 2.0, True, "3", [4]):
        refused(lambda: jb.EpisodeWriter(BUFFER, policy_lead=bad), "policy_lead")
