"""Quantum operators: the seed's reserved interface for quantum-classical hybrid models.

    from opscope.runtime.ops.quantum import QuantumLayer
    model = nn.Sequential(nn.Linear(16, 4), nn.Tanh(), QuantumLayer(qubits=4, layers=2), nn.Linear(4, 2))

`quantum_expval(x, weights)` is a parameterised circuit as one op: each sample's features are rotation angles
(RY(x_i) on qubit i, from |0...0>), then `layers` layers of RZ(w[l,i,0]) RY(w[l,i,1]) on every qubit and a ring of
CNOTs (i -> i+1), and the result is <Z_i> of every qubit, shape (batch, qubits). It is captured as one node like
any op, so it is placed, timed, stepped in the debugger and compared against the reference like the rest.

Reference kernels: a statevector simulator written once over an array module, run by numpy (the reference
backend) and by torch (eager, shapes on meta tensors). Gradients are the parameter-shift rule -- exact for these
gates, and what real quantum hardware can measure -- as two more ops, so a training graph holds them as nodes:
`quantum_expval_grad_input` and `quantum_expval_grad_weights`. A quantum SDK (PennyLane, Qiskit) plugs in as a
backend with its own kernels for these three op names (plugins/opscope-quantum).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..samples import F32_64, SAMPLES, F, Sample
from .user import operator

MAX_QUBITS = 16                     # a statevector of 2**16 amplitudes per sample: beyond it, a simulator's job
SHIFT = math.pi / 2


# --- the statevector simulator, written once for numpy and torch -------------------------------------------------

def expvals(xp, x, w):
    """<Z_i> for each sample: x (B, n) embedding angles, w (B, L, n, 2) per-sample layer angles -> (B, n).

    The state is kept as real and imaginary parts (no complex dtype: meta tensors and every backend take it);
    a gate on qubit q views the state as (B, 2**q, 2, 2**(n-q-1))."""
    batch, n = x.shape[0], x.shape[1]
    dim = 2 ** n
    zeros = xp.zeros((batch, dim), dtype=x.dtype) if xp is np else torch.zeros((batch, dim), dtype=x.dtype,
                                                                               device=x.device)
    re = _set_first(xp, zeros)
    im = zeros * 0
    for q in range(n):
        re, im = _ry(xp, re, im, x[:, q], q, n)
    for layer in range(w.shape[1]):
        for q in range(n):
            re, im = _rz(xp, re, im, w[:, layer, q, 0], q, n)
            re, im = _ry(xp, re, im, w[:, layer, q, 1], q, n)
        for q in range(n - 1 if n < 3 else n):
            re, im = _cnot(xp, re, im, q, (q + 1) % n, n)
    prob = re * re + im * im
    out = []
    for q in range(n):
        p = prob.reshape(batch, 2 ** q, 2, dim // 2 ** (q + 1))
        out.append(p[:, :, 0, :].sum(axis=(1, 2)) if xp is np else p[:, :, 0, :].sum(dim=(1, 2)))
        out[-1] = out[-1] - (p[:, :, 1, :].sum(axis=(1, 2)) if xp is np else p[:, :, 1, :].sum(dim=(1, 2)))
    return xp.stack(out, axis=1) if xp is np else torch.stack(out, dim=1)


def _set_first(xp, zeros):
    """|0...0>: amplitude 1 at index 0, written without in-place assignment (fake tensors, autograd)."""
    one = xp.zeros_like(zeros[:, :1]) + 1 if xp is np else torch.ones_like(zeros[:, :1])
    return xp.concatenate([one, zeros[:, 1:]], axis=1) if xp is np else torch.cat([one, zeros[:, 1:]], dim=1)


def _halves(a, q, n):
    v = a.reshape(a.shape[0], 2 ** q, 2, 2 ** (n - q - 1))
    return v[:, :, 0, :], v[:, :, 1, :]


def _join(xp, a0, a1, shape):
    s = xp.stack([a0, a1], axis=2) if xp is np else torch.stack([a0, a1], dim=2)
    return s.reshape(shape)


def _angle(theta):
    return theta.reshape(-1, 1, 1) / 2


def _ry(xp, re, im, theta, q, n):
    c, s = xp.cos(_angle(theta)), xp.sin(_angle(theta))
    (r0, r1), (i0, i1) = _halves(re, q, n), _halves(im, q, n)
    return (_join(xp, c * r0 - s * r1, s * r0 + c * r1, re.shape),
            _join(xp, c * i0 - s * i1, s * i0 + c * i1, im.shape))


def _rz(xp, re, im, phi, q, n):
    c, s = xp.cos(_angle(phi)), xp.sin(_angle(phi))
    (r0, r1), (i0, i1) = _halves(re, q, n), _halves(im, q, n)
    # |0> gets e^{-i phi/2}, |1> gets e^{+i phi/2}
    return (_join(xp, r0 * c + i0 * s, r1 * c - i1 * s, re.shape),
            _join(xp, i0 * c - r0 * s, i1 * c + r1 * s, im.shape))


def _cnot(xp, re, im, control, target, n):
    """Flip `target` where `control` is 1: a permutation of amplitudes."""
    def flip(a):
        v = a.reshape((a.shape[0],) + (2,) * n)
        c0 = v[(slice(None),) + (slice(None),) * control + (0,)]
        c1 = v[(slice(None),) + (slice(None),) * control + (1,)]
        t = target - 1 if target > control else target          # the target's axis once control's is taken out
        c1 = xp.flip(c1, axis=1 + t) if xp is np else torch.flip(c1, dims=(1 + t,))
        return (xp.stack([c0, c1], axis=1 + control) if xp is np else torch.stack([c0, c1], dim=1 + control)).reshape(
            a.shape)
    return flip(re), flip(im)


def _check(x, w):
    if x.ndim != 2 or w.ndim != 3 or w.shape[-1] != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"quantum_expval takes x (batch, qubits) and weights (layers, qubits, 2); got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    if x.shape[1] > MAX_QUBITS:
        raise ValueError(f"quantum_expval simulates at most {MAX_QUBITS} qubits (got {x.shape[1]})")


def _per_sample(xp, w, batch):
    return np.broadcast_to(w, (batch, *w.shape)) if xp is np else w.unsqueeze(0).expand(batch, *w.shape)


# --- parameter shift: exact gradients of rotation gates, as real hardware measures them -------------------------

def grad_input(xp, g, x, w):
    """d(sum g * <Z>)/dx: two circuits per feature, shifted by +-pi/2, all in one batch."""
    batch, n = x.shape
    shifts = (xp.eye(n, dtype=x.dtype) if xp is np else torch.eye(n, dtype=x.dtype, device=x.device)) * SHIFT
    plus = (x[None, :, :] + shifts[:, None, :]).reshape(n * batch, n)
    minus = (x[None, :, :] - shifts[:, None, :]).reshape(n * batch, n)
    both = xp.concatenate([plus, minus]) if xp is np else torch.cat([plus, minus])
    wb = _per_sample(xp, w, 2 * n * batch)
    e = expvals(xp, both, wb).reshape(2, n, batch, n)
    d = (e[0] - e[1]) / 2                                 # (feature, batch, qubit)
    return (d * g[None, :, :]).sum(axis=2).T if xp is np else (d * g[None, :, :]).sum(dim=2).T


def grad_weights(xp, g, x, w):
    """d(sum g * <Z>)/dw: two circuits per weight for every sample, all in one batch."""
    batch, n = x.shape
    p = w.size if xp is np else w.numel()
    eye = (xp.eye(p, dtype=w.dtype) if xp is np else torch.eye(p, dtype=w.dtype, device=w.device)) * SHIFT
    shifted = w.reshape(1, p) + xp.concatenate([eye, -eye]) if xp is np else w.reshape(1, p) + torch.cat([eye, -eye])
    wb = shifted.reshape(2 * p, 1, *w.shape)
    wb = np.broadcast_to(wb, (2 * p, batch, *w.shape)) if xp is np else wb.expand(2 * p, batch, *w.shape)
    xb = np.broadcast_to(x, (2 * p, batch, n)) if xp is np else x.unsqueeze(0).expand(2 * p, batch, n)
    e = expvals(xp, xb.reshape(2 * p * batch, n), wb.reshape(2 * p * batch, *w.shape)).reshape(2, p, batch, n)
    d = (e[0] - e[1]) / 2                                 # (weight, batch, qubit)
    out = (d * g[None]).sum(axis=(1, 2)) if xp is np else (d * g[None]).sum(dim=(1, 2))
    return out.reshape(w.shape)


# --- cost: gates times amplitudes, the work a statevector simulator does --------------------------------------

def _gates(n: int, layers: int) -> int:
    return n + layers * (2 * n + (n - 1 if n < 3 else n))


def circuit_flops(batch: int, n: int, layers: int) -> int:
    """About 8 FLOPs per amplitude per gate (a 2x2 real-and-imaginary update), plus the measurement."""
    return batch * (2 ** n) * (8 * _gates(n, layers) + 3 * n)


def _flops(node, circuits_per_sample=lambda n, p: 1):
    x, w = node.input_meta[-2], node.input_meta[-1]
    batch, n, layers = x.shape[0], x.shape[1], w.shape[0]
    params = layers * n * 2
    return circuit_flops(batch, n, layers) * circuits_per_sample(n, params)


# --- the ops --------------------------------------------------------------------------------------------------

def _numpy_expval(x, w):
    _check(x, w)
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    return expvals(np, x64, _per_sample(np, w64, x64.shape[0])).astype(np.asarray(x).dtype)


def _numpy_grad_input(g, x, w):
    return grad_input(np, np.asarray(g, np.float64), np.asarray(x, np.float64),
                      np.asarray(w, np.float64)).astype(np.asarray(x).dtype)


def _numpy_grad_weights(g, x, w):
    return grad_weights(np, np.asarray(g, np.float64), np.asarray(x, np.float64),
                        np.asarray(w, np.float64)).astype(np.asarray(w).dtype)


@operator(name="quantum_expval_grad_input", reference=_numpy_grad_input, kind="quantum",
          flops=lambda node: _flops(node, lambda n, p: 2 * n))
def quantum_expval_grad_input(grad, x, weights):
    """Parameter-shift gradient of quantum_expval with respect to its input angles."""
    return grad_input(torch, grad, x, weights)


@operator(name="quantum_expval_grad_weights", reference=_numpy_grad_weights, kind="quantum",
          flops=lambda node: _flops(node, lambda n, p: 2 * p))
def quantum_expval_grad_weights(grad, x, weights):
    """Parameter-shift gradient of quantum_expval with respect to its circuit's weights."""
    return grad_weights(torch, grad, x, weights)


