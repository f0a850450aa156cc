"""What `opscope monitor` samples: the host (psutil), described sim chips (their thermal model
under a set load), and a live multi-rank run in the store (rank step times, temperatures, drops).

    for subject, sample, device, extra in host.poll(dt) / chip.poll(dt) / run.poll(): ...
"""
from __future__ import annotations

import statistics

import psutil


class HostDevice:
    name = "host"

    def __init__(self):
        psutil.cpu_percent(None)          # the first call only starts the measurement
        self.device = {"name": "host", "kind": "cpu", "tdp": 0, "throttle_temperature": 0}

    def poll(self, dt: float):
        sample = {"utilization": psutil.cpu_percent(None) / 100.0, "memory": psutil.virtual_memory().percent / 100.0}
        temps = getattr(psutil, "sensors_temperatures", lambda: {})() or {}
        readings = [t.current for group in temps.values() for t in group if t.current]
        if readings:
            sample["temperature"] = max(readings)
        yield self.name, sample, self.device, {}


class SimChip:
    """A described chip at a fixed load: each poll advances its thermal model by `dt` seconds."""

    def __init__(self, spec: str, load: float = 1.0):
        from opscope.runtime import backends
        from opscope.runtime.dist.thermal import ThermalModel
        self.backend = backends.resolve(spec)
        self.name = self.backend.name
        self.thermal = ThermalModel.of(self.backend)
        self.load = load
        th = self.thermal
        self.device = {"name": self.name, "kind": self.backend.description.kind,
                       "tdp": th.tdp if th else 0, "throttle_temperature": th.throttle_temperature if th else 0}

    def poll(self, dt: float):
        sample = {"utilization": self.load}
        if self.thermal:
            self.thermal.advance(dt * self.load, dt * (1 - self.load))
            sample.update(temperature=self.thermal.temperature, power=self.thermal.power)
        yield self.name, sample, self.device, {}


class LiveRun:
    """A run's multi-rank steps as they arrive (runtime/dist keeps them in the run's config)."""

    def __init__(self, store, run_id: str):
        self.store, self.run = store, store.get_run(run_id)
        self.run_id = self.run["run_id"]
        self.seen_steps = -1
        self.finished = False

    def poll(self, dt: float = 0.0):
        run = self.store.get_run(self.run_id)
        self.finished = run.get("status") not in ("running", None)
        dist = (run.get("config") or {}).get("dist") or {}
        for s in dist.get("steps", []):
            if s["step"] <= self.seen_steps:
                continue
            self.seen_steps = s["step"]
            times = s.get("device_seconds", [])
            median = statistics.median(times) if times else 0.0
            for rank, t in enumerate(times):
                sample = {"rank_step_seconds": t}
                th = (s.get("thermal") or {}).get(str(rank)) or (s.get("thermal") or {}).get(rank)
                if th:
                    sample.update(temperature=th["temperature"], power=th["power"])
                name = f"rank {rank} ({dist.get('backends', ['?'] * (rank + 1))[rank]})"
                yield name, sample, {"name": name, "kind": "rank", "tdp": 0, "throttle_temperature": 0}, \
                    {"median": median}
        if run.get("dropped"):
            yield "run", {"dropped_events": int(run["dropped"])}, {"name": f"run {self.run_id}"}, {}
