"""A hybrid quantum-classical classifier: classical layers around a 4-qubit parameterised circuit.

    opscope run examples/quantum_hybrid.py:factory -b numpy          # the circuit on the statevector reference
    opscope run examples/quantum_hybrid.py:factory -b pennylane      # on PennyLane's simulator (plugins/opscope-quantum)
    opscope train examples/quantum_hybrid.py:train_factory -b numpy --steps 3

The circuit is one op, `quantum_expval` (opscope.runtime.ops.quantum): placed, timed, stepped and compared like
any other; its gradients are the parameter-shift rule.
"""
import torch
from torch import nn

from opscope.runtime.ops.quantum import QuantumLayer

QUBITS, LAYERS, FEATURES, CLASSES, BATCH = 4, 2, 8, 2, 16


class HybridClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = nn.Linear(FEATURES, QUBITS)
        self.circuit = QuantumLayer(QUBITS, LAYERS, seed=0)
        self.head = nn.Linear(QUBITS, CLASSES)

    def forward(self, x, labels=None):
        angles = torch.pi * torch.tanh(self.encode(x))        # features -> rotation angles in (-pi, pi)
        logits = self.head(self.circuit(angles))
        if labels is None:
            return logits
        return nn.functional.cross_entropy(logits, labels)


def _data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, FEATURES, generator=g)
    labels = (x[:, 0] * x[:, 1] > 0).long()                   # a label no linear model gets right
    return x, labels


def factory():
    torch.manual_seed(0)
    x, _ = _data()
    return HybridClassifier(), (x,)


def train_factory():
    torch.manual_seed(0)
    return HybridClassifier(), _data()
