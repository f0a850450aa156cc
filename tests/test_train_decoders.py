"""Decoder LMs as transformers 5.x builds them train and run on every reference backend (issue 26): Qwen2, Mistral
with its sliding window on, Mixtral's grouped experts (transformers::grouped_mm_fallback, which only torch could run
before) and Llama with use_cache=True (its default: a DynamicCache among the outputs, which torch.export refused).
Random weights, small configs (2 layers, hidden 32, vocab 64, batch 2, seq 8); the rule is tests/train_sweep.py's."""
import json
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from opscope.runtime.session import compare, open_session
from train_sweep import TOL, assert_like_eager, by_keyword, three_steps

transformers = pytest.importorskip("transformers")
LAYERS = 2


def _config(cls, **kw):
    return cls(num_hidden_layers=LAYERS, hidden_size=32, intermediate_size=64, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, **kw)


def qwen2(use_cache=False):
    return transformers.Qwen2ForCausalLM(_config(transformers.Qwen2Config, use_cache=use_cache))


def mistral(use_cache=False, sliding_window=4):          # a window of 4 over 8 tokens: the mask is not causal's
    return transformers.MistralForCausalLM(_config(transformers.MistralConfig, sliding_window=sliding_window,
                                                   use_cache=use_cache))


def mixtral(use_cache=False):
    return transformers.MixtralForCausalLM(_config(transformers.MixtralConfig, num_local_experts=4,
                                                   num_experts_per_tok=2, use_cache=use_cache))


def llama_with_cache():
    return transformers.LlamaForCausalLM(_config(transformers.LlamaConfig, use_cache=True))


FAMILIES = {"qwen2": qwen2, "mistral": mistral, "mixtral": mixtral, "llama_with_cache": llama_with_cache}


def _ids():
    torch.manual_seed(0)
    return torch.randint(0, 64, (2, 8))


def _training(family):
    torch.manual_seed(0)
    model = FAMILIES[family]()
    ids = _ids()
    return by_keyword(model, ids, ids)


# 3 steps of SGD and AdamW on numpy and on the sim chip; Llama with its cache on torch:cpu too
CASES = [(f, b, o) for f in ("qwen2", "mistral", "mixtral") for b, o in
         [("numpy", "sgd"), ("numpy", "adamw"), ("sim:npu-a1", "sgd"), ("sim:npu-a1", "adamw")]]
CASES += [("llama_with_cache", b, "adamw") for b in ("numpy", "torch:cpu", "sim:npu-a1")]
FAST = {("mixtral", "numpy", "adamw"), ("llama_with_cache", "numpy", "adamw")}     # the two fixes, in every CI run


@pytest.mark.parametrize("family,backend,optimizer",
                         [pytest.param(*c, marks=() if c in FAST else pytest.mark.slow) for c in CASES],
                         ids=[f"{f}-{b}-{o}" for f, b, o in CASES])
def test_decoder_trains_three_steps_like_eager(family, backend, optimizer):
    model, inputs = _training(family)
    assert_like_eager(three_steps(family, model, inputs, backend, optimizer))


def test_mistral_window_is_on():
    """The Mistral case above trains with its sliding window in force: the same weights without the window give
    other logits, so the window's mask is what the captured graph computed."""
    torch.manual_seed(0)
    windowed = mistral().eval()
    full = mistral(sliding_window=None).eval()
    full.load_state_dict(windowed.state_dict())
    with torch.no_grad():
        assert (windowed(_ids()).logits - full(_ids()).logits).abs().max() > 1e-3


@pytest.mark.parametrize("backend", ["numpy", "sim:npu-a1"])
def test_mixtral_runs_like_eager_without_torch(backend):
    """Inference, as `opscope run` opens it: the grouped experts run on the backend's own kernels."""
    torch.manual_seed(0)
    s = open_session("mixtral", backend, model=mixtral(), inputs=(_ids(),))
    assert s.graph.op_counts().get("grouped_mm") == 2 * LAYERS          # gate+up (one weight), down: one each
    err = compare(s.run_host(), s.eager())
    assert err["max_abs"] <= TOL, err
    fell_back = s.plan.placement.report()["fallback_ops"]
    assert not [f for f in fell_back if f["backend"].startswith("torch") or f["op"].startswith("grouped_mm")], fell_back


