#!/usr/bin/env bash
# The GPU check, prepared as one script for the device tool's machine (one NVIDIA GPU; JAX with
# CUDA, flax, chex, optax, numba, pytest and hypothesis preinstalled; no network, so flashbax
# travels as a wheel). Nothing here has been run on a GPU yet: no device has been lent so far.
#
# Prepare here, once (the wheel is pure Python):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl flashbax==0.1.3
# Run there (device tool): command "bash benchmarks/device_run.sh", carry [".whl"], timeout_s ~540.
# Results come back under $OUT: devices.txt, tests.log, bench_*.jsonl. Each step has its own time
# limit, so a slow step leaves the others' results.
#
# Locally (CPU, for trying the script): OUT=/tmp/device_out bash benchmarks/device_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
# Several test processes share one GPU: none may take JAX's default 75% of its memory.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" XLA_PYTHON_CLIENT_PREALLOCATE=false
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
PY=${PYTHON:-python3}
$PY - <<'EOF' 2>&1 | tee "$OUT/devices.txt"
import jax, jaxlib, flax
print("backend", jax.default_backend(), "devices", jax.devices(), "jax", jax.__version__, "jaxlib", jaxlib.__version__, "flax", flax.__version__)
EOF
# 1. The device buffers' tests, on the GPU's own code paths (on CPU: pytest --accelerator-paths).
timeout 270 $PY -m pytest -q -p no:cacheprovider -n "${WORKERS:-8}" tests/test_kernel.py tests/test_sum_tree.py tests/test_prioritised.py tests/test_ring.py tests/test_replay.py 2>&1 | tee "$OUT/tests.log"
# 2. Side by side with flashbax (its GPU sum-tree update: benchmarks/_common.flashbax_device).
timeout 120 $PY benchmarks/bench_prioritised.py --quick 2>"$OUT/bench_prioritised.err" | tee "$OUT/bench_prioritised.jsonl"
timeout 150 $PY benchmarks/bench_trajectory.py --quick --steps vector 2>"$OUT/bench_trajectory.err" | tee "$OUT/bench_trajectory.jsonl"
