"""pennylane: opscope's quantum operators (quantum_expval and its parameter-shift gradients) on a PennyLane device.

The declaration opscope reads to list backends; the kernels (kernels.py, which imports PennyLane) load in create().
Every other op is refused, so placement sends it to the description's fallback (numpy).
"""
from pathlib import Path

kind, clock = "ops", "host"
summary = "quantum circuits on PennyLane's simulators; everything else on the fallback"
usage = "pennylane"
description_file = str(Path(__file__).with_name("pennylane.toml"))
options = {
    "device": {"type": str, "default": "default.qubit",
               "help": "the PennyLane device that runs each circuit (default.qubit, lightning.qubit, ...)"},
    "diff_method": {"type": str, "choices": ["parameter-shift", "adjoint", "backprop", "finite-diff"],
                    "default": "backprop", "help": "how PennyLane differentiates a circuit for training (backprop: one broadcast run; parameter-shift: two circuits per parameter and sample, as hardware measures)"},
}


def available(description):
    try:
        import pennylane  # noqa: F401
    except ImportError as e:
        return False, f"PennyLane is not installed ({e}): pip install pennylane"
    return True, ""


def create(description):
    from opscope.runtime.plugin import Backend, HostMemory, OperatorRegistry

    from .kernels import KERNELS, Circuits
    circuits = Circuits(description.options["device"], description.options["diff_method"])
    ops = OperatorRegistry(lambda node: None, supported=set(KERNELS), unsupported=description.unsupported)
    for name, make in KERNELS.items():
        ops.register(name, make(circuits))
    return Backend(name="pennylane", description=description, ops=ops, memory=HostMemory(),
                   device=f"pennylane:{description.options['device']}")
