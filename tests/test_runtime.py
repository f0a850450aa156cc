"""The runtime in process: demos on every backend, fallback placement, @operator, memory, hooks."""
import numpy as np
import pytest
import torch

from opscope.runtime import OPS, open_session, operator
from opscope.runtime.conformance import check
from opscope.runtime.backends import resolve
from opscope.runtime.session import compare

BACKENDS = ["numpy", "torch:cpu", "sim:npu-a1"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model", ["demo:mlp", "demo:cnn", pytest.param("demo:gpt", marks=pytest.mark.slow)])
def test_demo_matches_eager(model, backend):
    s = open_session(model, backend)
    err = compare(s.run_host(), s.eager())
    assert err["max_abs"] <= 1e-4, err


def _described(tmp_path, unsupported):
    p = tmp_path / "chip.toml"
    p.write_text(f"""
[backend]
name = "test-chip"
implementation = "sim"
fallback = "numpy"
[hardware]
peak_flops = {{ float32 = 1.0e13 }}
memory_bandwidth = 1.0e12
[operators]
unsupported = {unsupported!r}
""".replace("'", '"'))
    return str(p)


def test_unsupported_ops_fall_back_for_exactly_those_ops(tmp_path):
    spec = _described(tmp_path, ["gelu", "layer_norm"])
    s = open_session("demo:gpt", spec)
    rep = s.plan.placement.report()
    assert sorted(f["op"] for f in rep["fallback_ops"]) == ["gelu", "layer_norm"]
    for st in s.plan.steps:
        if st.node.op == "transfer":
            continue
        want = "numpy" if st.node.op in ("gelu", "layer_norm") else s.backend.name
        assert st.backend.name == want, (st.node.name, st.backend.name)
    assert rep["transfers"] > 0 and rep["transfer_bytes"] > 0
    assert compare(s.run_host(), s.eager())["max_abs"] <= 1e-4


def test_conformance_shows_described_unsupported_ops_as_unsupported(tmp_path):
    b = resolve(_described(tmp_path, ["gelu", "layer_norm"]), with_fallback=False)
    cells = {(c.op, c.dtype): c for c in check(b, ops=["gelu", "layer_norm", "add"], dtypes=("float32",)).cells}
    assert cells[("gelu", "float32")].status == "unsupported"
    assert "unsupported" in cells[("gelu", "float32")].message
    assert cells[("layer_norm", "float32")].status == "unsupported"
    assert cells[("add", "float32")].status == "pass"
    assert "gelu" not in b.ops.ops()


@operator
def swiglu_t(x, w_gate, w_up):
    return torch.nn.functional.silu(x @ w_gate) * (x @ w_up)


def _leaky_ref(x):
    return np.where(x > 0, x, 0.1 * x).astype(x.dtype)


@operator(reference=_leaky_ref)
def leaky_t(x):
    return torch.where(x > 0, x, 0.1 * x)


class _UserOpModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wg = torch.nn.Parameter(torch.randn(8, 16))
        self.wu = torch.nn.Parameter(torch.randn(8, 16))

    def forward(self, x):
        return leaky_t(swiglu_t(x, self.wg, self.wu)).sum(-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_operators_run_on_every_backend(backend):
    torch.manual_seed(0)
    model, x = _UserOpModel().eval(), torch.randn(4, 8)
    s = open_session("user-ops", backend, model=model, inputs=(x,))
    ops = [n.op for n in s.graph.nodes]
    assert "swiglu_t" in ops and "leaky_t" in ops          # captured as one node each
    assert OPS["swiglu_t"].composite is not None and OPS["leaky_t"].numpy is _leaky_ref
    assert all(st.backend.name == s.backend.name for st in s.plan.steps)   # no fallback needed
    assert compare(s.run_host(), s.eager())["max_abs"] <= 1e-4


class _Recorder:
    def __init__(self):
        self.calls = []
        self.runs = []

    def on_run_start(self, info):
        self.runs.append(info.step)

    def after_op(self, call):
        self.calls.append((call.node.op, call.backend.name, call.live_bytes, call.end_ns >= call.start_ns))


@pytest.mark.parametrize("backend", ["numpy", "torch:cpu"])
def test_memory_live_and_peak_bytes_reported(backend):
    s = open_session("demo:mlp", backend)
    rec = _Recorder()
    with s.executor.hooked(rec):
        hooked = s.run_host()
    assert compare(hooked, s.run_host())["max_abs"] == 0.0      # hooks do not change results
    live = [c[2] for c in rec.calls]
    assert len(rec.calls) == len(s.plan.steps) and all(c[3] for c in rec.calls)
    assert max(live) == s.plan.peak_bytes > 0
    # 32x512 float32 activations are alive at the peak, at least
    assert s.plan.peak_bytes >= 32 * 512 * 4
    assert s.plan.constant_bytes == sum(p.numel() * 4 for p in s.model.parameters())


def test_sim_clock_reports_roofline_time():
    from opscope.runtime.roofline import node_seconds
    s = open_session("demo:mlp", "sim:npu-a1")
    rec = []

    class Hook:
        def after_op(self, call):
            rec.append((call.end_ns - call.start_ns, node_seconds(call.node, call.backend.description)))

    with s.executor.hooked(Hook()):
        s.run()
    assert rec and all(abs(ns - int(sec * 1e9)) <= 1 for ns, sec in rec)


def test_op_failure_names_op_and_node():
    from opscope.runtime.executor import OpFailed
    s = open_session("demo:mlp", "numpy")
    st = next(st for st in s.plan.steps if st.node.op == "relu")

    def broken(*a, **k):
        raise ValueError("boom")
    st.kernel = broken
    with pytest.raises(OpFailed, match=r"op relu \(node .*\) failed on numpy: ValueError: boom"):
        s.run()


def test_dtype_names_include_bfloat16_which_numpy_cannot_parse():
    """`opscope tune` on a bfloat16-capable chip and `advise --apply` pass the name 'bfloat16' around."""
    import torch
    from opscope.runtime import dtypes
    assert dtypes.name_of("bfloat16") == "bfloat16" and dtypes.to_torch("bfloat16") is torch.bfloat16
    assert dtypes.name_of(torch.bfloat16) == "bfloat16" and dtypes.name_of("float32") == "float32"
    assert dtypes.to_numpy("bfloat16") == np.dtype("float32")
