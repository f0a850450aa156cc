"""MoE-style routing ops: topk, sort, histc and index_put_ (the pieces of Mixtral's router)."""
import torch
from torch import nn


class Router(nn.Module):
    def __init__(self, dim=8, experts=4):
        super().__init__()
        self.gate = nn.Linear(dim, experts)
        self.experts = experts

    def forward(self, x):
        logits = self.gate(x)                                   # (tokens, experts)
        weights, chosen = torch.topk(logits.softmax(-1), 2, dim=-1)
        order, _ = torch.sort(logits, dim=-1, descending=True)
        load = torch.histc(chosen.float(), bins=self.experts, min=0, max=self.experts - 1)
        mask = torch.zeros_like(logits)
        rows = torch.arange(x.shape[0]).unsqueeze(1).expand_as(chosen)
        mask.index_put_((rows, chosen), weights)                # dense routing weights
        return mask, order, load


def factory():
    torch.manual_seed(0)
    return Router().eval(), (torch.randn(6, 8),)
