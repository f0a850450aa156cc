"""Quantum operators (the seed's reserved interface): `quantum_expval`, a parameterised circuit as one op, with a
statevector reference kernel in numpy and parameter-shift gradients as ops of their own.

Checked against things opscope did not write: PennyLane's default.qubit for the circuit's values, torch autograd
through the simulator for the parameter-shift gradients, and eager PyTorch for runs and training steps."""
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from opscope.runtime import OPS, open_session
from opscope.runtime.ops.quantum import (QuantumLayer, _numpy_expval, _numpy_grad_input, _numpy_grad_weights,
                                         expvals, grad_input, grad_weights, quantum_expval)
from opscope.runtime.session import compare
from opscope.runtime.train import OptimizerSpec, compare_with_eager

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quantum_hybrid.py"
SHAPES = [(1, 0), (1, 2), (2, 1), (3, 2), (4, 3), (5, 1)]        # (qubits, layers): CNOT ring from 3 qubits


def _angles(batch, n, layers, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(batch, n, generator=g, dtype=torch.float64) * 2 * math.pi,
            torch.rand(layers, n, 2, generator=g, dtype=torch.float64) * 2 * math.pi)


def _pennylane(x, w):
    qml = pytest.importorskip("pennylane")
    n, layers = x.shape[1], w.shape[0]
    dev = qml.device("default.qubit", wires=n)

    @qml.qnode(dev)
    def circuit(xi):
        for q in range(n):
            qml.RY(xi[q], wires=q)
        for layer in range(layers):
            for q in range(n):
                qml.RZ(w[layer, q, 0], wires=q)
                qml.RY(w[layer, q, 1], wires=q)
            for q in range(n if n >= 3 else n - 1):
                qml.CNOT(wires=[q, (q + 1) % n])
        return [qml.expval(qml.PauliZ(q)) for q in range(n)]
    return np.array([np.array(circuit(xi), dtype=np.float64).reshape(n) for xi in x])


@pytest.mark.parametrize("n,layers", SHAPES)
def test_the_reference_kernels_agree_with_pennylane(n, layers):
    x, w = _angles(3, n, layers)
    want = _pennylane(x.numpy(), w.numpy())
    assert np.abs(_numpy_expval(x.numpy(), w.numpy()) - want).max() < 1e-12
    assert np.abs(quantum_expval(x, w).numpy() - want).max() < 1e-12


@pytest.mark.parametrize("n,layers", SHAPES)
def test_parameter_shift_is_the_exact_gradient(n, layers):
    """Parameter shift (what the grad ops compute) against torch autograd through the same simulator."""
    x, w = _angles(4, n, layers, seed=1)
    g = torch.randn(4, n, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    gx, gw = torch.autograd.grad((expvals(torch, xr, wr.unsqueeze(0).expand(4, *w.shape)) * g).sum(), (xr, wr),
                                 allow_unused=True)
    gw = torch.zeros_like(w) if gw is None else gw
    close = lambda a, b: np.allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-12)    # noqa: E731 (empty w too)
    assert close(grad_input(torch, g, x, w), gx) and close(grad_weights(torch, g, x, w), gw)
    assert close(_numpy_grad_input(g.numpy(), x.numpy(), w.numpy()), gx)
    assert close(_numpy_grad_weights(g.numpy(), x.numpy(), w.numpy()), gw)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    (quantum_expval(xr, wr) * g).sum().backward()               # the custom op's registered backward
    assert close(xr.grad, gx) and close(wr.grad, gw)


def test_bad_shapes_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match=r"x \(batch, qubits\) and weights \(layers, qubits, 2\)"):
        quantum_expval(torch.zeros(2, 3), torch.zeros(1, 4, 2))
    with pytest.raises(ValueError, match="qubits and layers"):
        QuantumLayer(0)


def test_the_ops_are_registered_with_kernels_and_costs():
    for name in ("quantum_expval", "quantum_expval_grad_input", "quantum_expval_grad_weights"):
        assert OPS[name].numpy is not None and OPS[name].kind == "quantum" and OPS[name].flops is not None


def _model():
    import importlib.util
    spec = importlib.util.spec_from_file_location("quantum_hybrid_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_hybrid_model_runs_on_numpy_like_eager_with_the_circuit_as_one_node():
    model, inputs = _model().factory()
    s = open_session("quantum-hybrid", "numpy", model=model.eval(), inputs=inputs)
    ops = [n.op for n in s.graph.nodes]
    assert ops.count("quantum_expval") == 1
    assert all(st.backend.name == "numpy" for st in s.plan.steps)      # the reference runs it itself
    assert compare(s.run_host(), s.eager())["max_abs"] <= 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_hybrid_model_trains_on_numpy_like_eager(optimizer):
    """Three steps through the captured joint graph: the parameter-shift ops are nodes of the backward."""
    mod = _model()
    r = compare_with_eager(f"{EXAMPLE}:train_factory", "numpy", steps=3,
                           optimizer=OptimizerSpec(optimizer, lr=0.05 if optimizer == "sgd" else 0.01))
    for a, e in zip(r["losses"], r["eager_losses"]):
        assert abs(a - e) <= 1e-4 * max(1.0, abs(e))
    assert r["parameter_error"]["max_abs"] <= 1e-4
    assert r["losses"][-1] < r["losses"][0]
    assert mod.QUBITS == 4
