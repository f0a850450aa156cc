"""demo:mlp -- Linear + ReLU layers."""
import torch
from torch import nn


def factory():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    return model.eval(), (torch.randn(32, 256),)
