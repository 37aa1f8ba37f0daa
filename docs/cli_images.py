"""Make the guide's pictures of the `jaxbuffers` command: docs/images/cli_sheet.png and docs/images/cli_viewer.png.

Plays random Breakout with ale-py (the recipe of tests/atari_frames.py), stores the steps in a
`CompressedTrajectoryBuffer` with frame-stack dedup, saves it, then runs `jaxbuffers sheet` and screenshots
`jaxbuffers serve` in headless Chromium. Needs the `examples`, `inspect` and `dev` extras and a `chromium` executable.

    python docs/cli_images.py
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import jaxbuffers as jb  # noqa: E402
from atari_frames import rollout  # noqa: E402
from chromium import Chromium, chromium_path  # noqa: E402
from jaxbuffers.cli import main  # noqa: E402
from jaxbuffers.cli._images import find_image  # noqa: E402
from jaxbuffers.cli._server import make_server  # noqa: E402
from jaxbuffers.cli._view import BufferView  # noqa: E402
from jaxbuffers.compressed import CompressedTrajectoryBuffer  # noqa: E402

STEPS = 400


def build(path: Path) -> Path:
    d = rollout("breakout", STEPS, seed=0)
    obs = d["breakout_frames"][d["breakout_obs_idx"]]  # [STEPS, 4, 84, 84]; this recipe never truncates
    step = {"obs": jnp.zeros((4, 84, 84), jnp.uint8), "action": jnp.int32(0), "reward": jnp.float32(0)}
    buf = CompressedTrajectoryBuffer.create(step, num_envs=1, length=STEPS, frame_stack=4)
    for t in range(STEPS):
        buf = buf.add({"obs": jnp.asarray(obs[t : t + 1]), "action": jnp.asarray(d["breakout_actions"][t : t + 1], jnp.int32),
                       "reward": jnp.asarray(d["breakout_rewards"][t : t + 1])},
                      terminated=jnp.asarray(d["breakout_terminated"][t : t + 1] | d["breakout_truncated"][t : t + 1]))
    return jb.save(path, buf, progress=False)


def viewer_screenshot(saved: Path, out: Path, tmp: Path) -> None:
    view = BufferView(jb.restore(saved, progress=False))
    server = make_server(view, find_image(view), port=0, scale=2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with Chromium(tmp, width=1100, height=300) as browser:
            browser.open(f"http://127.0.0.1:{server.server_address[1]}/#k=0&t=40")
            browser.wait_frame(0, 40)
            browser.screenshot(out)
    finally:
        server.shutdown()
        server.server_close()


def run() -> None:
    images = ROOT / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        saved = build(Path(tmp) / "breakout")
        main(["--no-progress", "sheet", str(saved), "--out", str(images / "cli_sheet.png"), "--count", "6", "--columns", "2", "--scale", "2"])
        if chromium_path() is None:
            sys.exit("no chromium executable: the viewer screenshot needs Debian's `chromium` package")
        viewer_screenshot(saved, images / "cli_viewer.png", Path(tmp))
    print(f"wrote {images / 'cli_sheet.png'} and {images / 'cli_viewer.png'}")


if __name__ == "__main__":
    run()
