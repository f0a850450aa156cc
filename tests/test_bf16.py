"""bfloat16 on numpy (issue 26): numpy has no bfloat16, so a bfloat16 tensor lives in a float32 array -- and
every op that produces one rounds its result to bfloat16 as torch does (round-to-nearest-even from float32).
Checked over PyTorch's OpInfo bfloat16 samples, bit for bit where torch also rounds a float32 result once, and
the OpInfo comparison never rounds opscope's answer for it."""
import numpy as np
import pytest
import torch
from torch.utils import _pytree as pytree

from opscope.runtime import backends
from opscope.runtime.capture import capture
from opscope.runtime.dtypes import round_to_bfloat16
from opscope.runtime.executor import Executor, compile_plan
from opscope.runtime.opinfo import _TENSOR, _OneOp, _compare, check_opinfo, select

pytest.importorskip("expecttest")

# torch computes these in float32 and rounds once to bfloat16, as numpy's kernels do: equal bit for bit
EXACT = ["add", "sub", "mul", "div.no_rounding_mode", "neg", "abs", "nn.functional.relu", "where", "clamp", "maximum",
         "cat", "to", "sum"]
# transcendental, reductions, matmul: libm and accumulation order differ in float32's last bit, so a value near a
# bfloat16 tie may round the other way; assert_close's bfloat16 tolerance, on values that are bfloat16 values
CLOSE = ["exp", "tanh", "sigmoid", "nn.functional.gelu", "nn.functional.silu", "matmul", "nn.functional.linear",
         "softmax", "nn.functional.layer_norm", "mean", "rsqrt", "pow"]


def test_rounding_is_torchs_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200_000, generator=g) * torch.logspace(-38, 38, 200_000)
    x = torch.cat([x, torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 3.4e38, 1e-40,
                                    1.00390625, 1.01171875, -1.00390625])])       # the last three are ties
    got = round_to_bfloat16(x.numpy())
    want = x.bfloat16().float().numpy()
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(got.view(np.uint32)[~np.isnan(got)], want.view(np.uint32)[~np.isnan(want)])


def _samples(name, dtype):
    info = next(o for o in select([name], dtype))
    return info, list(info.sample_inputs("cpu", torch.bfloat16 if dtype == "bfloat16" else torch.float32))[:3]


def _run(info, sample, backend):
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    model = _OneOp(info.op, spec, [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves])
    want = [x for x in pytree.tree_leaves(model(*tensors)) if isinstance(x, torch.Tensor)]
    got = Executor(compile_plan(capture(model, tuple(tensors)), backend, allow_fallback=False)).run_host(*tensors)
    return got, want


@pytest.mark.parametrize("name", EXACT + ["bfloat16"])
def test_bfloat16_results_equal_torchs_bit_for_bit(name):
    """`bfloat16` is the OpInfo of x.bfloat16() over float32 samples: the conversion itself."""
    info, samples = _samples(name, "float32" if name == "bfloat16" else "bfloat16")
    backend = backends.resolve("numpy")
    for sample in samples:
        got, want = _run(info, sample, backend)
        for a, e in zip(got, want):
            if e.dtype == torch.bfloat16:
                assert torch.equal(torch.from_numpy(np.array(a, dtype=np.float32)), e.float()), (name, sample)


@pytest.mark.slow
def test_opinfo_bfloat16_samples_pass_on_numpy():
    report = check_opinfo(backends.resolve("numpy"), names=EXACT + CLOSE, dtype="bfloat16")
    assert report.counts()["pass"] == len(EXACT + CLOSE), [(r.name, r.status, r.message) for r in report.results]


def test_opinfo_comparison_does_not_round_opscopes_answer():
    """A float32 answer with more precision than bfloat16 holds is wrong, not rounded until it matches."""
    e = torch.tensor([1.0, 2.0, 3.0]).bfloat16()
    assert "not bfloat16 values" in _compare([np.array([1.0, 2.0, 3.0001], dtype=np.float32)], e, shape_only=False)
    assert _compare([np.array([1.0, 2.0, 3.0], dtype=np.float32)], e, shape_only=False) == ""
