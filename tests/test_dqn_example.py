"""Smoke test of examples/dqn_atari.py: a few hundred env steps with a tiny compressed buffer."""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("ale_py")
pytest.importorskip("cv2")
pytest.importorskip("gymnasium")
pytest.importorskip("optax")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "dqn_atari.py"


def _load():
    spec = importlib.util.spec_from_file_location("dqn_atari", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dqn_atari"] = mod  # flax modules are dataclasses: their module must be registered
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "extra",
    [pytest.param([], id="dqn"), pytest.param(["--n-step", "3", "--prioritised"], id="nstep-per", marks=pytest.mark.slow)],
)
def test_dqn_atari_smoke(extra, user_xla_flags):
    # run as a user runs it: its own process, with XLA's default compile flags (the tests' backend optimisation level 0
    # compiles faster but makes this example's convolutions train slower than the compile time it saves)
    env = {**os.environ, "XLA_FLAGS": user_xla_flags}
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "--total-steps", "200", "--buffer-size", "150", "--learning-starts", "100",
         "--train-freq", "4", "--log-every", "100", "--codec", "zstd:3", "--batch-size", "8", *extra],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    summary = ast.literal_eval(out.strip().splitlines()[-1])
    assert "steps/s" in out and "MiB" in out  # progress lines with throughput and buffer bytes
    assert summary["env_steps"] == 200
    # 150-transition ring: full after 200 steps; one compressed 84x84 frame per stored step.
    assert summary["stored_transitions"] == 150
    assert 0 < summary["buffer_host_nbytes"] < summary["buffer_raw_nbytes"] / 10


@pytest.mark.slow  # two runs of the example; save / restore round trips of every buffer run in test_checkpoint.py
def test_dqn_atari_resumes_train_state_buffer_and_step_counter(tmp_path, capsys):
    common = ["--buffer-size", "150", "--learning-starts", "60", "--train-freq", "4", "--log-every", "100",
              "--codec", "zstd:3", "--batch-size", "8", "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "100"]
    first = _load().main(["--total-steps", "120", *common])
    assert first["resumed_from"] == 0 and first["stored_transitions"] == 120
    assert sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.isdigit()) == ["100", "120"]
    second = _load().main(["--total-steps", "200", "--resume", *common])
    assert "resumed from step 120 (120 stored transitions)" in capsys.readouterr().out
    assert second["resumed_from"] == 120 and second["env_steps"] == 200
    assert second["stored_transitions"] == 150  # the restored 120 plus 80 new ones, in a ring of 150
