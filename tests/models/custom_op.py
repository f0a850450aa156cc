"""A model calling a library's own custom op, the way transformers registers
`transformers::grouped_mm_fallback`: torch runs it, opscope has no mapping for it."""
import torch
from torch import nn


@torch.library.custom_op("opscopetest::scaled_gate", mutates_args=())
def scaled_gate(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(x @ w) * x.sum(-1, keepdim=True)


@scaled_gate.register_fake
def _(x, w):
    return x.new_empty(x.shape[:-1] + w.shape[-1:])


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 6))
        self.proj = nn.Linear(6, 3)

    def forward(self, x):
        return self.proj(scaled_gate(x, self.w))


def factory():
    torch.manual_seed(0)
    return Gated().eval(), (torch.randn(4, 6),)
