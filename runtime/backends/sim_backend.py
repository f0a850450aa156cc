"""sim:<name>: a described chip that does not exist yet.

Kernels compute with numpy, so results are real; the clock reports the roofline estimate
from the description (max of FLOPs/peak and bytes/bandwidth, plus launch overhead). A vendor
can describe a chip before it has software, and the advisor can ask what-if questions.
"""
from __future__ import annotations

import time

import numpy as np

from ..description import Description
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


class FollowClock(HostClock):
    """The fallback's clock on a sim plan: real host durations, placed on the sim timeline so
    the fallback ops sit between the simulated ops instead of on another time base."""

    def __init__(self, sim: SimClock):
        self.sim = sim

    def start(self, node):
        return time.perf_counter_ns()

    def stop(self, node, start):
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
