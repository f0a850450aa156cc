"""What a backend package imports: opscope's public plugin API, in one place (docs: "Add your stack").

    # acme_opscope/stack.py, registered in acme's pyproject.toml:
    #   [project.entry-points."opscope.backends"]
    #   acme = "acme_opscope.stack"
    kind, clock = "regions", "host"                    # runtime/registry.py: what the declaration says
    options = {"threads": {"type": int, "default": 1, "help": "intra-op threads"}}
    def available(description): return True, ""
    def create(description):
        return Backend(name="acme", description=description, memory=HostMemory(), device="acme:npu0",
                       ops=StackRegistry(Claim(), lambda region: AcmeProgram(region, description.options)))

A region stack compiles a Region (its members, inputs, outputs, constants) into a RegionProgram:
program(*numpy inputs) -> [numpy outputs]; its start_profile()/stop_profile() give per-member ChildEvents
(program.child(scope_name, kernel, start_ns, end_ns, clock)) on time.perf_counter_ns's clock, which the
profiler nests under the region. to_torch(region) is the region as a torch module (one submodule n<i> per
member), example_inputs(region) tensors of its input shapes. A host-timed stack's device string starts with
its registered name (`acme:npu0`): the profiler classes that track as host calls. A compile that fails raises
StackFailed(stack, region, error, why): the region is split there and the rest compiled again (partition.py).
"""
from __future__ import annotations

from .backends.numpy_backend import NumpyMemory as HostMemory
from .description import Description
from .errors import ModelError, UsageError
from .hdi import Backend, HostClock, MemoryManager, OperatorRegistry
from .partition import StackFailed
from .regions import ChildEvent, Claim, Region, RegionProgram, example_inputs, to_torch
from .stack_registry import StackRegistry

__all__ = ["Backend", "ChildEvent", "Claim", "Description", "HostClock", "HostMemory", "MemoryManager", "ModelError",
           "OperatorRegistry", "Region", "RegionProgram", "StackFailed", "StackRegistry", "UsageError", "example_inputs", "to_torch"]
