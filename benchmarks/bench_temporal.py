"""Temporal coding of Atari frames: bytes per frame and coding speed of each choice, one JSON line per case.

Each lane's frame is coded against the previous frame of the same lane (`xor`, or `sub`: the byte difference
modulo 256), with a keyframe at every episode start and every `K` frames (`K=1`: every frame a keyframe, no
temporal coding); both go through zstd (`level`), keyframes and deltas each with or without a 32 KiB dictionary
trained on the first 1,024 frames (zstd's trainer, as the compressed buffers' stores build it).

Frames: the first `--n` steps of a random-policy rollout per game (`_atari.rollout`, played with ale-py).
Rows: `value` is bytes per frame (payload padded to 8 bytes, as the store's arena holds it); `encode_mbs` /
`decode_mbs` are MB/s of raw frames on one thread (decoding a frame decodes its chain from the keyframe, each frame
once, in order); `exact`: the round trip gave the frames back.

Usage: python benchmarks/bench_temporal.py [--quick] [--games mspacman,spaceinvaders,seaquest] [--n 3000]
"""

from __future__ import annotations

import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import _atari  # noqa: E402
from _common import emit, header, parser  # noqa: E402

BENCH = "temporal"
DICTS = {(True, True): "keyframes and deltas", (True, False): "keyframes", (False, False): "none"}
# the dictionary settings run for K > 1: all three for K = 8 with XOR, the chosen one elsewhere
GRID = {True: ((True, True), (True, False), (False, False)), False: ((True, True),)}


def code(frames, starts, k, transform, level, key_dict, delta_dict):
    """Encode then decode `frames` [n, 84, 84]; returns (bytes per frame, encode s, decode s, round trip exact)."""
    import zstandard as z

    def coders(d):
        zd = None if d is None else z.ZstdCompressionDict(d, dict_type=z.DICT_TYPE_FULLDICT)
        return (z.ZstdCompressor(level=level, dict_data=zd, write_checksum=True, write_content_size=True, write_dict_id=False),
                z.ZstdDecompressor(dict_data=zd))

    kc, kd = coders(key_dict)
    dc, dd = coders(delta_dict)
    n = frames.shape[0]
    since = np.zeros(n, np.int64)
    for t in range(1, n):
        since[t] = 0 if starts[t] else (since[t - 1] + 1) % k
    rows = frames.reshape(n, -1)
    t0 = time.perf_counter()
    payloads = []
    for t in range(n):
        if since[t] == 0:
            payloads.append(kc.compress(rows[t]))
        elif transform == "xor":
            payloads.append(dc.compress(np.bitwise_xor(rows[t], rows[t - 1])))
        else:
            payloads.append(dc.compress(rows[t] - rows[t - 1]))
    enc = time.perf_counter() - t0
    out = np.empty_like(rows)
    t0 = time.perf_counter()
    for t in range(n):
        if since[t] == 0:
            out[t] = np.frombuffer(kd.decompress(payloads[t]), np.uint8)
        else:
            d = np.frombuffer(dd.decompress(payloads[t]), np.uint8)
            if transform == "xor":
                np.bitwise_xor(d, out[t - 1], out=out[t])
            else:
                np.add(d, out[t - 1], out=out[t])
    dec = time.perf_counter() - t0
    size = sum((len(p) + 7) // 8 * 8 for p in payloads)
    return size / n, enc, dec, bool(np.array_equal(out, rows))


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--games", default=",".join(_atari.GAMES))
    p.add_argument("--n", type=int, default=None)
    args = p.parse_args()
    n = args.n or (600 if args.quick else 3000)
    header(BENCH, args.quick, frames_per_game=n)
    from host_codecs import ZstdDictionary

    for game in args.games.split(","):
        d = _atari.rollout(game, n)
        frames = d["frame"]
        ends = d["terminated"] | d["truncated"]
        starts = np.concatenate([[True], ends[:-1]])
        for level in (-1, 1):
            dic = ZstdDictionary.train(list(frames[:1024].reshape(min(n, 1024), -1)), 32768, level).data
            for k in (1, 4, 8, 16, 32):
                for transform in ("xor", "sub") if k > 1 else ("none",):
                    for key_dict, delta_dict in ((True, True), (False, False)) if k == 1 else GRID[k == 8 and transform == "xor"]:
                        bpf, enc, dec, exact = code(frames, starts, k, transform, level, dic if key_dict else None, dic if delta_dict else None)
                        raw = frames.nbytes / 1e6
                        emit({"bench": BENCH, "case": f"{game}/zstd:{level}/K={k}", "impl": "ours",
                              "variant": f"{transform}, dictionary for {DICTS[key_dict, delta_dict]}", "value": round(bpf, 1),
                              "unit": "bytes/frame", "game": game, "K": k, "level": level, "transform": transform,
                              "key_dict": key_dict, "delta_dict": delta_dict, "encode_mbs": round(raw / enc, 1),
                              "decode_mbs": round(raw / dec, 1), "exact": exact, "n": n, "repeats": 1})


if __name__ == "__main__":
    main()
