"""Calibrate the link: a real gloo all-reduce micro-benchmark on this host, fitted to the ring model.

    fit = measure_link(ranks=2)       # 2 processes, a few sizes: {"bandwidth", "latency", "ranks", "points": [...]}
    save_link(fit); stored_link()     # $OPSCOPE_HOME/links.json, per host: reused by `opscope simulate`

N ranks (2 by default; `python -m opscope.runtime.dist.linkbench`, torchrun's variables, one thread each)
all-reduce float32 buffers of each size, each one after a burst of compute with no barrier, as a training step
issues it (the link that is stored), and also back to back (kept beside it: on a busy host the two differ
several times over), in rounds over the sizes; the median per size is fitted to the N-rank ring time
2(N-1)/N B/W + 2(N-1)a by least squares on relative error (small sizes fix the latency, large ones the
bandwidth). Each point keeps the measured and the fitted
time, so a reader sees how well the line holds.
"""
from __future__ import annotations

import json
import math
import os
import socket
import statistics
import time

import numpy as np

from ..errors import ModelError, UsageError
from ..home import opscope_home, read_small_json

SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)
REPEATS = 7
MARK = "@opscope-link "


def measure_link(sizes=SIZES, repeats: int = REPEATS, timeout_s: float = 120.0, ranks: int = 2) -> dict:
    """ranks: the processes that all-reduce (the ranks the prediction is for: on one host they share its cores,
    and a ring of 4 on 2 cores is not 2 rings of 2)."""
    from .local_ranks import run_local_ranks
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPSCOPE_LINK_SIZES": ",".join(str(int(s)) for s in sizes),
           "OPSCOPE_LINK_REPEATS": str(int(repeats))}
    medians = run_local_ranks("opscope.runtime.dist.linkbench", ranks, env, MARK, timeout_s=timeout_s,
                              what=f"the link benchmark (gloo all-reduce between {ranks} local processes)",
                              answering=[0])[0]
    fit = fit_ring(medians["step"], ranks=ranks)
    hot = fit_ring(medians["hot"], ranks=ranks)
    fit["back_to_back"] = {k: hot[k] for k in ("bandwidth", "latency", "points")}
    return fit


def fit_ring(points: list[list[float]], ranks: int = 2) -> dict:
    """(bytes, seconds) medians -> the ring model's W and a, by least squares on relative error."""
    n = ranks
    b = np.array([p[0] for p in points], float)
    t = np.array([p[1] for p in points], float)
    # T = 2(n-1)/n * B * (1/W) + 2(n-1) * a, each row divided by T (relative residuals)
    rows = np.stack([2 * (n - 1) / n * b / t, 2 * (n - 1) * np.ones_like(b) / t], axis=1)
    (inv_w, a), *_ = np.linalg.lstsq(rows, np.ones_like(b), rcond=None)
    if not inv_w > 0:
        raise ModelError("the link benchmark's times do not grow with the size; run it again on a quieter machine")
    a = max(0.0, float(a))
    model = 2 * (n - 1) / n * b * inv_w + 2 * (n - 1) * a
    return {"bandwidth": float(1 / inv_w), "latency": a, "topology": "ring", "ranks": n, "engine": "gloo",
            "host": socket.gethostname(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "points": [{"bytes": int(x), "measured_seconds": float(y), "model_seconds": float(m)}
                       for x, y, m in zip(b, t, model)]}


MAX_LINKS = 1 << 20            # links.json holds one small entry per host


def _links_file():
    return opscope_home() / "links.json"


def save_link(fit: dict) -> str:
    from ..home import private_folder
    path = _links_file()
    try:
        private_folder(path.parent)
        data = read_small_json(path, MAX_LINKS)          # bounded, as stored_link reads it (a FIFO blocked here)
        data = data if isinstance(data, dict) else {}
        data[fit["host"]] = fit
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot store the measured link at {path}: {getattr(e, 'strerror', None) or e}; set "
                         "OPSCOPE_HOME to a writable folder") from None
    return str(path)


def stored_link() -> dict | None:
    """This host's last measured link, or None (never measured, or an unreadable file)."""
    links = read_small_json(_links_file(), MAX_LINKS)
    entry = links.get(socket.gethostname()) if isinstance(links, dict) else None
    # a hand-edited or damaged entry reads as never measured, not as a link of bandwidth -1 or NaN
    ok = isinstance(entry, dict) and all(isinstance(entry.get(k), (int, float)) and not isinstance(entry[k], bool)
                                         and math.isfinite(entry[k]) for k in ("bandwidth", "latency"))
    return entry if ok and entry["bandwidth"] > 0 and entry["latency"] >= 0 else None


def _rank_main() -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=__import__("datetime").timedelta(seconds=60))
    sizes = [int(s) for s in os.environ["OPSCOPE_LINK_SIZES"].split(",")]
    repeats = int(os.environ["OPSCOPE_LINK_REPEATS"])
    a, w = torch.randn(64, 256), torch.randn(256, 256)
    bufs = [torch.ones(max(1, size // 4), dtype=torch.float32) for size in sizes]
    times = {mode: [[] for _ in sizes] for mode in ("hot", "step")}
    dist.barrier()
    # rounds over every size, not every repeat of one size in a row: on a shared host a burst of load then
    # lands on all sizes alike instead of bending the fitted line at one end of it
    for i in range(repeats + 2):                       # two warm-up rounds: gloo sets up its pairs lazily
        for k, buf in enumerate(bufs):
            for mode in ("hot", "step"):
                if mode == "hot":
                    dist.barrier()
                else:
                    # as a training step issues it: after a burst of compute (the same work on every rank), no
                    # barrier, so gloo's waiting threads have slept and the skew with which the ranks left the
                    # last collective is paid in this one; back to back after a barrier ("hot") neither happens,
                    # and on a busy host the two differ several times over
                    for _ in range(8):
                        (a @ w).relu_()
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                if i >= 2:
                    times[mode][k].append(time.perf_counter() - t0)
    out = {mode: [[buf.numel() * 4, statistics.median(t)] for buf, t in zip(bufs, times[mode])]
           for mode in times}
    dist.barrier()
    if dist.get_rank() == 0:
        print(MARK + json.dumps(out), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main()
