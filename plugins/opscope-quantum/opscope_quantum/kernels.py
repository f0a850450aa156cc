"""quantum_expval and its gradients as PennyLane circuits, batched over samples by parameter broadcasting.

The circuit is opscope's (runtime/ops/quantum.py): RY(x_i) per qubit, then per layer RZ(w[l,i,0]) RY(w[l,i,1]) and a
CNOT ring (a chain below 3 qubits), measuring <Z_i>. Gradients are PennyLane's own (its torch interface and the
configured diff_method), not opscope's parameter-shift ops: the two must agree, and the tests check they do.
"""
from __future__ import annotations

import numpy as np
import pennylane as qml
import torch


class Circuits:
    """One QNode per (qubits, layers), made on first use."""

    def __init__(self, device: str, diff_method: str):
        self.device, self.diff_method, self._nodes, self._last = device, diff_method, {}, None

    def node(self, n: int, layers: int):
        key = (n, layers)
        if key not in self._nodes:
            dev = qml.device(self.device, wires=n)

            @qml.qnode(dev, interface="torch", diff_method=self.diff_method)
            def circuit(x, w):
                for q in range(n):
                    qml.RY(x[..., q], wires=q)          # (B, n): broadcast over samples; (n,): one sample
                for layer in range(layers):
                    for q in range(n):
                        qml.RZ(w[layer, q, 0], wires=q)
                        qml.RY(w[layer, q, 1], wires=q)
                    for q in range(n if n >= 3 else n - 1):
                        qml.CNOT(wires=[q, (q + 1) % n])
                return [qml.expval(qml.PauliZ(q)) for q in range(n)]
            self._nodes[key] = circuit
        return self._nodes[key]

    def expvals(self, x, w):
        """<Z> of every qubit, (B, n) float64, all samples in one broadcast circuit."""
        x, w = torch.as_tensor(np.asarray(x, np.float64)), torch.as_tensor(np.asarray(w, np.float64))
        out = self.node(x.shape[1], w.shape[0])(x, w)
        return torch.stack([o.reshape(x.shape[0]) for o in out], dim=1)

    def vjp(self, g, x, w):
        """(d(sum g * <Z>)/dx, .../dw) by PennyLane's own differentiation. A training step asks for both halves
        with the same arguments (two ops), so the last answer is kept and the second half costs nothing."""
        key = tuple(np.ascontiguousarray(a).tobytes() + str(np.shape(a)).encode() for a in (g, x, w))
        if self._last is None or self._last[0] != key:
            self._last = (key, self._vjp(*(torch.as_tensor(np.asarray(a, np.float64)) for a in (g, x, w))))
        return self._last[1]

    def _vjp(self, g, x, w):
        circuit = self.node(x.shape[1], w.shape[0])
        wt = w.clone().requires_grad_()
        if self.diff_method == "backprop":          # differentiates the broadcast circuit: one run for all samples
            xt = x.clone().requires_grad_()
            values = torch.stack([o.reshape(x.shape[0]) for o in circuit(xt, wt)], dim=1)
            dx, dw = torch.autograd.grad((values * g).sum(), (xt, wt), allow_unused=True)
            return (dx if dx is not None else torch.zeros_like(x)), (dw if dw is not None else torch.zeros_like(w))
        # NOTE: PennyLane's parameter-shift does not differentiate broadcast parameters (its issue #4462): a sample
        # at a time, as hardware would run them
        gx, gw = torch.zeros_like(x), torch.zeros_like(w)
        for b in range(x.shape[0]):
            xb = x[b].clone().requires_grad_()
            values = torch.stack([o.reshape(()) for o in circuit(xb, wt)])
            dx, dw = torch.autograd.grad((values * g[b]).sum(), (xb, wt), allow_unused=True)
            gx[b] = dx if dx is not None else 0.0
            gw += dw if dw is not None else 0.0
        return gx, gw


def _expval(circuits):
    def run(x, w):
        with torch.no_grad():
            return circuits.expvals(x, w).numpy().astype(np.asarray(x).dtype)
    return run


def _grad(which: int):
    def make(circuits):
        def run(g, x, w):
            return circuits.vjp(g, x, w)[which].numpy().astype(np.asarray((x, w)[which]).dtype)
        return run
    return make


KERNELS = {"quantum_expval": _expval, "quantum_expval_grad_input": _grad(0), "quantum_expval_grad_weights": _grad(1)}
