"""iree: each region opscope's placement gives it is lowered torch -> MLIR (iree-turbine's AOT export) and
compiled by IREE; the program runs on IREE's runtime.

    opscope run demo:gpt -b iree                 # llvm-cpu, local-task driver
    opscope run demo:gpt -b iree:local-sync      # another runtime driver

The declaration opscope reads to list backends; the stack (program.py, which imports IREE) loads in create().
"""
from pathlib import Path

kind, clock = "regions", "host"
summary = "regions lowered torch -> MLIR and compiled by IREE; everything else on the fallback"
usage = "iree[:DRIVER]"
description_file = str(Path(__file__).with_name("iree.toml"))
# the runtime driver a target's programs run on when `device` is left at the CPU's
DRIVERS = {"llvm-cpu": "local-task", "cuda": "cuda", "rocm": "hip", "vulkan-spirv": "vulkan"}
options = {
    "target": {"type": str, "choices": list(DRIVERS), "default": "llvm-cpu",
               "help": "IREE's compile target (iree-hal-target-backends)"},
    "device": {"type": str, "default": "local-task",
               "help": "IREE's runtime driver (local-task, local-sync, cuda, hip, vulkan)"},
    "threads": {"type": int, "default": 1, "help": "worker threads of the local-task driver"},
}


def available(description):
    try:
        import iree.compiler  # noqa: F401
        import iree.runtime  # noqa: F401
        import iree.turbine.aot  # noqa: F401
    except ImportError as e:
        return False, f"IREE is not installed ({e}): pip install iree-base-compiler iree-base-runtime iree-turbine"
    return True, ""


def create(description):
    from opscope.runtime.plugin import Backend, Claim, HostMemory, StackRegistry

    from .program import compile_region, load_region, version
    opts = description.options
    ops = StackRegistry(Claim(), lambda region: compile_region(region, opts),
                        load=lambda region, blob: load_region(region, blob, opts),
                        unsupported=description.unsupported, supported=description.supported,
                        version=version(), stack="iree")
    return Backend(name="iree", description=description, ops=ops, memory=HostMemory(),
                   device=f"iree:{opts['device']}")
