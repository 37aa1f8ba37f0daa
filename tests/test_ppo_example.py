"""The flagship example examples/ppo_gymnax.py: a short smoke run in CI, the full run marked slow."""

import importlib.util
import pathlib
import sys

import jax
import numpy as np
import pytest

pytest.importorskip("gymnax")
pytest.importorskip("optax")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "ppo_gymnax.py"


@pytest.fixture(scope="module")
def ppo():
    spec = importlib.util.spec_from_file_location("ppo_gymnax", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ppo_gymnax"] = module  # dataclasses resolve string annotations through it
    spec.loader.exec_module(module)
    return module


def test_smoke_two_seeds_with_time_limit(ppo):
    """A few updates for 2 vmapped seeds: finite losses, a full buffer with advantages, and time-limit
    ends stored as truncations that bootstrap from V(final observation)."""
    # A time limit of 8 steps: an untrained CartPole policy needs more than 8 steps to drop the
    # pole, so every episode ends by truncation.
    config = ppo.PPOConfig(
        num_envs=4, num_steps=32, total_steps=2 * 4 * 32, chunk_updates=2, num_seeds=2, max_episode_steps=8
    )
    assert config.num_updates == 2 and config.num_chunks == 1
    trainer = ppo.make_train(config)
    state = jax.jit(trainer.init)(jax.random.split(jax.random.key(0), 2))
    state, metrics = jax.jit(trainer.run_chunk)(state)
    for name in ("loss", "policy_loss", "value_loss", "entropy"):
        assert metrics[name].shape == (2, 2)
        assert np.isfinite(np.asarray(metrics[name])).all(), name
    buf = jax.tree.map(np.asarray, state.buffer)
    assert buf.reward.shape == (2, 32, 4)
    assert jax.vmap(lambda b: b.is_full())(state.buffer).all()  # one member per seed: called under vmap
    assert not buf.overflowed.any() and buf.has_advantages.all()
    assert np.isfinite(buf.advantages).all()
    np.testing.assert_array_equal(buf.reward, 1.0)
    # episodes of 8 steps, all truncated: rows 7, 15, 23, 31 of the second rollout (starts at 32)
    assert not buf.terminated.any()
    np.testing.assert_array_equal(buf.truncated, (np.arange(32) % 8 == 7)[None, :, None].repeat(4, 2).repeat(2, 0))
    # 4 envs x 4 episodes per rollout of 32 steps, counted cumulatively
    np.testing.assert_array_equal(np.asarray(metrics["episodes"]), [[16, 32], [16, 32]])
    np.testing.assert_allclose(np.asarray(metrics["return_mean"]), 8.0)
    # final_value is the critic at the real last observation: not 0 (a terminal) and not the value of
    # the reset observation that follows
    fv, nxt = buf.final_value[:, 7:31:8], buf.value[:, 8::8]
    assert (fv != 0).all() and (fv != nxt).all()
    # GAE bootstrapped there: the advantage at a truncation is r + gamma V(final) - V(obs_t)
    t = np.arange(7, 32, 8)
    np.testing.assert_allclose(buf.advantages[:, t], 1.0 + 0.99 * buf.final_value[:, t] - buf.value[:, t], rtol=1e-5, atol=1e-5)
    # the two seeds differ (vmap over keys really gives independent runs)
    assert not np.array_equal(buf.step["obs"][0], buf.step["obs"][1])


def test_driver_prints_table_and_png(ppo, tmp_path, capsys):
    code = ppo.main(["--total-steps", "1024", "--num-envs", "4", "--num-steps", "32", "--chunk-updates", "4", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "steps/s" in out and "final mean return" in out and "steps to 475" in out
    assert (tmp_path / "ppo_CartPole-v1.png").stat().st_size > 1000
    assert (tmp_path / "ppo_CartPole-v1.json").exists()


def test_exit_status_with_explicit_target(ppo, monkeypatch):
    """Only an explicit --target makes a missed target a failure (the training itself is faked)."""
    calls = []

    def fake_run(config, target, out_dir, log=print):
        calls.append((config, target, out_dir))
        return {"seeds": [{"steps_to_target": 1000}, {"steps_to_target": None}]}

    monkeypatch.setattr(ppo, "run", fake_run)
    assert ppo.main(["--num-seeds", "2"]) == 0  # reported only
    assert calls[-1][1] == 475.0 and calls[-1][2] == "out" and calls[-1][0].num_seeds == 2
    assert ppo.main(["--num-seeds", "2", "--target", "400", "--out", ""]) == 1
    assert calls[-1][1] == 400.0 and calls[-1][2] is None
    assert ppo.main(["--env", "Acrobot-v1"]) == 0 and calls[-1][1] == -100.0


def test_minibatches_not_dividing_the_rollout_are_a_usage_error(ppo, monkeypatch, capsys):
    """Refused while the arguments are read (exit status 2, the library's message), before any training starts."""
    monkeypatch.setattr(ppo, "run", lambda *a, **k: pytest.fail("trained"))
    with pytest.raises(SystemExit) as e:
        ppo.main(["--num-minibatches", "3"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "num_minibatches: expected a divisor of" in err and "= 512" in err and "got 3" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_full_run_reaches_475(ppo):
    """Default settings reach a rolling 20-episode mean of >= 475 on CartPole-v1."""
    summary = ppo.run(ppo.PPOConfig(), target=475.0, out_dir=None, log=lambda s: None)
    assert summary["seeds"][0]["steps_to_target"] is not None, summary["seeds"]
    assert np.nanmax(summary["metrics"]["return_mean"]) >= 475.0
