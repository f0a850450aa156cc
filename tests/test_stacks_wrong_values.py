"""A region a stack compiles to wrong values never runs silently (runtime/region_check.py): OpenVINO's regions are
checked against ATen on sample inputs when compiled, and a member it gets wrong goes to the fallback with the
reason, as one it cannot compile does. The bug that asked for it: OpenVINO's importer converted the functional
`aten::copy` (what a training graph makes of `shifted[:, 1:] = labels[:, :-1]`) as its first input, so T5 with
labels and Wav2Vec2 with SpecAugment trained to wrong values (loss 4.15 for eager's 5.16) with the run ending ok;
copy is now traced as its torch form (export_forms.copy) and test_stacks_train.py's T5 and Wav2Vec2 cells pass.
ONNX Runtime's and XLA's regions are checked the same way."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from train_sweep import assert_like_eager, three_steps  # noqa: E402


class LabelShift(torch.nn.Module):
    """T5's label shift: the decoder reads the labels one step late, a start token first (new_zeros, a slice
    written by copy and slice_scatter, a fill through select_scatter, masked_fill on int64), then a loss."""

    def __init__(self):
        super().__init__()
        self.emb, self.out = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16)

    def forward(self, labels):
        shifted = labels.new_zeros(labels.shape)
        shifted[:, 1:] = labels[:, :-1].clone()
        shifted[:, 0] = 1
        shifted.masked_fill_(shifted == -100, 0)
        return torch.nn.functional.cross_entropy(self.out(self.emb(shifted)).flatten(0, 1), labels.flatten())


# NOTE: multiprocess: OpenVINO's converter starts processes of its own
@pytest.mark.slow
@pytest.mark.multiprocess
def test_openvino_trains_a_label_shift_like_eager_with_its_copy_inside_the_region():
    pytest.importorskip("openvino")
    torch.manual_seed(0)
    labels = torch.randint(2, 16, (2, 6), generator=torch.Generator().manual_seed(1))
    r = three_steps("label_shift", LabelShift(), (labels,), "openvino", "sgd")
    assert_like_eager(r, allow_torch=True)        # was 0.3 off in the loss: the decoder read zeros
    p = r["placement"]
    assert not p["splits"], p["splits"]
    (region,) = p["regions"]
    assert {"copy", "slice_scatter", "select_scatter", "fill", "masked_fill"} <= set(region["ops"])


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.neg(self.a(x)).relu())


def wrong_neg(stack, monkeypatch):
    """neg given a wrong conversion (the identity) where `stack` takes it from: the torch form the exporter traces
    (OpenVINO, ONNX Runtime: export_forms.FORMS), opscope's jax lowering (XLA)."""
    if stack == "xla":
        from opscope.runtime.backends import xla_backend
        lowerings = xla_backend.more_lowerings
        monkeypatch.setattr(xla_backend, "more_lowerings", lambda base: lowerings(base) | {"aten::neg": lambda x: x})
    else:
        from opscope.runtime import export_forms
        monkeypatch.setitem(export_forms.FORMS, torch.ops.aten.neg.default, lambda x: x)


# NOTE: multiprocess: OpenVINO's converter starts processes of its own
@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("stack", ["openvino", "onnxruntime", "xla"])
def test_a_member_a_stack_computes_wrong_is_split_off_with_the_reason_and_the_run_matches_eager(stack, monkeypatch):
    """A conversion that runs and returns wrong values, made here by giving neg a wrong conversion: the
    compile-time check names neg, it runs on the fallback, and the model matches eager. (Without the stack's
    tolerance nothing is checked: neg stays in the region and the run is 2x off.)"""
    pytest.importorskip({"xla": "jax"}.get(stack, stack))
    from opscope.runtime.session import compare, open_session
    wrong_neg(stack, monkeypatch)
    torch.manual_seed(0)
    model, inputs = Block().eval(), (torch.randn(2, 5, 8),)
    s = open_session("block", stack, model=model, inputs=inputs)
    rep = s.plan.placement.report()
    (sp,) = rep["splits"]
    assert sp["ops"] == ["neg"] and sp["found_by"] == "named by the stack" and sp["compiles"] == 1
    assert sp["reason"].startswith("wrong values: ") and "off ATen" in sp["reason"]
    fell = {f["op"]: f for f in rep["fallback_ops"]}
    assert fell["neg"]["backend"] == "torch:cpu" and "wrong values" in fell["neg"]["reason"]
    assert [g["nodes"] for g in rep["regions"]] == [1, 2]      # linear; relu and linear
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4


def test_a_float_cast_to_int_where_c_leaves_it_undefined_is_not_called_wrong():
    """T5's relative-position buckets cast log(0) = -inf to int64 and leave those elements out later (a where):
    no two implementations need agree there (ATen gives INT64_MIN on x86), so the check compares only what the
    cast's defined elements reach -- and still fails a value that is off where it is defined."""
    from opscope.runtime.capture import capture
    from opscope.runtime.partition import StackFailed
    from opscope.runtime.region_check import check_values
    from opscope.runtime.regions import group, to_torch

    class Buckets(torch.nn.Module):
        def forward(self, x):
            pos = torch.arange(4).unsqueeze(0) - torch.arange(4).unsqueeze(1)        # 0 on the diagonal
            large = (torch.log(pos.abs().float()) * 2).to(torch.int64) + 1            # log(0): undefined there
            return torch.where(pos == 0, torch.zeros_like(large), large) + x, large   # (a training graph keeps it)

    g = capture(Buckets(), (torch.zeros(4, 4, dtype=torch.int64),))
    (region,) = group(g, [True] * len(g.nodes))

    def stack(shift=0, clip=False):
        """The region as torch runs it (-inf casts to INT64_MIN here), clipped: other values where the cast is
        undefined, as another stack may give; shifted: off everywhere."""
        def compile(r):
            run = to_torch(r)
            return lambda *xs: [(v.clip(-10**6, 10**6) if clip else v).numpy() + shift
                                for v in run(*map(torch.from_numpy, xs))]
        return compile
    check_values("torch", region, stack()(region), stack())
    check_values("torch", region, stack(clip=True)(region), stack(clip=True))
    with pytest.raises(StackFailed, match="wrong values"):
        check_values("torch", region, stack(shift=1)(region), stack(shift=1))