@pytest.mark.parametrize("backend", ["numpy", "torch:cpu", "sim:npu-a1"])
def test_llama_with_cache_runs_and_returns_its_cache(backend):
    """use_cache=True: the outputs are the logits, then each layer's keys and values (the DynamicCache's tensors),
    all within 1e-4 of eager -- eager's cache flattened the same way."""
    torch.manual_seed(0)
    model = llama_with_cache()
    s = open_session("llama", backend, model=model, inputs=(_ids(),))
    got, want = s.run_host(), s.eager()
    assert [np.shape(g) for g in got] == [(2, 8, 64)] + [(2, 2, 8, 8)] * (2 * LAYERS)
    assert [np.shape(w) for w in want] == [np.shape(g) for g in got]
    err = compare(got, want)
    assert err["max_abs"] <= TOL, err
    assert "forward" not in vars(model)        # capture's wrapper is gone: the user's model is as it was


@pytest.mark.slow
def test_llama_with_cache_runs_under_dynamo():
    """--capture dynamo: without a mask transformers asks SDPA for grouped-query attention, which reaches the CPU
    flash kernel with 2 key/value heads for 4 query heads (numpy's kernel broadcast-failed on it)."""
    from opscope.runtime.dynamo import open_dynamo_session

    torch.manual_seed(0)
    s = open_dynamo_session("llama", "numpy", model=llama_with_cache(), inputs=(_ids(),))
    got, want = s.run_host(), s.eager()
    assert len(got) == 1 + 2 * LAYERS
    err = compare(got, want)
    assert err["max_abs"] <= TOL, err


GROUPS = [[2, 5, 9], [0, 4, 9], [3, 3, 9], [9, 9, 9], [2, 5, 7], [4, 12, 20], [6, 2, 9], [0, 0, 0]]


@pytest.mark.parametrize("offs", GROUPS, ids=["-".join(map(str, g)) for g in GROUPS])
def test_grouped_mm_kernels_are_transformers_definition(offs):
    """Both numpy kernels against transformers' own loop: sorted groups, an empty expert, one expert for all,
    rows past the last offset (zero), offsets past the rows (clipped), a decreasing offset, no rows at all."""
    _grouped_mm_like_transformers(offs)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=5))
def test_grouped_mm_kernels_on_any_offsets(offs):
    _grouped_mm_like_transformers(offs)


def _grouped_mm_like_transformers(offs):
    from transformers.integrations import moe  # noqa: F401  (registers torch.ops.transformers.*)

    from opscope.runtime.ops import OPS

    g = torch.Generator().manual_seed(0)
    e = len(offs)
    x, w, grad = (torch.randn(9, 4, generator=g), torch.randn(e, 4, 5, generator=g), torch.randn(9, 5, generator=g))
    o = torch.tensor(offs)
    want = torch.ops.transformers.grouped_mm_fallback(x, w, o)
    want_dx, want_dw = torch.ops.transformers.grouped_mm_fallback_backward(x, w, o, grad)
    got = OPS["grouped_mm"].numpy(x.numpy(), w.numpy(), o.numpy())
    got_dx, got_dw = OPS["grouped_mm_backward"].numpy(x.numpy(), w.numpy(), o.numpy(), grad.numpy())
    for a, e in [(got, want), (got_dx, want_dx), (got_dw, want_dw)]:
        np.testing.assert_allclose(a, e.numpy(), rtol=1e-6, atol=1e-6)


MODEL_FILE = textwrap.dedent("""
    import torch
    import transformers

    def llama():
        cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                       num_key_value_heads=2, vocab_size=64, max_position_embeddings=32)
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(cfg), (torch.randint(0, 64, (2, 8)),)   # use_cache: its default, True
""")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_opscope_run_takes_llama_with_its_default_cache(cli, tmp_path):
    """What a user types: `opscope run file.py:llama` on a Llama as transformers configures it (use_cache=True)
    exited 1 with 'Found DynamicCache in output'; now it runs and matches eager, cache included."""
    (tmp_path / "decoder.py").write_text(MODEL_FILE)
    r = cli("run", f"{tmp_path / 'decoder.py'}:llama", "-b", "numpy", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["max_abs_err"] <= TOL, doc
