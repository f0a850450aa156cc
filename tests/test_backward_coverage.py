"""The backward ops real architectures' training graphs hold (issue 26): each checked against float64 ATen by
the conformance suite on the reference backend and a sim chip, and the rules a sample cannot express (a fully
masked softmax row, dropout's seeded mask, upsampling's unsafe index ops) checked on a model."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from opscope.runtime import backends, conformance
from opscope.runtime.ops import OPS
from opscope.runtime.ops.backward import DROPOUT_SEED
from opscope.runtime.train import OptimizerSpec, compare_with_eager, eager_steps

NEW_OPS = ["slice_backward", "select_backward", "as_strided_scatter", "safe_softmax", "hardswish_backward",
           "hardsigmoid_backward", "native_dropout_backward", "index", "index_put"]


@pytest.mark.parametrize("backend", ["numpy", "sim:npu-a1"])
def test_new_backward_ops_match_float64_aten(backend):
    report = conformance.check(backends.resolve(backend), ops=NEW_OPS, dtypes=("float32",))
    ran = [c for c in report.cells if c.status != "unsupported"]
    assert {c.op for c in ran} == set(NEW_OPS)
    assert all(c.status == "pass" and c.cases for c in ran), [(c.op, c.dtype, c.status, c.message) for c in ran]


def test_slice_and_select_backward_are_compositions_every_backend_runs():
    """No numpy kernel of their own: the reference backend (and every sim chip, which borrows its kernels) runs
    zeros + the scatter op -- which the conformance test above shows matches ATen."""
    for op in ("slice_backward", "select_backward"):
        assert OPS[op].numpy is None and OPS[op].composite is not None
    from opscope.runtime.capture import capture
    from opscope.runtime.decompose import _Body
    graph = capture(_Body(lambda g: OPS["slice_backward"].composite(g, [6, 5], 0, 1, 3, 1)), (torch.ones(2, 5),))
    assert [n.op for n in graph.nodes] == ["new_zeros", "slice_scatter"]


def test_safe_softmax_gives_zeros_for_a_row_that_is_all_minus_inf():
    x = torch.randn(3, 4)
    x[1] = float("-inf")
    x[2, :2] = float("-inf")
    want = torch.ops.aten._safe_softmax.default(x, -1)
    got = OPS["safe_softmax"].numpy(x.numpy(), -1)
    assert not np.isnan(got).any() and (got[1] == 0).all()
    np.testing.assert_allclose(got, want.numpy(), atol=1e-6)


class Upsampler(nn.Module):
    """nearest upsampling (captured as _unsafe_index; its backward _unsafe_index_put) and dropout."""

    def __init__(self, dropout=nn.Dropout):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.drop = dropout(0.5)
        self.head = nn.Linear(8, 3)

    def forward(self, x, labels):
        h = F.interpolate(self.conv(x), scale_factor=2, mode="nearest")
        h = self.drop(h.flatten(2).mean(-1).repeat(1, 4))
        return F.cross_entropy(self.head(h), labels)


class SeededDropout(nn.Module):
    """Eager dropout with opscope's mask: numpy's generator seeded with DROPOUT_SEED, drawn per call over the
    input's shape, keep where the draw >= p, kept values scaled by 1/(1-p)."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        keep = np.random.default_rng(DROPOUT_SEED).random(tuple(x.shape)) >= self.p
        return x * torch.from_numpy(keep) / (1 - self.p)


def _upsampler(dropout=nn.Dropout):
    torch.manual_seed(0)
    return Upsampler(dropout).train(), (torch.randn(4, 2, 4, 4), torch.tensor([0, 1, 2, 1]))


@pytest.mark.parametrize("backend", ["numpy", "sim:npu-a1"])
def test_dropout_and_upsampling_train_by_the_seeded_mask_rule(backend):
    """With dropout on, opscope's run matches eager PyTorch whose dropout draws opscope's mask: the forward's
    mask reaches native_dropout_backward (the gradient is zero where a value was dropped)."""
    model, inputs = _upsampler()
    opt = OptimizerSpec("sgd", lr=1e-1)
    r = compare_with_eager("upsampler", backend, steps=3, optimizer=opt, model=model, inputs=inputs,
                           allow_fallback=False)
    seeded, _ = _upsampler(SeededDropout)
    seeded.load_state_dict(model.state_dict())
    want = eager_steps(seeded, inputs, opt, 3)
    np.testing.assert_allclose(r["losses"], want["losses"], atol=1e-5)
    assert r["nodes"] and not r["placement"]["fallback_ops"]
    # compare_with_eager's own eager side draws by the same rule (runtime/train/dropout.py), so its report holds too
    np.testing.assert_allclose(r["eager_losses"], want["losses"], atol=1e-5)


def test_seeded_dropout_parameters_match_the_mask_rule():
    from opscope.runtime.train import Trainer
    model, inputs = _upsampler()
    seeded, _ = _upsampler(SeededDropout)
    seeded.load_state_dict(model.state_dict())
    opt = OptimizerSpec("adamw", lr=1e-3)
    trainer = Trainer.create(model, inputs, backends.resolve("numpy"), opt, allow_fallback=False)
    for _ in range(3):
        trainer.step()
    want = eager_steps(seeded, inputs, opt, 3)["parameters"]
    got = trainer.parameters()
    assert max(float(np.abs(got[k] - want[k]).max()) for k in want) <= 1e-4