# NOTE: multiprocess: some OpInfo samples ask the platform (platform.processor runs `uname -p`)
@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_check_calls_no_opinfo_sample_wrong_when_the_stack_computes_what_aten_does():
    """No false alarm over a corpus nobody picked: PyTorch's whole OpInfo suite (the first float32 sample of each),
    every op OpenVINO would claim, as a region of the torch forms OpenVINO traces (export_forms.py) run by torch
    itself: those compute what ATen does, so the check may call none wrong -- random draws, uninitialised memory
    and undefined casts included. (It found empty_strided, which opscope runs as `zeros`, called wrong.)
    ~36 s of CPU on idle cores: one export per OpInfo (~700), no stack compile."""
    pytest.importorskip("expecttest")
    from torch.utils import _pytree as pytree

    from opscope.runtime.backends.openvino_backend import claim
    from opscope.runtime.capture import export, translate_export
    from opscope.runtime.opinfo import _TENSOR, _OneOp, _quiet, op_db, replica
    from opscope.runtime.partition import StackFailed
    from opscope.runtime.region_check import check_values
    from opscope.runtime.regions import group, to_torch

    def torch_forms(region):
        run = to_torch(region)
        return lambda *xs: [(v.float() if v.dtype == torch.bfloat16 else v).numpy()
                            for v in run(*map(torch.from_numpy, xs))]

    checked, alarms = 0, []
    with _quiet():
        for info in op_db():
            if torch.float32 not in info.supported_dtypes("cpu"):
                continue
            try:
                sample = next(iter(info.sample_inputs("cpu", torch.float32)))
                leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
                tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
                model = _OneOp(info.op, spec, [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves])
                model(*map(replica, tensors))
                graph = translate_export(export(model, tuple(map(replica, tensors)), name=info.name), info.name)
            except Exception:          # noqa: BLE001 - eager, export or capture refuses it: no region to check
                continue
            for region in group(graph, [claim(n) is True for n in graph.nodes]):
                checked += 1
                try:
                    check_values("torch forms", region, torch_forms(region), torch_forms)
                except StackFailed as e:   # (torch running a form may fail too: to_sparse's has no numpy)
                    if e.why.startswith("wrong values"):
                        alarms.append((info.name, info.variant_test_name, e.why))
    assert checked > 300, checked                 # most of the suite reached the check
    assert not alarms, alarms


class FloorDivide(torch.nn.Module):
    def forward(self, x, y):
        return torch.floor_divide(x.relu() - 1, y) * 2


@pytest.mark.slow
def test_onnx_runtimes_floor_divide_rounds_toward_zero_and_is_split_off_by_the_check():
    """Not made up: torch's TorchScript exporter writes floor_divide of floats as a truncating division (1.54 //
    -0.29 is -5 there, -6 in ATen); ONNX Runtime ran it silently before its regions were checked."""
    pytest.importorskip("onnxruntime")
    from opscope.runtime.session import compare, open_session
    g = torch.Generator().manual_seed(2)
    inputs = (torch.randn(3, 4, generator=g) * 3, torch.randn(3, 4, generator=g).sign() * 0.7)
    s = open_session("floor_divide", "onnxruntime", model=FloorDivide(), inputs=inputs)
    rep = s.plan.placement.report()
    (sp,) = rep["splits"]
    assert sp["ops"] == ["floor_divide"] and sp["reason"].startswith("wrong values: ")
    assert compare(s.run_host(), s.eager())["max_abs"] == 0


def test_onnx_runtime_gives_a_region_output_the_regions_shape_when_a_0d_input_was_exported_as_1d():
    """The exporter makes a 0-d input (1,), so unsqueezing it gave (1, 1) for ATen's (1,): the value check
    found it on OpInfo's linear_cross_entropy; the program hands back the region's own shape."""
    pytest.importorskip("onnxruntime")
    from opscope.runtime import backends
    from opscope.runtime.capture import capture
    from opscope.runtime.region_check import check_values
    from opscope.runtime.regions import group

    class Unsqueeze(torch.nn.Module):
        def forward(self, x, t):
            return x.unsqueeze(0), t.unsqueeze(0)

    g = capture(Unsqueeze(), (torch.randn(3), torch.tensor(1)))
    (region,) = group(g, [True] * len(g.nodes))
    ops = backends.resolve("onnxruntime").ops
    program = ops._compile(region)
    assert [o.shape for o in program(np.zeros(3, np.float32), np.array(1))] == [(1, 3), (1,)]
    check_values("onnxruntime", region, program, ops._compile)
