"""torch's own FSDP2 (`fully_shard`, parameters sharded across ranks, gathered for each layer and freed after)
on CPU/gloo, with AdamW; nothing of opscope in it. What `opscope profile` wraps:

    torchrun --nproc-per-node 2 examples/fsdp2_train.py
    opscope profile -- torchrun --nproc-per-node 2 examples/fsdp2_train.py   # all-gathers, reduce-scatters per rank
"""
import os
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(3):               # each layer's parameters are all-gathered before use, gradients
                                        # reduce-scattered after backward
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 8, (16,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
