"""demo:mlp -- Linear + ReLU layers."""
import torch
from torch import nn


def factory():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return model.eval(), (torch.randn(32, 256),)


def train_factory():
    """(model returning an MSE loss, (inputs, seeded regression targets))."""
    from .losses import Regression
    model, (x,) = factory()
    g = torch.Generator().manual_seed(1)
    return Regression(model), (x, torch.randn(x.shape[0], 10, generator=g))
