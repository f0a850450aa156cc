"""tsregions: each region opscope's placement gives it is traced and frozen by TorchScript.

This module is what the entry point names: the declaration, light (opscope reads it to list backends);
the stack itself (program.py) is imported by create()."""
kind, clock = "regions", "host"
options = {"freeze": {"type": bool, "default": True, "help": "torch.jit.freeze each traced region"},
           "threads": {"type": int, "default": 1, "help": "torch intra-op threads while a region runs"}}


def available(description):
    return True, ""


def create(description):
    from opscope.runtime.plugin import Backend, Claim, HostMemory, StackRegistry
    from .program import Program
    ops = StackRegistry(Claim(), lambda region: Program(region, description.options),
                        unsupported=description.unsupported, supported=description.supported)
    return Backend(name="tsregions", description=description, ops=ops, memory=HostMemory(), device="tsregions:cpu")
