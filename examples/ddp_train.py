"""A plain PyTorch DDP training script (gloo, CPU), nothing of opscope in it: what `opscope profile` wraps.

    torchrun --nproc-per-node 2 examples/ddp_train.py --steps 4
    opscope profile -- torchrun --nproc-per-node 2 examples/ddp_train.py --slow-rank 1   # rank 1 made slower
    opscope profile -- python -m torch.distributed.run --nproc-per-node 2 examples/ddp_train.py

--slow-rank R makes rank R sleep --delay seconds before every step, as a straggler would (a slower chip,
a busy host): the other ranks wait for it in the gradient all-reduce, and the Ranks view names it.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="rows per rank")
    p.add_argument("--slow-rank", type=int, default=-1, help="this rank sleeps --delay before every step")
    p.add_argument("--delay", type=float, default=0.05)
    args = p.parse_args()

    dist.init_process_group("gloo")          # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
    rank = dist.get_rank()
    torch.manual_seed(0)                       # every rank starts from the same weights (DDP broadcasts anyway)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)   # each rank its own rows
    for step in range(args.steps):
        if rank == args.slow_rank:
            time.sleep(args.delay)
        x = torch.randn(args.batch, 32, generator=data)
        y = torch.randint(0, 8, (args.batch,), generator=data)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()                        # DDP all-reduces the gradients in buckets here
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)                 # the mean loss over ranks, for the log
        if rank == 0:
            print(f"step {step}: loss {total.item() / dist.get_world_size():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
