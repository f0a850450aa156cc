"""plugins/opscope-quantum: opscope's quantum op on PennyLane, a backend package built only on the public plugin API
(opscope.runtime.plugin) and found by its `opscope.backends` entry point -- installed by .ci/run with pip.

A hybrid model (classical layers + a 4-qubit circuit): the same values on numpy and on the plugin, three training
steps like eager PyTorch, the circuit on the timeline of a profiled run and at a debugger breakpoint."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import skip_unless_installed
from opscope.runtime import open_session, registry
from opscope.runtime.ops.quantum import _numpy_grad_input, _numpy_grad_weights
from opscope.runtime.session import compare
from opscope.runtime.train import OptimizerSpec, compare_with_eager

skip_unless_installed("pennylane")    # imported by the tests that use it (seconds at collection)
if registry.get("pennylane") is None:
    pytest.skip("plugins/opscope-quantum is not installed: pip install -e plugins/opscope-quantum",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "quantum_hybrid.py"
PLUGIN = ROOT / "plugins" / "opscope-quantum"


def _example():
    import importlib.util
    spec = importlib.util.spec_from_file_location("quantum_hybrid_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_plugin_is_registered_by_its_entry_point_and_uses_only_the_public_api():
    e = registry.get("pennylane")
    assert not e.builtin and e.dist == "opscope-quantum" and e.kind == "ops" and not e.problem
    assert {"device", "diff_method"} <= e.options.keys()
    for path in (PLUGIN / "opscope_quantum").glob("*.py"):
        for line in path.read_text().splitlines():
            if "opscope." in line and "import" in line:
                assert "opscope.runtime.plugin" in line, f"{path.name}: {line.strip()}"


def test_numpy_and_the_plugin_give_the_same_values():
    model, inputs = _example().factory()
    model.eval()
    outs = {}
    for spec in ("numpy", "pennylane"):
        s = open_session(f"hybrid-{spec}", spec, model=model, inputs=inputs)
        circuit = [st for st in s.plan.steps if st.node.op == "quantum_expval"]
        assert len(circuit) == 1 and circuit[0].backend.name == spec      # the circuit runs on the plugin
        outs[spec] = s.run_host()
        assert compare(outs[spec], s.eager())["max_abs"] <= 1e-6
    assert compare(outs["pennylane"], outs["numpy"])["max_abs"] <= 1e-6


@pytest.mark.parametrize("diff_method", ["backprop", "parameter-shift"])
def test_pennylanes_own_gradients_equal_opscopes_parameter_shift(diff_method):
    from opscope_quantum.kernels import Circuits
    g = torch.Generator().manual_seed(3)
    x, w = torch.rand(3, 3, generator=g).double() * 6, torch.rand(2, 3, 2, generator=g).double() * 6
    grad = torch.randn(3, 3, generator=g).double()
    gx, gw = Circuits("default.qubit", diff_method).vjp(grad.numpy(), x.numpy(), w.numpy())
    np.testing.assert_allclose(gx.numpy(), _numpy_grad_input(grad.numpy(), x.numpy(), w.numpy()), atol=1e-9)
    np.testing.assert_allclose(gw.numpy(), _numpy_grad_weights(grad.numpy(), x.numpy(), w.numpy()), atol=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_hybrid_model_trains_on_the_plugin_like_eager(optimizer):
    r = compare_with_eager(f"{EXAMPLE}:train_factory", "pennylane", steps=3,
                           optimizer=OptimizerSpec(optimizer, lr=0.05 if optimizer == "sgd" else 0.01))
    for a, e in zip(r["losses"], r["eager_losses"]):
        assert abs(a - e) <= 1e-4 * max(1.0, abs(e))
    assert r["parameter_error"]["max_abs"] <= 1e-4 and r["losses"][-1] < r["losses"][0]


def test_the_circuit_stops_at_a_debugger_breakpoint_with_its_values():
    from opscope.debugger.controller import Controller, Stop
    model, inputs = _example().factory()
    s = open_session("hybrid-debug", "pennylane", model=model.eval(), inputs=inputs)
    c = Controller(s, breakpoints=["quantum_expval"])
    try:
        c.cont()
        ev = c.wait()
        assert isinstance(ev, Stop) and ev.node.op == "quantum_expval"
        values = np.asarray(ev.outputs[0][1])
        assert values.shape == (16, 4) and np.all(np.abs(values) <= 1 + 1e-6)     # <Z> lies in [-1, 1]
    finally:
        c.quit()


@pytest.mark.multiprocess
def test_the_circuit_is_on_the_timeline_of_a_profiled_run(opscope_home):
    r = subprocess.run([sys.executable, "-m", "opscope.app", "profile", f"{EXAMPLE}:factory", "-b", "pennylane",
                        "--steps", "2", "--json"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    run_id = json.loads(r.stdout)["run_id"]
    from opscope.profiler.store import RunStore
    rows = RunStore().query("SELECT op, backend, count(*), min(end_ns - start_ns) FROM events WHERE run_id = ? "
                            "AND op = 'quantum_expval' GROUP BY op, backend", [run_id])
    assert [(op, backend, n) for op, backend, n, _ in rows] == [("quantum_expval", "pennylane", 2)]
    assert rows[0][3] > 0
