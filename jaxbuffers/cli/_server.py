"""`jaxbuffers serve`: a local web page to step through the episodes of a buffer, frame by frame.

Standard library only (`http.server`), bound to the loopback interface. Routes:

* `/`: the page (episode list, the frame, the step's fields, buttons, keys `<-` / `->`, deep links `#k=2&t=5`);
* `/api/summary`: JSON `{"type", "image", "fields", "episodes": [{"k", "lane", "length", "terminated",
  "truncated", "partial"}, ...]}`;
* `/api/episode?k=K`: JSON `{"k", "length", "steps": [{"t", "fields": {field: value, ...}}, ...]}` (arrays over
  16 values are summarised as shape, min and max);
* `/frame.png?k=K&t=T`: step `T` of episode `K` as a PNG, pixels as stored (upscaled by `--scale`).

A bad request gets a 400/404 with a JSON `{"error": ...}` naming the parameter.
"""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np

from jaxbuffers.cli._images import ImageField, check_scale, scaled
from jaxbuffers.cli._view import BufferView, ViewError, is_floating

__all__ = ["make_server", "PAGE"]


def _number(v):
    """A JSON number, or the string "nan" / "inf" / "-inf" (JSON has none of them)."""
    return v if not isinstance(v, float) or np.isfinite(v) else str(v)


def _jsonable(x: np.ndarray):
    """One step's value of a field for the page: the value (lists up to 16 numbers), else its shape, min and max. A
    complex value comes as its text, "(1+2j)" (JSON has no complex numbers), a larger one without min and max."""
    x = np.asarray(x)
    cx = np.iscomplexobj(x)
    if x.size > 16:
        lo, hi = (None, None) if cx else (_number(float(np.nanmin(x))), _number(float(np.nanmax(x))))
        return {"shape": list(x.shape), "min": lo, "max": hi}
    if is_floating(x.dtype):
        x = np.round(x.astype(np.float64), 6)
    flat = [str(v) if cx else _number(v) for v in x.reshape(-1).tolist()]
    return flat[0] if x.ndim == 0 else np.array(flat, dtype=object).reshape(x.shape).tolist()


class _App:
    def __init__(self, view: BufferView, field: ImageField | None, scale: int):
        self.view, self.field, self.scale = view, field, scale
        self.lock = threading.Lock()  # one decode at a time (the host stores are shared)

    def summary(self) -> dict:
        v = self.view
        return {
            "type": v.kind, "image": None if self.field is None else self.field.name, "fields": v.fields,
            "episodes": [{"k": e.index, "lane": e.lane, "length": e.length, "terminated": e.terminated,
                          "truncated": e.truncated, "partial": e.partial} for e in v.episodes],
        }

    def episode(self, k: int) -> dict:
        v = self.view
        ep = v.episode(k, "k")
        names = [n for n in v.fields if self.field is None or n != self.field.name]
        cols = {n: v.column(n, ep.positions) for n in names if n not in v.compressed_fields}
        steps = [{"t": t, "fields": {n: _jsonable(c[t]) for n, c in cols.items()}} for t in range(ep.length)]
        return {"k": k, "length": ep.length, "steps": steps}

    def frame(self, k: int, t: int) -> bytes:
        from PIL import Image

        if self.field is None:
            raise ViewError("frame: this buffer has no image field")
        ep = self.view.episode(k, "k")
        if not 0 <= t < ep.length:
            raise ViewError(f"t: expected a step in [0, {ep.length - 1}] of episode {k}, got {t}")
        with self.lock:
            x = self.view.column(self.field.name, ep.positions[t : t + 1])[0]
        buf = io.BytesIO()
        Image.fromarray(scaled(self.field.picture(x), self.scale)).save(buf, format="PNG")
        return buf.getvalue()


def _int(q: dict, name: str) -> int:
    v = q.get(name, [None])[0]
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ViewError(f"{name}: expected an integer query parameter, got {v!r}") from None


