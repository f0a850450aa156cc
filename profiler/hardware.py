"""Hardware samples while a run is live: CPU % and RSS of the runner (psutil), GPU via NVML if present.

Samples go into the store about once a second, so a live view sees them without waiting for the end.
"""
from __future__ import annotations

import threading
import time

import psutil

INTERVAL_S = 0.1
WRITE_EVERY_S = 1.0


def _nvml():
    """(handle, pynvml) for GPU 0, or None: no GPU, no library, no driver -- then nothing is sampled."""
    try:
        import pynvml
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        return pynvml.nvmlDeviceGetHandleByIndex(0), pynvml
    except Exception:
        return None


class HardwareSampler:
    def __init__(self, store, run_id: str, pid: int, interval_s: float = INTERVAL_S):
        self.store, self.run_id, self.pid, self.interval_s = store, run_id, pid, interval_s
        self.samples = 0
        self.error = None        # why samples stopped being written (a full disk): the run's own writes say so
        self._rows: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="opscope-hardware", daemon=True)

    def start(self) -> "HardwareSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        try:
            proc = psutil.Process(self.pid)
            proc.cpu_percent(None)          # the first call only sets the baseline
        except psutil.Error:
            return
        gpu = _nvml()
        last_write = time.monotonic()
        while not self._stop.wait(self.interval_s):
            try:
                with proc.oneshot():
                    cpu, rss = proc.cpu_percent(None), proc.memory_info().rss
            except psutil.Error:            # the runner is gone
                break
            row = [time.perf_counter_ns(), cpu, rss, None, None, None, None]
            if gpu is not None:
                h, nv = gpu
                try:
                    row[3] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                    row[4] = int(nv.nvmlDeviceGetMemoryInfo(h).used)
                    row[5] = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
                    row[6] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                except Exception:
                    pass
            self._rows.append(tuple(row))
            if time.monotonic() - last_write > WRITE_EVERY_S:
                self._write()
                last_write = time.monotonic()
        self._write()

    def _write(self) -> None:
        rows, self._rows = self._rows, []
        if rows and self.error is None:
            from opscope.runtime.errors import OpscopeError
            try:
                self.store.add_hardware(self.run_id, rows)
            except OpscopeError as e:     # one line about the store comes from the run itself, not a thread traceback
                self.error = e
                return
            self.samples += len(rows)
