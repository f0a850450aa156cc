"""Per-op numerics inside a compiler stack's region: every member's value as the stack computed it.

    values = intermediates(backend, program, inputs)   # slot -> host array, for every member output it returns
    wide = widened(program.region)                     # the same region with every member's output an output

A region runs as one program, so its members' values never leave the stack. To see them, the stack
compiles the region a second time with each member's tensor output as a program output: an ONNX model
whose graph outputs include the members' tensors (a second InferenceSession), an OpenVINO model with a
Result per member output, a second jitted XLA function of the same lowering returning them all. One
piece of code does that for every stack, through the stack's own `compile` (StackRegistry.kernel_for),
so a backend module adds nothing; a program may still offer a cheaper `intermediates(*inputs)` of its own.

NOTE: a stack does not fuse across a program output, so the second program's inner values are those of
the region compiled without the fusions that cross them; the region's outputs are compared as the real
program made them (the lockstep takes them from the run itself).

The comparison with the reference, member by member, is the lockstep's (debugger/lockstep.py): the
same per-op errors, origin and attribution as for ops placed one by one.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .regions import Region, RegionProgram, region_node


def widened(region: Region) -> Region:
    """The region with every member's tensor output (and the region's own outputs) as an output."""
    outs = list(region.outputs)
    for m in region.members:
        for s, meta in zip(m.outputs, m.output_meta):
            if meta is not None and s not in outs:
                outs.append(s)
    return replace(region, name=region.name + "_members", outputs=outs)


def intermediates(backend, program: RegionProgram, inputs) -> dict[int, np.ndarray]:
    """Every member output the stack returns for these inputs, on the host. Raises what the stack raised
    when it cannot compile the widened region (the caller says so and compares the region's outputs only)."""
    own = getattr(program, "intermediates", None)
    if own is not None:
        return {s: np.asarray(v) for s, v in own(*inputs).items()}
    wide = getattr(program, "_members_program", None)
    if wide is None:                    # compiled once per program, on first request (debugger, diff)
        wide = backend.ops.kernel_for(region_node(widened(program.region), backend.name))
        program._members_program = wide
    outs = wide(*inputs)
    return {s: np.asarray(backend.memory.to_host(v)) for s, v in zip(wide.region.outputs, outs)}
