"""torch.compile(model, backend="opscope", options={"backend": STACK}): dynamo's regions placed on a compiler
stack match eager. The backend is called under dynamo's FakeTensorMode, and AOTAutograd's graph views tensors
its own layout made contiguous: a region is exported outside the fake mode, with views as reshapes."""
import pytest
import torch

import opscope.runtime.dynamo  # noqa: F401  registers backend="opscope"


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["onnxruntime", "openvino", "xla"])
def test_torch_compile_on_a_stack_matches_eager(stack):
    pytest.importorskip({"xla": "jax"}.get(stack, stack))
    from opscope.runtime.demos.gpt import GPT
    torch.manual_seed(0)
    model, x = GPT(layers=1).eval(), torch.randint(0, 2048, (2, 16))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="opscope", options={"backend": stack})
    with torch.no_grad():
        assert (compiled(x) - model(x)).abs().max().item() < 1e-4
    torch._dynamo.reset()
