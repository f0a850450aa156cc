"""The opscope graph: what capture produces and every backend runs.

A Graph is a flat list of Nodes in execution order. Values live in numbered slots; a Node
reads slots through `Ref`s embedded in its args and writes its outputs to `outputs` slots.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .dtypes import ITEMSIZE


@dataclass(frozen=True)
class Ref:
    """A reference to a value slot inside a node's args."""

    slot: int


@dataclass
class TensorMeta:
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE.get(self.dtype, 4)


@dataclass
class Node:
    """One operator call: `op` is the opscope op name (`linear`), `target` the captured ATen overload."""

    index: int
    name: str
    op: str
    target: Any
    args: tuple
    kwargs: dict
    inputs: list[int]                 # slots read (flattened, in arg order)
    outputs: list[int]                # slots written
    input_meta: list[TensorMeta]
    output_meta: list[TensorMeta | None]
    attrs: dict = field(default_factory=dict)   # non-tensor arguments by schema name
    module_path: str = ""
    module_type: str = ""
    source: str = ""                  # "file.py:123"
    source_line: str = ""             # the code on that line
    multi_output: bool = False        # the kernel returns a tuple/list spread over `outputs`

    @property
    def flops(self) -> int:
        from .ops import flops_of
        return flops_of(self)

    @property
    def bytes_moved(self) -> int:
        from .ops import bytes_of
        return bytes_of(self)


def materialize(a, env):
    """`a` with every Ref replaced by its slot's value in `env` (lists and tuples walked): how an op's
    arguments become values, in the executor and in a region's exported module alike."""
    if isinstance(a, Ref):
        return env[a.slot]
    if isinstance(a, (list, tuple)):
        return type(a)(materialize(x, env) for x in a)
    return a


@dataclass
class Graph:
    nodes: list[Node]
    num_slots: int
    input_slots: list[int]            # user inputs, in call order
    constant_slots: dict[int, Any]    # slot -> host tensor (parameters, buffers, constants)
    output_refs: list                 # pytree of Ref / constants, as the model returns
    slot_meta: dict[int, TensorMeta]
    model_name: str = ""

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts
