"""StackRegistry: a stack's claim and compile as the OperatorRegistry placement asks (see regions.py).

Apart from regions.py because it runs the region value check (region_check.py), which builds on regions:
in one module the two imported each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .graph import Node
from .regions import Region, RegionProgram, single


class StackRegistry:
    """The OperatorRegistry of a stack backend: `claim` answers for plain nodes, a region node is always
    its own, and `kernel_for` compiles (a plain node becomes a region of one: `backend check` runs that)."""

    reference_kernels = False

    def __init__(self, claim: Callable[[Node], bool | str], compile: Callable[[Region], RegionProgram], *,
                 unsupported=(), supported=None, load: Callable[[Region, bytes], RegionProgram] | None = None,
                 version: str = "", stack: str = "the stack", tolerance: float | None = None):
        self._claim, self._compile, self._load = claim, compile, load
        self.stack = stack                # its name in messages (onnxruntime, openvino, xla)
        self.tolerance = tolerance        # each compiled region's values checked against ATen's (None: not checked)
        self.unsupported = set(unsupported)
        self.supported = set(supported) if supported is not None else None
        self.dtypes = None
        self.version = version            # the stack's own version: a plan's saved programs are for this one
        self.saved: dict[str, SavedRegion] = {}     # region name -> a plan's program for it (bind_plan sets it)
        # node name -> the stack's reason: members it failed inside a region (partition.py), for the placement
        # under way; `remembered`: a plan's, handed to the next placement (plan_regions.arm)
        self.refused: dict[str, str] = {}
        self.remembered: dict[str, str] = {}

    def supports(self, node: Node) -> bool | str:
        if node.op == "region":
            return True
        if node.name in self.refused:
            return self.refused[node.name]
        if node.op in self.unsupported:
            return f"{node.op} is marked unsupported in the description"
        if self.supported is not None and node.op not in self.supported:
            return f"{node.op} is not in the description's supported list"
        return self._claim(node)

    def program(self, region: Region, *, saved: bool = True) -> RegionProgram:
        """The region compiled: a plan's saved program for it when one fits, else the stack's compile."""
        blob = self.saved.get(region.name) if saved else None
        if blob is not None and self._load is not None and blob.fits(region):
            del self.saved[region.name]       # (a bisection's prefix may share the name: it does not fit)
            program = _real_tensors(self._load, region, blob.blob)
            program.from_plan = True
            return program
        return _real_tensors(self._checked, region)   # none saved, or the weights changed since: compiled again

    def _checked(self, region: Region) -> RegionProgram:
        """The stack's compile, then (with a tolerance) the program's values against ATen's on sample inputs:
        once per compile, never on a call."""
        program = self._compile(region)
        if self.tolerance is not None:
            from .region_check import check_values      # (imports torch: only once a stack compiles)
            check_values(self.stack, region, program, self._compile, tolerance=self.tolerance)
        return program

    def kernel_for(self, node: Node) -> Callable:
        if node.op == "region":           # placement compiled it already (partition.py); a region made elsewhere not
            region = node.attrs["region"]
            return region.program if region.program is not None else self.program(region)
        program = self.program(single(node), saved=False)

        def one(*args, **kwargs):          # a plain node's call: its Ref'd args, in order, are the inputs
            out = program(*[a for a in _flat(args) if a is not None])
            return out if node.multi_output or len(out) != 1 else out[0]
        return one

    def ops(self) -> list[str]:
        from .ops import OPS
        return sorted(n for n in OPS if n not in self.unsupported and n not in ("region", "transfer")
                      and (self.supported is None or n in self.supported))


@dataclass
class SavedRegion:
    """A region's compiled program from a plan, and what it was compiled from: the members (by name) and
    a digest of the constants the stack folded into it -- the model's weights, which a plan names but
    does not hold: a plan run with other weights of the same shapes compiles the region again."""

    blob: bytes
    members: list[str]
    constants: str

    def fits(self, region: Region) -> bool:
        return self.members == [m.name for m in region.members] and self.constants == constants_digest(region)


def constants_digest(region: Region) -> str:
    import hashlib

    import torch
    h = hashlib.sha256()
    for s in sorted(region.constants):
        v = region.constants[s]
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"{s}:{t.dtype}:{tuple(t.shape)}:".encode())
            h.update((t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes())
        else:
            h.update(f"{s}:{v!r}:".encode())
    return h.hexdigest()


def _real_tensors(fn, *args):
    """fn(*args) outside any fake-tensor mode: torch.compile calls a backend under its FakeTensorMode, in which
    an exporter's tracing (ONNX, OpenVINO) and a copy to the stack (XLA) would see fake tensors."""
    try:
        from torch._subclasses.fake_tensor import unset_fake_temporarily
    except ImportError:
        return fn(*args)
    with unset_fake_temporarily():
        return fn(*args)


def _flat(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _flat(a)
        elif hasattr(a, "shape"):
            yield a
