"""Tests of jaxbuffers.episode: EpisodeBuffer.

A plain-Python reference model (`Ref`) keeps every episode ever added with the slot it went to; every sampled
episode, window, step and transition is located in it (from its slot and step) and recomputed there.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxbuffers.episode import BufferFullError, EpisodeBuffer

OBS = 2
EXAMPLE = {"obs": jnp.zeros((OBS,), jnp.float32), "action": jnp.int32(0), "reward": jnp.float32(0)}
META = {"task_id": jnp.int32(-1), "goal": jnp.zeros((2,), jnp.float32)}


class Ref:
    """Every episode ever written, in order, with its slot; which are held now."""

    def __init__(self, e: int, m: int, circular: bool):
        self.e, self.m, self.circular = e, m, circular
        self.episodes: list[dict] = []

    def add(self, steps, length, term, trunc, final, meta) -> bool:
        """One episode (numpy leaves [length, ...]); False when a fixed buffer refuses it."""
        if not self.circular and len(self.episodes) >= self.e:
            return False
        self.episodes.append(dict(slot=len(self.episodes) % self.e, steps=steps, length=length, term=term,
                                  trunc=trunc and not term, final=final, meta=meta))
        return True

    def held(self) -> list[dict]:
        return self.episodes[-self.e:] if self.circular else self.episodes[: self.e]

    def at(self, slot: int) -> dict:
        (ep,) = [h for h in self.held() if h["slot"] == int(slot)]
        return ep

    def transition(self, ep, t, n, gamma):
        g, k = 0.0, 0
        for i in range(n):
            g += gamma**i * float(ep["steps"]["reward"][t + i])
            k = i + 1
            if t + i == ep["length"] - 1:
                break
        discount = 0.0 if (ep["term"] and t + k == ep["length"]) else gamma**k
        nxt = ep["final"] if t + k == ep["length"] else ep["steps"]["obs"][t + k]
        return g, discount, k, nxt


def make_episode(rng, length, counter):
    """Distinct values per step so that every read can be located."""
    base = counter[0]
    counter[0] += length + 1
    steps = {
        "obs": (base + np.arange(length, dtype=np.float32)[:, None] + np.array([0.0, 0.5], np.float32)),
        "action": (base + np.arange(length)).astype(np.int32),
        "reward": rng.normal(size=length).astype(np.float32),
    }
    final = np.array([base + length, base + length + 0.5], np.float32)
    return steps, final


def pad(steps, t):
    return {k: np.concatenate([v, np.zeros((t - len(v), *v.shape[1:]), v.dtype)]) for k, v in steps.items()}


def assert_empty_rows(s):
    """Every row of sample `s` is an empty row (nothing passed): indices -1, every other field zero / False."""
    np.testing.assert_array_equal(np.asarray(s.indices), -1)
    for path, x in jax.tree_util.tree_leaves_with_path(s._replace(indices=None)):
        assert not np.any(np.asarray(x)), f"{jax.tree_util.keystr(path)} of an empty row is not zero: {x}"


def check_episode(ref, s, b, m):
    ep = ref.at(s.indices[b])
    n = ep["length"]
    assert int(s.lengths[b]) == n
    np.testing.assert_array_equal(np.asarray(s.mask[b]), np.arange(m) < n)
    for k in ("obs", "action", "reward"):
        np.testing.assert_array_equal(np.asarray(s.item[k][b][:n]), ep["steps"][k])
        assert not np.any(np.asarray(s.item[k][b][n:]))
    assert bool(s.terminated[b]) == ep["term"] and bool(s.truncated[b]) == ep["trunc"]
    np.testing.assert_array_equal(np.asarray(s.final_obs[b]), ep["final"])
    assert int(s.meta["task_id"][b]) == ep["meta"]["task_id"]


E, M = 3, 4  # one shape for every example: each program compiles once per run


@jax.jit
def _jit_add(buf, steps, lengths, terminated, truncated, final_obs, task_id):
    return buf.add_episodes(steps, lengths, terminated=terminated, truncated=truncated, final_obs=final_obs,
                            meta={"task_id": task_id})


def _sample(buf, key, where, kind, n):
    """One sampler (or can_sample) of the model test, by name; `n` is its length argument."""
    if kind == "episodes":
        return buf.sample_episodes(key, 8, where=where)
    if kind == "can":
        return buf.can_sample(8, where=where)
    if kind == "can_sequences":
        return buf.can_sample_sequences(8, n, where=where)
    if kind == "transitions":
        return buf.sample_transitions(key, 8, n_step=n, gamma=0.9, where=where)
    if kind == "timesteps":
        return buf.sample_timesteps(key, 8, where=where)
    return buf.sample_sequences(key, 8, n, where=where)


_jit_sample = jax.jit(_sample, static_argnames=("kind", "n"))


def run_model(data, use_jit: bool):
    e, m = E, M
    circular = data.draw(st.booleans(), label="circular")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=e, max_timesteps=m, meta=META, circular=circular)
    ref, counter = Ref(e, m, circular), [0]
    for op in range(data.draw(st.integers(1, 12), label="ops")):
        kind = data.draw(st.sampled_from(["add", "add", "add_batch", "sample"]), label="kind")
        if kind in ("add", "add_batch"):
            nb = 1 if kind == "add" else data.draw(st.integers(1, 3), label="batch")
            lens = [data.draw(st.integers(1, m), label="length") for _ in range(nb)]
            t = data.draw(st.integers(max(lens), m), label="padded") if nb == 1 else m
            eps = [make_episode(rng, n, counter) for n in lens]
            term = [bool(rng.random() < 0.5) for _ in lens]
            trunc = [bool(rng.random() < 0.5) for _ in lens]
            task = [int(rng.integers(0, 3)) for _ in lens]
            stacked = {k: np.stack([pad(s, t)[k] for s, _ in eps]) for k in EXAMPLE}
            finals = np.stack([f for _, f in eps])
            fits = circular or len(ref.episodes) + nb <= e
            args = dict(terminated=np.array(term), truncated=np.array(trunc), final_obs=finals,
                        meta={"task_id": np.array(task, np.int32)})
            if use_jit:
                new = _jit_add(buf, stacked, np.array(lens, np.int32), args["terminated"], args["truncated"], finals, args["meta"]["task_id"])
                assert bool(new.overflowed) == (not fits or bool(buf.overflowed))
                if not fits:
                    np.testing.assert_array_equal(np.asarray(new.lengths), np.asarray(buf.lengths))
            elif not fits:
                with pytest.raises(BufferFullError, match="max_episodes"):
                    buf.add_episodes(stacked, np.array(lens, np.int32), **args)
                new = buf
            else:
                new = buf.add_episodes(stacked, np.array(lens, np.int32), **args)
            buf = new
            if fits:
                for (s, f), n, te, tr, tk in zip(eps, lens, term, trunc, task):
                    assert ref.add(s, n, te, tr, f, {"task_id": tk})
        # whole state against the model
        held = ref.held()
        assert int(buf.num_episodes()) == len(held)
        assert int(buf.size()) == sum(h["length"] for h in held)
        assert buf.num_added() == len(ref.episodes) and len(held) <= e
        everything = buf.get_all()
        for i, h in enumerate(held):  # oldest first
            assert int(everything.indices[i]) == h["slot"]
            check_episode(ref, everything, i, m)
        assert not np.any(np.asarray(everything.mask[len(held):]))
        # samplers with a filter
        task = data.draw(st.sampled_from([None, 0, 1, 2]), label="filter")
        if use_jit:  # a mask (a traced argument)
            where = np.ones(e, bool) if task is None else np.asarray(buf.meta["task_id"]) == task
            sample = lambda kind, n=0: _jit_sample(buf, key, where, kind, n)  # noqa: E731
        else:  # None or a function of the meta fields
            where = None if task is None else (lambda meta, task=task: meta["task_id"] == task)
            sample = lambda kind, n=0: _sample(buf, key, where, kind, n)  # noqa: E731
        passing = [h for h in held if task is None or h["meta"]["task_id"] == task]
        key = jax.random.key(op)
        assert bool(sample("can")) == bool(passing)
        if not passing:
            for kind in ("episodes", "transitions", "timesteps", "sequences"):
                assert_empty_rows(sample(kind, 1))
            continue
        s = sample("episodes")
        for b in range(8):
            assert ref.at(s.indices[b]) in passing
            check_episode(ref, s, b, m)
        n_step = data.draw(st.integers(1, m), label="n_step")
        tr = sample("transitions", n_step)
        for b in range(8):
            ep, t = ref.at(tr.indices[b]), int(tr.steps[b])
            assert ep in passing and 0 <= t < ep["length"]
            g, d, k, nxt = ref.transition(ep, t, n_step, 0.9)
            assert int(tr.num_steps[b]) == k
            np.testing.assert_allclose(float(tr.n_step_return[b]), g, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(float(tr.discount[b]), d, rtol=1e-6)
            np.testing.assert_array_equal(np.asarray(tr.next_obs[b]), nxt)
            np.testing.assert_array_equal(np.asarray(tr.obs[b]), ep["steps"]["obs"][t])
            np.testing.assert_array_equal(np.asarray(tr.window["action"][b][:k]), ep["steps"]["action"][t:t + k])
            assert not np.any(np.asarray(tr.window["action"][b][k:]))
            np.testing.assert_array_equal(np.asarray(tr.window_mask[b]), np.arange(n_step) < k)
        ts = sample("timesteps")
        for b in range(8):
            ep, t = ref.at(ts.indices[b]), int(ts.steps[b])
            assert ep in passing and 0 <= t < ep["length"]
            np.testing.assert_array_equal(np.asarray(ts.item["obs"][b]), ep["steps"]["obs"][t])
            last = t == ep["length"] - 1
            assert bool(ts.terminated[b]) == (last and ep["term"]) and bool(ts.truncated[b]) == (last and ep["trunc"])
            nxt = ep["final"] if last else ep["steps"]["obs"][t + 1]
            np.testing.assert_array_equal(np.asarray(ts.next_obs[b]), nxt)
        L = data.draw(st.integers(1, m), label="sequence_length")
        ok = any(h["length"] >= L for h in passing)
        assert bool(sample("can_sequences", L)) == ok
        if not ok:
            assert_empty_rows(sample("sequences", L))
        else:
            sq = sample("sequences", L)
            for b in range(8):
                ep, s0 = ref.at(sq.indices[b]), int(sq.starts[b])
                assert ep in passing and s0 + L <= ep["length"]
                np.testing.assert_array_equal(np.asarray(sq.item["action"][b]), ep["steps"]["action"][s0:s0 + L])
                end = s0 + L == ep["length"]
                nxt = ep["final"] if end else ep["steps"]["obs"][s0 + L]
                np.testing.assert_array_equal(np.asarray(sq.next_obs[b]), nxt)
                assert bool(sq.terminated[b, -1]) == (end and ep["term"]) and not np.any(np.asarray(sq.terminated[b, :-1]))


@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_model_based_jit(data):
    run_model(data, True)


@pytest.mark.slow  # the jitted twin runs in CI
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_model_based_eager(data):
    run_model(data, False)


def filled(e=6, m=5, lengths=(1, 2, 3, 4, 5, 3), tasks=(0, 1, 1, 2, 1, 0), circular=True):
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=e, max_timesteps=m, meta=META, circular=circular)
    rng, counter = np.random.default_rng(0), [0]
    for n, task in zip(lengths, tasks):
        s, f = make_episode(rng, n, counter)
        buf = buf.add_episode(s, n, terminated=True, final_obs=f, meta={"task_id": task})
    return buf


def test_split_long_episodes():
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=5, max_timesteps=3, meta=META)
    steps, final = make_episode(np.random.default_rng(0), 7, [0])
    with pytest.raises(ValueError, match="episode: time axis of 7 steps is longer than max_timesteps=3"):
        buf.add_episode(steps, 7, terminated=True, final_obs=final)
    out = buf.add_episode(steps, 7, terminated=True, final_obs=final, meta={"task_id": 4}, split_long=True)
    np.testing.assert_array_equal(np.asarray(out.lengths), [3, 3, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(out.terminated), [False, False, True, False, False])
    np.testing.assert_array_equal(np.asarray(out.truncated), [True, True, False, False, False])
    np.testing.assert_array_equal(np.asarray(out.final_obs)[:3], [steps["obs"][3], steps["obs"][6], final])
    np.testing.assert_array_equal(np.asarray(out.meta["task_id"]), [4, 4, 4, -1, -1])
    np.testing.assert_array_equal(np.asarray(out.storage["action"][:3]).reshape(-1)[:7], steps["action"])
    # a length shorter than the time axis: only the parts it reaches are written
    out = buf.add_episode(steps, 4, terminated=False, truncated=True, final_obs=final, split_long=True)
    np.testing.assert_array_equal(np.asarray(out.lengths), [3, 1, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(out.final_obs[1]), final)


def test_update_relabels_in_place():
    buf = filled()
    new_r = np.full((2, 5), 3.0, np.float32)
    out = buf.update(np.array([1, 4], np.int32), {"reward": new_r, "task_id": np.array([7, 8], np.int32)})
    np.testing.assert_array_equal(np.asarray(out.storage["reward"])[[1, 4]], new_r)
    np.testing.assert_array_equal(np.asarray(out.meta["task_id"]), [0, 7, 1, 2, 8, 0])
    np.testing.assert_array_equal(np.asarray(out.storage["reward"][0]), np.asarray(buf.storage["reward"][0]))
    out = buf.update(np.array([2, 99], np.int32), {"reward": np.array([5.0, 6.0], np.float32)}, steps=np.array([1, 0], np.int32))
    assert float(out.storage["reward"][2, 1]) == 5.0
    np.testing.assert_array_equal(np.asarray(out.storage["reward"])[[0, 1, 3, 4, 5]], np.asarray(buf.storage["reward"])[[0, 1, 3, 4, 5]])
    with pytest.raises(TypeError, match=r"fields: unknown names \['rewards'\]"):
        buf.update(np.array([1]), {"rewards": new_r[:1]})
    with pytest.raises(TypeError, match=r"fields\['reward'\]: expected dtype float32, got float64"):
        buf.update(np.array([1]), {"reward": new_r[:1].astype(np.float64)})
    with pytest.raises(ValueError, match=r"fields\['reward'\]"):
        buf.update(np.array([1]), {"reward": new_r[:1, :3]})
    with pytest.raises(TypeError, match="meta fields .* per episode"):
        buf.update(np.array([1]), {"task_id": np.array([1], np.int32)}, steps=np.array([0]))
    # inside jit with donation
    f = jax.jit(lambda b: b.update(jnp.array([0]), {"reward": jnp.zeros((1, 5))}), donate_argnums=0)
    out = f(filled())
    assert float(jnp.sum(out.storage["reward"][0])) == 0.0


@pytest.mark.parametrize("sampler", ["episodes", "sequences", "timesteps", "transitions", "transitions_at", "get_all"])
def test_update_with_generations_skips_rows_whose_episode_was_overwritten_after_the_sample(sampler):
    """A sample carries the generation (episode number) of each slot it drew; `update(..., generations=)` writes a
    row only while its slot still holds that episode, as `PrioritisedReplayBuffer.set_priorities` does: rows of an
    episode a later `add_episode` overwrote are skipped, the others written. Without `generations`, every row is
    written (the earlier form)."""
    buf = filled(e=3, m=5, lengths=(2, 3, 4), tasks=(0, 1, 2))
    key = jax.random.key(0)
    s = {"episodes": lambda: buf.sample_episodes(key, 8), "sequences": lambda: buf.sample_sequences(key, 8, 2),
         "timesteps": lambda: buf.sample_timesteps(key, 8), "transitions": lambda: buf.sample_transitions(key, 8, gamma=0.9),
         "transitions_at": lambda: buf.transitions_at(np.array([0, 1, 2, 0]), np.array([0, 1, 0, 1]), gamma=0.9),
         "get_all": buf.get_all}[sampler]()
    idx = np.asarray(s.indices)
    steps_, final = make_episode(np.random.default_rng(1), 2, [100])
    newer = buf.add_episode(steps_, 2, terminated=True, final_obs=final, meta={"task_id": 9})  # overwrites slot 0
    overwritten = idx == 0
    assert overwritten.any() and (~overwritten).any()
    b = idx.shape[0]
    out = newer.update(s.indices, {"task_id": np.full(b, 42, np.int32)}, generations=s.generations)
    got = np.asarray(out.meta["task_id"])
    assert got[0] == 9  # the newer episode is untouched
    np.testing.assert_array_equal(got[np.unique(idx[~overwritten])], 42)
    out = newer.update(s.indices, {"reward": np.full((b, 5), -100.0, np.float32)}, generations=s.generations)
    np.testing.assert_array_equal(np.asarray(out.storage["reward"][0]), np.asarray(newer.storage["reward"][0]))
    if sampler in ("timesteps", "transitions", "transitions_at"):  # one step each
        out = newer.update(s.indices, {"reward": np.full(b, -100.0, np.float32)}, steps=s.steps, generations=s.generations)
        np.testing.assert_array_equal(np.asarray(out.storage["reward"][0]), np.asarray(newer.storage["reward"][0]))
        assert (np.asarray(out.storage["reward"])[idx[~overwritten], np.asarray(s.steps)[~overwritten]] == -100).all()
    stale = newer.update(s.indices, {"task_id": np.full(b, 42, np.int32)})  # the earlier form: every row written
    assert int(stale.meta["task_id"][0]) == 42
    jitted = jax.jit(lambda bf, i, g: bf.update(i, {"task_id": jnp.full(b, 42, jnp.int32)}, generations=g))
    np.testing.assert_array_equal(np.asarray(jitted(newer, s.indices, s.generations).meta["task_id"]), got)


def test_errors_name_the_argument_and_leave_the_buffer():
    buf = filled(circular=False)
    steps, final = make_episode(np.random.default_rng(0), 3, [0])
    with pytest.raises(BufferFullError, match="^add_episode: the fixed buffer .* holds 6 of max_episodes=6"):
        buf.add_episode(steps, 3, terminated=True, final_obs=final)
    batch = jax.tree.map(lambda x: np.asarray(x)[None], (steps, final))
    with pytest.raises(BufferFullError, match="^add_episodes: the fixed buffer .* holds 6 of max_episodes=6"):
        buf.add_episodes(batch[0], np.array([3]), terminated=np.array([True]), final_obs=batch[1])
    fresh = EpisodeBuffer.create(EXAMPLE, max_episodes=2, max_timesteps=4, meta=META)
    with pytest.raises(TypeError, match=r"episode\['reward'\]: expected dtype float32, got float64"):
        fresh.add_episode({**steps, "reward": steps["reward"].astype(np.float64)}, 3, terminated=True, final_obs=final)
    with pytest.raises(ValueError, match=r"length: expected values in \[1, 3\]"):
        fresh.add_episode(steps, 4, terminated=True, final_obs=final)
    with pytest.raises(ValueError, match=r"length: expected values in \[1, 3\]"):
        fresh.add_episode(steps, 0, terminated=True, final_obs=final)
    with pytest.raises(TypeError, match="terminated: expected dtype bool"):
        fresh.add_episode(steps, 3, terminated=np.int32(1), final_obs=final)
    for bad in (1, None):  # the message says a Python bool is taken
        with pytest.raises(TypeError, match=r"terminated: expected a bool or a bool array of shape \(\), got"):
            fresh.add_episode(steps, 3, terminated=bad, final_obs=final)
    with pytest.raises(TypeError, match="final_obs: required"):
        fresh.add_episode(steps, 3, terminated=True, final_obs=None)
    with pytest.raises(TypeError, match="final_obs: expected the observation only"):
        fresh.add_episode(steps, 3, terminated=True, final_obs=steps)
    with pytest.raises(ValueError, match=r"final_obs: expected shape"):
        fresh.add_episode(steps, 3, terminated=True, final_obs=steps["obs"])
    with pytest.raises(TypeError, match=r"meta: unknown fields \['task'\]"):
        fresh.add_episode(steps, 3, terminated=True, final_obs=final, meta={"task": 1})
    with pytest.raises(TypeError, match=r"meta\['task_id'\]: expected dtype int32, got int64"):
        fresh.add_episode(steps, 3, terminated=True, final_obs=final, meta={"task_id": np.int64(1)})
    with pytest.raises(TypeError, match=r"meta\['task_id'\]: expected a value of dtype int32, got float"):
        fresh.add_episode(steps, 3, terminated=True, final_obs=final, meta={"task_id": 1.5})
    with pytest.raises(ValueError, match=r"meta\['goal'\]: expected shape"):
        fresh.add_episode(steps, 3, terminated=True, final_obs=final, meta={"goal": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="sequence_length: expected at most max_timesteps=4"):
        fresh.sample_sequences(jax.random.key(0), 2, 5)
    with pytest.raises(ValueError, match="n_step: expected at most 4"):
        fresh.sample_transitions(jax.random.key(0), 2, n_step=5, gamma=0.9)
    with pytest.raises(TypeError, match="gamma: required"):
        fresh.sample_transitions(jax.random.key(0), 2, n_step=1, gamma=None)
    with pytest.raises(ValueError, match="gamma"):
        fresh.sample_transitions(jax.random.key(0), 2, n_step=1, gamma=1.5)
    with pytest.raises(TypeError, match=r"where\(meta\): expected a bool array of shape \(2,\)"):
        fresh.sample_episodes(jax.random.key(0), 2, where=lambda meta: meta["task_id"])
    with pytest.raises(TypeError, match=r"where: expected a bool array of shape \(2,\)"):
        fresh.sample_episodes(jax.random.key(0), 2, where=np.ones(3, bool))
    with pytest.raises(ValueError, match="max_episodes \\* max_timesteps"):
        EpisodeBuffer.create(EXAMPLE, max_episodes=2**16, max_timesteps=2**15 + 1)
    with pytest.raises(TypeError, match="max_episodes and max_timesteps are keyword-only"):
        EpisodeBuffer.create(EXAMPLE, 2, 4)
    with pytest.raises(TypeError, match="meta"):
        EpisodeBuffer.create(EXAMPLE, max_episodes=2, max_timesteps=4, meta={"task_id": 1})
    # every refused call above left the buffer as it was
    assert int(fresh.num_episodes()) == 0 and int(buf.num_episodes()) == 6


def test_fixed_buffer_inside_jit_flags_overflow_and_writes_nothing():
    buf = filled(circular=False)
    steps, final = make_episode(np.random.default_rng(0), 3, [0])
    add = jax.jit(lambda b: b.add_episode(steps, 3, terminated=True, final_obs=final))
    out = add(buf)
    assert bool(out.overflowed) and not bool(buf.overflowed)
    for a, b in zip(jax.tree.leaves(out.replace(overflowed=buf.overflowed)), jax.tree.leaves(buf)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_traced_length_outside_1_to_t_is_clipped_as_documented():
    """Under jit a length <= 0 returns the buffer unchanged (no slot, no count), a length > T stores the episode as
    one of length T, bit for bit; a batch's other episodes take consecutive slots as if it were not given."""
    buf = filled(e=8, lengths=(2, 3), tasks=(0, 1))
    steps, final = make_episode(np.random.default_rng(1), 4, [100])
    add = jax.jit(lambda b, n: b.add_episode(steps, n, terminated=True, final_obs=final))
    same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))  # noqa: E731
    for n in (-5, 0):
        assert same(add(buf, jnp.int32(n)), buf)
    whole = buf.add_episode(steps, 4, terminated=True, final_obs=final)
    assert same(add(buf, jnp.int32(9)), whole) and not same(add(buf, jnp.int32(3)), whole)
    two = jax.tree.map(lambda x: np.stack([x, x]), steps)
    adds = jax.jit(lambda b, n: b.add_episodes(two, n, terminated=np.ones(2, bool), final_obs=np.stack([final, final])))
    assert same(adds(buf, jnp.array([-1, 9], jnp.int32)), whole)
    doc = " ".join(EpisodeBuffer.add_episode.__doc__.split())
    assert "a length <= 0 adds nothing" in doc and "a length > T stores the episode as one of length `T`" in doc