def make_server(view: BufferView, field: ImageField | None, *, port: int = 8765, scale: int = 4) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1:`port` (0: any free port; read `server.server_address`) serving the page.
    `ViewError` for a `scale` outside `check_scale`'s range, before the port is taken."""
    app = _App(view, field, check_scale(field, scale))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: the terminal shows the URL only
            pass

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):  # noqa: N802 (http.server's name)
            url = urlparse(self.path)
            q = parse_qs(url.query)
            try:
                if url.path == "/":
                    self._send(200, PAGE.encode(), "text/html; charset=utf-8")
                elif url.path == "/api/summary":
                    self._send(200, json.dumps(app.summary()).encode(), "application/json")
                elif url.path == "/api/episode":
                    self._send(200, json.dumps(app.episode(_int(q, "k"))).encode(), "application/json")
                elif url.path == "/frame.png":
                    self._send(200, app.frame(_int(q, "k"), _int(q, "t")), "image/png")
                else:
                    self._send(404, json.dumps({"error": f"path: no page {url.path}"}).encode(), "application/json")
            except ViewError as e:
                self._send(400, json.dumps({"error": str(e)}).encode(), "application/json")

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>jaxbuffers viewer</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 16px; background: #fafafa; color: #222; }
 #bar { margin-bottom: 10px; display: flex; gap: 8px; align-items: center; flex-wrap: wrap; }
 #main { display: flex; gap: 24px; align-items: flex-start; }
 #frame { image-rendering: pixelated; border: 1px solid #888; background: #000; }
 table { border-collapse: collapse; } td { padding: 2px 8px; border-bottom: 1px solid #ddd; font-family: monospace; }
 td.k { color: #555; } #err { color: #b00; }
</style></head>
<body>
<div id="bar">
 <b id="kind"></b>
 <label>episode <select id="episode"></select></label>
 <button id="prev" title="previous step (left arrow)">&larr; prev</button>
 <input id="slider" type="range" min="0" max="0" value="0">
 <button id="next" title="next step (right arrow)">next &rarr;</button>
 <span id="pos"></span> <span id="err"></span>
</div>
<div id="main"><div><img id="frame" alt="frame"></div><table id="fields"></table></div>
<script>
const S = { k: 0, t: 0, ep: null, summary: null };
const $ = (id) => document.getElementById(id);
function el(tag, text, attrs) {  // an element holding `text` as text (never markup: field names come from the checkpoint)
  const e = document.createElement(tag); e.textContent = text; Object.assign(e, attrs || {}); return e;
}
function fmt(v) { return typeof v === "object" && v !== null && !Array.isArray(v) ? `shape ${JSON.stringify(v.shape)} min ${v.min} max ${v.max}` : JSON.stringify(v); }
function show() {
  const ep = S.ep; if (!ep) return;
  S.t = Math.max(0, Math.min(S.t, ep.length - 1));
  $("slider").max = ep.length - 1; $("slider").value = S.t;
  $("pos").textContent = `step ${S.t} / ${ep.length - 1}`;
  if (S.summary.image) { const img = $("frame"); img.dataset.k = S.k; img.dataset.t = S.t; img.src = `/frame.png?k=${S.k}&t=${S.t}`; }
  const step = ep.steps[S.t];
  $("fields").replaceChildren(...Object.entries(step.fields).map(([k, v]) => {
    const row = el("tr", ""); row.append(el("td", k, { className: "k" }), el("td", fmt(v))); return row; }));
  history.replaceState(null, "", `#k=${S.k}&t=${S.t}`);
}
async function load(k, t) {
  const r = await fetch(`/api/episode?k=${k}`); const j = await r.json();
  if (!r.ok) { $("err").textContent = j.error; return; }
  S.k = k; S.t = t; S.ep = j; $("episode").value = k; show();
}
async function main() {
  S.summary = await (await fetch("/api/summary")).json();
  $("kind").textContent = S.summary.type;
  if (!S.summary.image) $("frame").style.display = "none";
  $("episode").replaceChildren(...S.summary.episodes.map((e) =>
    el("option", `${e.k}: lane ${e.lane}, ${e.length} steps${e.terminated ? ", terminated" : ""}${e.truncated ? ", truncated" : ""}${e.partial ? ", partial" : ""}`, { value: e.k })));
  if (!S.summary.episodes.length) { $("err").textContent = "this buffer holds no episodes"; return; }
  const h = new URLSearchParams(location.hash.slice(1));
  await load(parseInt(h.get("k") || "0"), parseInt(h.get("t") || "0"));
}
$("episode").onchange = (e) => load(parseInt(e.target.value), 0);
$("prev").onclick = () => { S.t -= 1; show(); };
$("next").onclick = () => { S.t += 1; show(); };
$("slider").oninput = (e) => { S.t = parseInt(e.target.value); show(); };
document.addEventListener("keydown", (e) => { if (e.key === "ArrowLeft") $("prev").click(); if (e.key === "ArrowRight") $("next").click(); });
main();
</script></body></html>
"""
