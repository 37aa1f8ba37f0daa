"""Smoke test of examples/sb3_ppo_atari.py: two tiny PPO updates on Breakout with the compressed rollout buffer."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

pytest.importorskip("ale_py")
pytest.importorskip("cv2")
pytest.importorskip("stable_baselines3")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "sb3_ppo_atari.py"


def test_sb3_ppo_atari_smoke(capsys):
    spec = importlib.util.spec_from_file_location("sb3_ppo_atari", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    summary = mod.main(["--total-steps", "64", "--n-envs", "2", "--n-steps", "32", "--batch-size", "32", "--n-epochs", "1"])
    out = capsys.readouterr().out
    assert "SB3 RolloutBuffer" in out and "ratio" in out
    assert summary["env_steps"] == 64 and summary["steps_per_rollout"] == 64
    # 64 stacked 84x84x4 uint8 observations: 1.8 MB raw in SB3's buffer; compressed far below.
    assert summary["sb3_nbytes"] > 64 * 84 * 84 * 4
    assert 0 < summary["buffer_nbytes"] < summary["sb3_nbytes"] / 3
