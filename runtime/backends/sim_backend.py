"""sim:<name>: a described chip that does not exist yet.

Kernels compute with numpy, so results are real; the clock reports the roofline estimate
from the description (max of FLOPs/peak and bytes/bandwidth, plus launch overhead). A vendor
can describe a chip before it has software, and the advisor can ask what-if questions.
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..description import Description, load
from ..errors import UsageError
from ..hdi import HostClock, OperatorRegistry
from ..roofline import node_seconds
from . import numpy_backend


class SimClock(HostClock):
    """The simulated device's clock: ops run back to back, each taking its roofline time.

    A step starts at the host time of its first op (so runs sit where they happened), and from
    there time is the chip's, not the host's: host overhead between ops is not device time.
    """

    simulated = True

    def __init__(self, desc: Description):
        self.desc = desc
        self.now = 0

    def start(self, node):
        if not self.now:
            self.now = time.perf_counter_ns()
        return self.now

    def stop(self, node, start):
        end = start + int((node_seconds(node, self.desc) + layout_seconds(node, self.desc)) * 1e9)
        self.now = end
        return start, end

    def flush(self):
        self.now = 0          # the next step anchors to the host again


def layout_seconds(node, desc: Description) -> float:
    """A convolution handed NCHW values on a chip that prefers NHWC converts its input and output
    (read and write each: 2x its bytes), as the advisor's layout analysis estimates; the layout
    pass (runtime/passes/layout.py) marks the convolutions it keeps in NHWC."""
    if desc.preferred_layout != "nhwc" or node.op not in ("conv2d", "convolution") or not desc.memory_bandwidth:
        return 0.0
    if node.attrs.get("layout") == "nhwc" or not node.input_meta or len(node.input_meta[0].shape) != 4:
        return 0.0
    return 2 * node.bytes_moved / desc.memory_bandwidth


# The host a sim plan's fallback ops run on, described like a chip. Measured host time varies
# several times over with load (one run 79 ms, the next 136 ms), so by default a fallback op
# takes its roofline time on this host: a sim run's step time is then the same to the ns in
# every run and every command. OPSCOPE_HOST=FILE.toml describes the host ([hardware] as for a
# chip); OPSCOPE_HOST_TIME=measured keeps the host's real durations.
HOST = Description(name="host", implementation="numpy", peak_flops={"float32": 1.0e11, "float64": 5.0e10},
                   memory_bandwidth=2.0e10, launch_overhead=5.0e-6, kind="cpu",
                   summary="a default host: 100 GFLOP/s float32, 20 GB/s")


def host_description() -> Description | None:
    """The host model for fallback ops on a sim plan, or None for measured host time."""
    mode = os.environ.get("OPSCOPE_HOST_TIME", "modelled")
    if mode not in ("modelled", "measured"):
        raise UsageError(f"OPSCOPE_HOST_TIME={mode!r}: give modelled (the default) or measured")
    if mode == "measured":
        return None
    path = os.environ.get("OPSCOPE_HOST")
    return load(path) if path else HOST


class FollowClock(HostClock):
    """The fallback's clock on a sim plan: its ops placed on the sim timeline so they sit between
    the simulated ops instead of on another time base; modelled on the host description (the
    default: deterministic) or the host's real durations (`host` None)."""

    def __init__(self, sim: SimClock, host: Description | None = None):
        self.sim = sim
        self.host = host
        self.simulated = host is not None

    def start(self, node):
        return time.perf_counter_ns()

    def stop(self, node, start):
        if self.host is not None:
            dur = int(node_seconds(node, self.host) * 1e9)
        else:
            dur = time.perf_counter_ns() - start
        s = self.sim.now or start
        self.sim.now = s + dur
        return s, s + dur


def _low_precision(kernel):
    """Compute in float16 and cast back: what a chip with a half-precision-only unit returns."""

    def run(*args, **kwargs):
        args = [a.astype(np.float16) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
        out = kernel(*args, **kwargs)
        return out.astype(np.float32) if isinstance(out, np.ndarray) and out.dtype == np.float16 else out
    return run


class SimBackend(numpy_backend.NumpyBackend):
    def prepare(self, node, kernel):
        kernel = super().prepare(node, kernel)
        if node.op in self.description.low_precision:
            kernel = _low_precision(kernel)
        return kernel


def create(desc: Description) -> SimBackend:
    backend = SimBackend(name=f"sim:{desc.name}", description=desc, ops=None, memory=numpy_backend.NumpyMemory(),
                         device=f"sim:{desc.name}", clock=SimClock(desc))
    backend.ops = OperatorRegistry(lambda node: numpy_backend.numpy_kernel(node, backend),
                                                 supported=desc.supported, unsupported=desc.unsupported,
                                                 dtypes=set(desc.peak_flops) | {"int64", "int32", "bool"} if desc.peak_flops else None)
    return backend
