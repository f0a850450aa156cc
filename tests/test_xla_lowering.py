"""The xla backend's lowerings of the ATen ops real models use (Llama's rotary sin/cos and casts, T5's abs/log
buckets, Swin's pad and roll, Mixtral's router topk/sort/histc/index_put_, UNet's transposed conv and upsampling,
an LSTM, conv1d, batch norm, max pool): each against eager ATen on the same arguments, then whole models on the
xla backend in fewer regions, within 1e-4 of eager."""
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("jax")
sys.path.insert(0, str(Path(__file__).parent))

aten = torch.ops.aten
g = torch.Generator().manual_seed(0)


def rand(*shape):
    return torch.randn(*shape, generator=g)


def lstm_case():
    m = torch.nn.LSTM(5, 6, num_layers=2, batch_first=True, bidirectional=True)
    x, h = rand(2, 4, 5), (rand(4, 2, 6), rand(4, 2, 6))
    return aten.lstm.input, (x, h, [p.detach() for p in m._flat_weights], True, 2, 0.0, False, True, True)


CASES = {
    "to": lambda: (aten.to.dtype, (rand(3, 4), torch.float16)),
    "sin": lambda: (aten.sin.default, (rand(3, 4),)),
    "cos": lambda: (aten.cos.default, (rand(3, 4),)),
    "abs": lambda: (aten.abs.default, (rand(3, 4),)),
    "log": lambda: (aten.log.default, (rand(3, 4).abs() + 0.1,)),
    "cumsum": lambda: (aten.cumsum.default, (rand(3, 4), 1)),
    "cumsum_bool": lambda: (aten.cumsum.default, (rand(3, 4) > 0, -1)),
    "and": lambda: (aten.__and__.Tensor, (rand(3, 4) > 0, rand(3, 4) > 0)),
    "diff": lambda: (aten.diff.default, (rand(3, 5), 1, -1)),
    "floor_divide": lambda: (aten.floor_divide.default, (torch.arange(-6, 6).reshape(3, 4), torch.tensor(4))),
    "relu_": lambda: (aten.relu.default, (rand(3, 4),)),
    "conv1d": lambda: (aten.conv1d.default, (rand(2, 4, 9), rand(6, 2, 3), rand(6), [2], [1], [1], 2)),
    "conv1d_same": lambda: (aten.conv1d.padding, (rand(2, 4, 9), rand(6, 4, 3), rand(6), [1], "same", [1], 1)),
    "batch_norm": lambda: (aten.batch_norm.default, (rand(2, 3, 4, 4), rand(3), rand(3), rand(3), rand(3).abs(),
                                                     False, 0.1, 1e-5, False)),
    "max_pool2d": lambda: (aten.max_pool2d.default, (rand(2, 3, 8, 8), [3, 3], [2, 2], [1, 1])),
    "conv_transpose2d": lambda: (aten.conv_transpose2d.input, (rand(2, 4, 5, 5), rand(4, 3, 3, 3), rand(3), [2, 2],
                                                               [1, 1], [1, 1], 1, [1, 1])),
    "conv_transpose2d_groups": lambda: (aten.conv_transpose2d.input, (rand(2, 4, 5, 5), rand(4, 3, 2, 2), None,
                                                                      [2, 2], [0, 0], [0, 0], 2, [1, 1])),
    "upsample_bilinear": lambda: (aten.upsample_bilinear2d.vec, (rand(2, 3, 5, 4), None, False, [2.0, 1.5])),
    "upsample_bilinear_corners": lambda: (aten.upsample_bilinear2d.vec, (rand(2, 3, 5, 4), [7, 9], True, None)),
    "upsample_nearest": lambda: (aten.upsample_nearest2d.vec, (rand(2, 3, 5, 4), None, [2.0, 3.0])),
    "pad": lambda: (aten.pad.default, (rand(2, 3, 5), [1, 2], "constant", 0.5)),
    "pad_reflect": lambda: (aten.pad.default, (rand(2, 3, 5), [2, 1], "reflect", None)),
    "roll": lambda: (aten.roll.default, (rand(2, 5, 6), [2, -1], [1, 2])),
    "topk": lambda: (aten.topk.default, (rand(4, 7), 3, -1)),
    "topk_smallest_dim0": lambda: (aten.topk.default, (rand(7, 4), 2, 0, False)),
    "sort_descending": lambda: (aten.sort.default, (rand(4, 7), -1, True)),
    "histc": lambda: (aten.histc.default, (torch.tensor([0., 1., 1., 3., 2., 3., 5.]), 4, 0, 3)),
    "chunk": lambda: (aten.chunk.default, (rand(7, 4), 3, 0)),
    "index_put": lambda: (aten.index_put.default, (torch.zeros(4, 3), (torch.tensor([0, 2]), torch.tensor([1, 2])),
                                                   torch.tensor([1.5, 2.5]))),
    "min_other": lambda: (aten.min.other, (rand(3, 4), rand(3, 4))),
    "max_dim": lambda: (aten.max.dim, (rand(3, 4), 1, True)),
    "full_like": lambda: (aten.full_like.default, (rand(3, 4), 2.5)),
    "log_softmax": lambda: (aten.log_softmax.int, (rand(3, 4), -1)),
    "lstm": lstm_case,
}


