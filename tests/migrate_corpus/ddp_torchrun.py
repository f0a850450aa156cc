"""A torchrun DDP script: the backend comes from an argparse default ("nccl"), each rank picks
`cuda:{LOCAL_RANK}`, and DDP gets device_ids. Rank 0 prints the losses."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", type=str, default="nccl")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group(backend=args.backend)
    local_rank = int(os.environ["LOCAL_RANK"])
    device = f"cuda:{local_rank}"
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 2).to(device), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(args.steps):
        x = torch.randn(3, 4, generator=g).to(device)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)
        if dist.get_rank() == 0:
            print(f"loss {step} {t.item() / dist.get_world_size():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
