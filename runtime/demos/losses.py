"""Training forms of the demos: each wraps a demo model so it returns its loss (the training
contract), on seeded synthetic targets -- no user code needed for `opscope train demo:NAME`."""
import torch
import torch.nn.functional as F
from torch import nn


class Regression(nn.Module):
    """Mean squared error against a target tensor."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, target):
        return F.mse_loss(self.model(x), target)


class Classification(nn.Module):
    """Cross-entropy against integer class labels."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, labels):
        return F.cross_entropy(self.model(x), labels)


class NextToken(nn.Module):
    """Language-model loss: cross-entropy of each position's logits against the next token."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        logits = self.model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
