"""What every training-sweep test shares: 3 steps through opscope against eager PyTorch, and the one rule a
family must meet (loss per step and every parameter and buffer within 1e-4, no op sent to torch).

    model, inputs = by_keyword(transformers.Qwen2ForCausalLM(cfg), ids, ids)   # labels= by keyword
    assert_like_eager(three_steps("qwen2", model, inputs, "numpy", "adamw"))
"""
import torch

from opscope.runtime.train import OptimizerSpec, compare_with_eager

TOL = 1e-4


def by_keyword(model: torch.nn.Module, x, labels, **kwargs):
    """transformers models take labels by keyword: a wrapper that takes (x, labels) positionally."""

    class ByKeyword(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, labels):
            return self.model(x, labels=labels, **kwargs)
    return ByKeyword().train(), (x, labels)


def three_steps(name: str, model, inputs, backend: str, optimizer: str, *, steps: int = 3) -> dict:
    opt = OptimizerSpec(optimizer, lr=1e-2 if optimizer == "sgd" else 1e-3, weight_decay=0.01)
    return compare_with_eager(name, backend, steps=steps, optimizer=opt, model=model, inputs=inputs)


def assert_like_eager(r: dict, *, allow_torch: bool = False) -> None:
    for a, e in zip(r["losses"], r["eager_losses"]):
        assert abs(a - e) <= TOL * max(1.0, abs(e)), (r["losses"], r["eager_losses"])
    assert r["parameter_error"]["max_abs"] <= TOL, r["parameter_error"]
    assert r["buffer_error"]["max_abs"] <= TOL, r["buffer_error"]
    if not allow_torch:
        # the chip's own fallback (numpy) may take what it lacks (gelu, cumsum); torch may not
        assert not [f for f in r["placement"]["fallback_ops"] if f["backend"].startswith("torch")], r["placement"]
