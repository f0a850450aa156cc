"""A weight-normed conv (torch.nn.utils.parametrizations.weight_norm), as in Wav2Vec2's positional conv."""
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm


class WeightNormConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = weight_norm(nn.Conv1d(8, 8, 5, padding=2, groups=2), name="weight", dim=2)
        self.proj = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.nn.functional.gelu(self.conv(x))
        return self.proj(y.transpose(1, 2))


def factory():
    torch.manual_seed(0)
    return WeightNormConv().eval(), (torch.randn(2, 8, 10),)
