"""capture.translate: one translation from FX graphs of ATen calls (torch.export's and AOTAutograd's)."""
import torch
from torch import nn

from opscope.runtime import backends
from opscope.runtime.capture import capture, module_path, op_name, translate
from opscope.runtime.executor import Executor, compile_plan


@torch.library.custom_op("capture_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.tanh(x) * scale


@scaled_tanh.register_fake
def _(x, scale):
    return torch.empty_like(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return (torch.softmax(self.norm(self.lin(x)), -1).sum(0),)


class WithCustomOp(nn.Module):
    def forward(self, x):
        return scaled_tanh(x, 2.0) + 1


def test_unmapped_ops_keep_their_namespace():
    assert op_name(torch.ops.aten.lstm.input) == "aten:lstm"
    assert op_name(torch.ops.capture_test.scaled_tanh.default) == "capture_test:scaled_tanh"
    g = capture(WithCustomOp(), (torch.randn(3, 4),))
    ops = [n.op for n in g.nodes]
    # regression: library custom ops were named aten:transformers... (issue 12)
    assert "capture_test:scaled_tanh" in ops and not any(o.startswith("aten:capture_test") for o in ops)


def test_dynamo_module_paths_read_like_named_modules():
    assert module_path("L['self']._modules['layers']._modules['0'].mlp") == "layers.0.mlp"
    assert module_path("L['self'].layers[1].self_attn.q_proj") == "layers.1.self_attn.q_proj"
    assert module_path("L['fn'].0") == "0"
    assert module_path("h.3.mlp") == "h.3.mlp"            # torch.export's paths pass unchanged


def _run_numpy(graph, *inputs):
    return Executor(compile_plan(graph, backends.resolve("numpy"))).run_host(*inputs)


def test_export_and_aot_graphs_translate_alike():
    torch.manual_seed(0)
    m, x = Net().eval(), torch.randn(4, 6)
    with torch.no_grad():
        (ref,) = m(x)
        ref = ref.numpy()
    exported = capture(m, (x,))
    # AOTAutograd's graph: parameters are placeholders, ops are post-dispatch ATen (addmm, native_layer_norm)
    from torch._functorch.aot_autograd import aot_export_module
    gm, sig = aot_export_module(m, (x,), trace_joint=False)
    params = dict(m.named_parameters())
    consts = {name: params[p].detach() for name, p in sig.inputs_to_parameters.items()}
    aot = translate(gm.graph, "net", constants=consts)
    assert len(aot.input_slots) == 1 and len(aot.constant_slots) == len(params)
    assert {"addmm", "native_layer_norm"} <= set(aot.op_counts()) and "linear" in exported.op_counts()
    by_path = {n.op: n.module_path for n in aot.nodes}
    assert by_path["addmm"] == "lin" and by_path["native_layer_norm"] == "norm"
    for g in (exported, aot):
        (out,) = _run_numpy(g, x)
        assert abs(out - ref).max() <= 1e-5


def test_export_keeps_only_user_outputs():
    class Counting(nn.Module):                 # a buffer mutated in forward is an extra export output
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1)
            return x * 2

    g = capture(Counting(), (torch.ones(2),))
    assert len(g.output_refs) == 1
    (out,) = _run_numpy(g, torch.ones(2))
    assert out.tolist() == [2.0, 2.0]
