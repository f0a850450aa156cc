"""A stick-breaking head: a running product (cumprod) of sigmoids between two linears. OpenVINO's importer fails
cumprod with a message that names no op or node (`Conversion is failed for: prim::Constant`): only bisection
finds it."""
import torch
from torch import nn


class StickBreaking(nn.Module):
    def __init__(self, dim=8, out=4):
        super().__init__()
        self.a, self.b = nn.Linear(dim, dim), nn.Linear(dim, out)

    def forward(self, x):
        return self.b(torch.cumprod(self.a(x).sigmoid(), -1))


def factory():
    torch.manual_seed(0)
    return StickBreaking().eval(), (torch.randn(2, 5, 8),)