@operator(name="quantum_expval", reference=_numpy_expval, flops=_flops, kind="quantum")
def quantum_expval(x, weights):
    """<Z_i> of every qubit after angle-embedding x and `layers` layers of RZ RY rotations and a CNOT ring."""
    _check(x, weights)
    return expvals(torch, x, _per_sample(torch, weights, x.shape[0]))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad):
    x, w = ctx.saved_tensors
    return (quantum_expval_grad_input(grad, x, w) if ctx.needs_input_grad[0] else None,
            quantum_expval_grad_weights(grad, x, w) if ctx.needs_input_grad[1] else None)


quantum_expval.register_autograd(_backward, setup_context=_setup)


# conformance samples: float32/float64 (the statevector is float64 inside; half precision is not a circuit's)
_Q = torch.ops.opscope
_CIRCUITS = [((3, 2), (2, 2, 2)), ((2, 4), (1, 4, 2)), ((4, 1), (0, 1, 2)), ((1, 3), (3, 3, 2))]
SAMPLES["quantum_expval"] = Sample(_Q.quantum_expval.default,
                                   [(F(*x, lo=-3.0, hi=3.0), F(*w, lo=-3.0, hi=3.0)) for x, w in _CIRCUITS],
                                   dtypes=F32_64)
for _name in ("quantum_expval_grad_input", "quantum_expval_grad_weights"):
    SAMPLES[_name] = Sample(getattr(_Q, _name).default,
                            [(F(*x), F(*x, lo=-3.0, hi=3.0), F(*w, lo=-3.0, hi=3.0)) for x, w in _CIRCUITS],
                            dtypes=F32_64)


class QuantumLayer(torch.nn.Module):
    """A parameterised circuit as a layer: (batch, qubits) angles -> (batch, qubits) expectation values in [-1, 1]."""

    def __init__(self, qubits: int, layers: int = 1, seed: int | None = None):
        super().__init__()
        if not 1 <= qubits <= MAX_QUBITS or layers < 0:
            raise ValueError(f"QuantumLayer: 1..{MAX_QUBITS} qubits and layers >= 0 (got {qubits}, {layers})")
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        self.weights = torch.nn.Parameter(torch.rand(layers, qubits, 2, generator=gen) * 2 * math.pi)

    def forward(self, x):
        return quantum_expval(x, self.weights)
