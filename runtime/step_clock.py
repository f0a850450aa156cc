"""A step's time on the backend's own clock: one sum that run, train, optimize, tune and simulate share.

    clock = StepClock()
    with executor.hooked(clock):
        executor.run(*inputs)
    clock.ns, clock_name(backend)          # 1245850, "simulated"

On a sim chip every op's (start, end) is the chip's: its own ops their roofline time, fallback
ops their modelled host time (runtime/backends/sim_backend.py: HOST), transfers the link's time;
so the sum is the same to the ns in every run. Elsewhere it is the ops' host wall time.
"""
from __future__ import annotations


class StepClock:
    """An executor hook: the ns of every op of the steps it sees, summed as integers (exact)."""

    reads_inputs_after_op = False       # a trainer may keep its in-place parameter updates

    def __init__(self):
        self.ns = 0

    def after_op(self, call) -> None:
        if call.end_ns:
            self.ns += call.end_ns - call.start_ns

    @property
    def seconds(self) -> float:
        return self.ns / 1e9


def clock_name(backend) -> str:
    """What a time from this backend's clock is: "simulated" (a described chip) or "wall" (the host's)."""
    return "simulated" if getattr(backend.clock, "simulated", False) else "wall"