def lowered(target, args):
    import jax.numpy as jnp

    from opscope.runtime.backends.xla_backend import _lower
    from opscope.runtime.backends.xla_lowering import more_lowerings

    def to_jax(a):
        if isinstance(a, torch.Tensor):
            return jnp.asarray(a.numpy())
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(to_jax(x) for x in a)
        return a
    fn = more_lowerings(_lower())[target._schema.name]
    return fn(*[to_jax(a) for a in args if not isinstance(a, torch.dtype)])


def flat(out):
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


@pytest.mark.slow              # jax compiles each case: seconds apiece
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_new_lowering_matches_eager_aten(case):
    import jax
    jax.config.update("jax_enable_x64", True)
    target, args = CASES[case]()
    want = flat(target(*args))
    got = flat(lowered(target, args))
    assert len(got) == len(want)
    for a, e in zip(got, want):
        e = e.numpy() if isinstance(e, torch.Tensor) else np.asarray(e)
        assert a.shape == e.shape, (case, a.shape, e.shape)
        a = a.astype(e.dtype)            # what the program does with every output: the dtype capture recorded
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), atol=1e-5, rtol=1e-5, err_msg=case)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=100, max_position_embeddings=32, use_cache=False)
    return LlamaForCausalLM(cfg).eval(), (torch.randint(0, 100, (2, 8)),)


def swin():
    from transformers import SwinConfig, SwinForImageClassification
    torch.manual_seed(0)
    cfg = SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
                     num_labels=3)
    return SwinForImageClassification(cfg).eval(), (torch.randn(1, 3, 32, 32),)


def unet():
    from models.unet import factory
    return factory()


def lstm():
    from models.recurrent import lstm
    return lstm()


# measured here: region counts before these lowerings were Llama 6, Swin 3, UNet 3, LSTM 2 (of the issue's
# larger configs: Llama 18, Swin 18); what is still left out is named in the assertion
# NOTE: not the in-place UNet: its `u[:, 0, 0] = 0.5` is a fill_ through two select views; the fill_ runs on the
# fallback, on a transferred copy of the view, and never reaches u (0.024 off eager; known, open)
REGIONS = {"llama": (llama, 2), "swin": (swin, 2), "unet": (unet, 1), "lstm": (lstm, 1)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REGIONS))
def test_models_run_on_xla_in_fewer_regions_and_match_eager(name):
    from opscope.runtime.session import compare, open_session
    if name in ("llama", "swin"):
        pytest.importorskip("transformers")
    factory, regions = REGIONS[name]
    model, inputs = factory()
    s = open_session(name, "xla", model=model, inputs=inputs)
    rep = s.plan.placement.report()
    assert len(rep["regions"]) <= regions, ([g["nodes"] for g in rep["regions"]], rep["left_out"])
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4
