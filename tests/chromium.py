"""A minimal headless-Chromium driver for the tests, over the DevTools protocol (websocket-client).

`Chromium(tmp)` starts `chromium --headless` with its own profile in `tmp`, opens one page target, and offers
`open(url)`, `eval(js)`, `click(element id)`, `box(element id)` and `screenshot(path)`.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        p = shutil.which(name)
        if p:
            return p
    return None


class Chromium:
    def __init__(self, tmp: Path, width: int = 1000, height: int = 600, timeout: float = 60.0):
        self.tmp, self.width, self.height, self.timeout = Path(tmp), width, height, timeout
        self.proc = None
        self.ws = None
        self._id = 0

    def __enter__(self) -> "Chromium":
        import websocket

        profile = self.tmp / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [chromium_path(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
             "--force-device-scale-factor=1", "--hide-scrollbars", "--force-color-profile=srgb",
             f"--window-size={self.width},{self.height}", "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"chromium did not start (exit code {self.proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=self.timeout, suppress_origin=True)
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height, deviceScaleFactor=1, mobile=False)
        return self

    def __exit__(self, *exc) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def call(self, method: str, **params):
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, js: str):
        r = self.call("Runtime.evaluate", expression=js, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{js}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def wait(self, js: str, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not self.eval(js):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page: {what} never happened")
            time.sleep(0.05)

    def wait_frame(self, k: int, t: int) -> None:
        """Until the page's frame image shows step `t` of episode `k`, loaded."""
        js = (f"(() => {{ const i = document.getElementById('frame'); return !!i && i.dataset.k == '{k}' && "
              f"i.dataset.t == '{t}' && i.complete && i.naturalWidth > 0; }})()")
        self.wait(js, f"frame k={k} t={t} loaded")

    def box(self, element_id: str) -> tuple[int, int, int, int]:
        """(x, y, width, height) of an element's content box, in CSS pixels (= screenshot pixels at scale 1)."""
        r = self.eval(f"(() => {{ const e = document.getElementById('{element_id}'); const b = e.getBoundingClientRect(); "
                      f"const s = getComputedStyle(e); const bl = parseFloat(s.borderLeftWidth), bt = parseFloat(s.borderTopWidth); "
                      f"return [b.x + bl, b.y + bt, e.clientWidth, e.clientHeight]; }})()")
        return tuple(int(round(v)) for v in r)

    def click(self, element_id: str) -> None:
        """A real mouse click at the centre of the element."""
        x, y, w, h = self.box(element_id)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x + w / 2, y=y + h / 2, button="left", clickCount=1)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)
