"""transformers' GPT-2 (a tiny config, random weights) on each compiler stack matches eager within 1e-4, in
regions with the ops a stack cannot take (ORT's CumSum of a bool, OpenVINO's aten::diff) on the fallback."""
import pytest

pytest.importorskip("transformers")

from opscope.runtime.session import compare, open_session  # noqa: E402


def gpt2():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64, use_cache=False,
                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).eval(), (torch.randint(0, 500, (2, 16)),)


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["onnxruntime", "openvino", "xla"])
def test_transformers_gpt2_on_each_stack_matches_eager_in_regions(stack):
    pytest.importorskip({"xla": "jax"}.get(stack, stack))
    model, inputs = gpt2()
    s = open_session("gpt2", stack, model=model, inputs=inputs)
    rep = s.plan.placement.report()
    assert rep["regions"] and all(g["backend"] == stack for g in rep["regions"])
    biggest = max(g["nodes"] for g in rep["regions"])
    assert biggest >= 18                                   # whole blocks in one program, not op by op
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4
