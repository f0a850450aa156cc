"""--py-spy: sample the runner's Python stacks with py-spy while the model runs.

py-spy writes speedscope JSON, which we keep as an artifact (speedscope.app opens it) and turn into
spans in `stacks` -- a frame held over consecutive samples becomes one span at its depth -- so the
timeline can draw a Python-stack track under the ops.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

from opscope.runtime.child import start

RATE = 200


def find_py_spy() -> str | None:
    """py-spy on PATH, else the one installed beside this interpreter: a venv's bin/ (pip puts py-spy's binary
    there) is not on PATH unless the venv is activated, and `.venv/bin/opscope --py-spy` must still find it."""
    exe = shutil.which("py-spy")
    if exe is not None:
        return exe
    for folder in {os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable)),
                   sysconfig.get_path("scripts")}:
        cand = shutil.which("py-spy", path=folder) if folder else None
        if cand is not None:
            return cand
    return None


class PySpy:
    """`start()` attaches to `pid`; `finish()` waits for py-spy (it stops when the runner exits)."""

    def __init__(self, pid: int, rate: int = RATE):
        self.pid, self.rate = pid, rate
        self.proc = None
        self.t0_ns = 0
        self.note = None
        self._dir = tempfile.mkdtemp(prefix="opscope-pyspy-")
        self.path = os.path.join(self._dir, "profile.speedscope.json")

    def start(self) -> "PySpy":
        exe = find_py_spy()
        if exe is None:
            self.note = ("py-spy is not installed (pip install py-spy): not on PATH, nor beside this Python "
                         f"({os.path.dirname(sys.executable)}); the run was not sampled")
            return self
        self.t0_ns = time.perf_counter_ns()
        self.proc = start([exe, "record", "--pid", str(self.pid), "-f", "speedscope", "-o", self.path,
                           "--rate", str(self.rate), "--nonblocking"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return self

    def finish(self, timeout: float = 20.0) -> tuple[bytes | None, str | None]:
        """(speedscope JSON, None) or (None, why there is none)."""
        if self.proc is None:
            return None, self.note
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()            # SIGTERM: py-spy still writes what it sampled
            try:
                _, err = self.proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, err = self.proc.communicate()
        data = None
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            with open(self.path, "rb") as f:
                data = f.read()
        shutil.rmtree(self._dir, ignore_errors=True)
        if data is None:
            lines = [ln.strip() for ln in (err or "").splitlines() if ln.strip() and not ln.startswith(" ")]
            why = next((ln for ln in lines if "rror" in ln or "ermission" in ln), lines[0] if lines else "no output")
            self.note = f"py-spy could not sample the runner (pid {self.pid}): {why}"
        return data, self.note


def stack_spans(speedscope: bytes | str, t0_ns: int) -> list[tuple]:
    """Rows (t_ns, dur_ns, thread, depth, frame) from a sampled speedscope profile."""
    doc = json.loads(speedscope)
    frames = [f"{f.get('name', '?')} ({os.path.basename(f.get('file') or '?')}:{f.get('line') or 0})"
              for f in doc.get("shared", {}).get("frames", [])]
    rows = []
    for prof in doc.get("profiles", []):
        if prof.get("type") != "sampled":
            continue
        m = re.search(r"(\d+)", prof.get("name", ""))
        thread = int(m.group(1)) if m else 0
        scale = {"seconds": 1e9, "milliseconds": 1e6, "microseconds": 1e3, "nanoseconds": 1}.get(prof.get("unit"), 1e9)
        t = t0_ns + int(float(prof.get("startValue", 0)) * scale)
        open_: list[tuple[int, int]] = []          # (frame index, start ns), root first
        for stack, w in zip(prof.get("samples", []), prof.get("weights", [])):
            keep = 0
            while keep < len(open_) and keep < len(stack) and open_[keep][0] == stack[keep]:
                keep += 1
            for depth in range(len(open_) - 1, keep - 1, -1):
                fi, s = open_[depth]
                rows.append((s, t - s, thread, depth, frames[fi] if fi < len(frames) else "?"))
            open_ = open_[:keep] + [(fi, t) for fi in stack[keep:]]
            t += int(float(w) * scale)
        for depth in range(len(open_) - 1, -1, -1):
            fi, s = open_[depth]
            rows.append((s, t - s, thread, depth, frames[fi] if fi < len(frames) else "?"))
    return rows