def test_compiles_once_per_shape(compile_counter):
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=4, max_timesteps=5, meta=META)
    rng = np.random.default_rng(0)
    where = np.ones(4, bool)
    steps, final = make_episode(rng, 5, [0])
    buf = buf.add_episode(steps, 3, terminated=True, final_obs=final)  # one program per set of meta fields given
    buf = buf.add_episode(steps, 3, terminated=True, final_obs=final, meta={"task_id": 5})
    buf.sample_episodes(jax.random.key(0), 4, where=where)
    buf.sample_transitions(jax.random.key(0), 4, n_step=2, gamma=0.9)
    with compile_counter() as n:
        for i in range(3):
            buf = buf.add_episode(steps, 2 + i, terminated=bool(i % 2), final_obs=final, meta={"task_id": i})
            buf = buf.add_episode(steps, 1 + i, terminated=True, truncated=np.bool_(i == 1), final_obs=final)
            buf.sample_episodes(jax.random.key(i), 4, where=where)
            buf.sample_transitions(jax.random.key(i), 4, n_step=2, gamma=0.5 + 0.1 * i)
    assert n() == 0


def test_donated_add_and_update_write_in_place():
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=64, max_timesteps=256, meta=META)
    steps, final = make_episode(np.random.default_rng(0), 100, [0])
    add = jax.jit(lambda b, s, n: b.add_episode(s, n, terminated=True, final_obs=final, meta={"task_id": 1}), donate_argnums=0)
    update = jax.jit(lambda b: b.update(jnp.array([0]), {"reward": jnp.zeros((1, 256))}), donate_argnums=0)
    buf = add(buf, steps, 100)
    ptr = buf.storage["obs"].unsafe_buffer_pointer()
    for n in (50, 100, 7):
        old = buf
        buf = add(buf, steps, n)
        assert old.storage["obs"].is_deleted() and buf.storage["obs"].unsafe_buffer_pointer() == ptr
    buf = update(buf)
    assert buf.storage["obs"].unsafe_buffer_pointer() == ptr
    np.testing.assert_array_equal(np.asarray(buf.lengths[:4]), [100, 50, 100, 7])


def test_vmap_over_stacked_buffers_and_scan():
    buf = EpisodeBuffer.create(EXAMPLE, max_episodes=3, max_timesteps=4)
    stacked = jax.tree.map(lambda x: jnp.stack([x, x]), buf)
    steps = {"obs": jnp.ones((2, 4, OBS)), "action": jnp.ones((2, 4), jnp.int32), "reward": jnp.ones((2, 4))}

    def add(b, s, n):
        return b.add_episode(s, n, terminated=jnp.bool_(True), final_obs=jnp.zeros(OBS))

    out = jax.vmap(add)(stacked, steps, jnp.array([2, 3]))
    np.testing.assert_array_equal(np.asarray(out.lengths[:, 0]), [2, 3])

    def body(b, n):
        return add(b, jax.tree.map(lambda x: x[0], steps), n), None

    out, _ = jax.lax.scan(body, buf, jnp.array([1, 2, 3, 4]))
    np.testing.assert_array_equal(np.asarray(out.lengths), [4, 2, 3])  # the fourth replaced the first
    assert out.num_added() == 4
