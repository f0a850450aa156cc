"""A sim chip's thermal/power model (the description's [thermal] table), so throttling -- and
the re-balancing and alerts it causes -- can be tested on a machine without the chip.

    t = ThermalModel.of(backend)          # None when the description has no [thermal]
    factor = t.advance(busy_s)            # heat from busy time; returns the slowdown (1.0 or throttle_slowdown)
    t.sample()                            # {"temperature": C, "power": W, "throttled": bool}

The model is deliberately simple: temperature rises by heating_rate per second of busy device time
and falls by cooling_rate per idle second toward ambient; at throttle_temperature the chip runs
throttle_slowdown times slower and draws tdp / throttle_slowdown.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULTS = {"ambient": 35.0, "cooling_rate": 0.0}


@dataclass
class ThermalModel:
    tdp: float
    throttle_temperature: float
    throttle_slowdown: float
    heating_rate: float
    ambient: float = 35.0
    cooling_rate: float = 0.0
    temperature: float = 0.0
    utilization: float = 0.0

    def __post_init__(self):
        self.temperature = self.temperature or self.ambient

    @classmethod
    def of(cls, backend) -> "ThermalModel | None":
        desc = getattr(backend, "description", None)
        table = getattr(desc, "thermal", None)
        return cls(**{**DEFAULTS, **table}) if table else None

    @property
    def throttled(self) -> bool:
        return self.temperature >= self.throttle_temperature

    def advance(self, busy_s: float, idle_s: float = 0.0) -> float:
        """Account `busy_s` of work (and `idle_s` of rest); the slowdown that work ran at."""
        factor = self.throttle_slowdown if self.throttled else 1.0
        self.temperature += self.heating_rate * busy_s * factor
        self.temperature = max(self.ambient, self.temperature - self.cooling_rate * idle_s)
        total = busy_s * factor + idle_s
        self.utilization = busy_s * factor / total if total > 0 else 0.0
        return factor

    @property
    def power(self) -> float:
        return self.tdp * self.utilization / (self.throttle_slowdown if self.throttled else 1.0)

    def sample(self) -> dict:
        return {"temperature": round(self.temperature, 3), "power": round(self.power, 3),
                "throttled": self.throttled, "utilization": round(self.utilization, 3)}
