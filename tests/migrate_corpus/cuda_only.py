"""A script that assumes CUDA everywhere: no availability checks, .cuda(), device="cuda" factories,
CUDA autocast and GradScaler, torch.cuda queries, an nccl process group and a CUDA profiler activity.
It is run unchanged through `opscope migrate run` (tests/test_migrate_corpus.py)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

device = "cuda"
assert torch.cuda.is_available(), "this script needs CUDA"
torch.cuda.manual_seed_all(0)
torch.manual_seed(0)
store = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_only.store")
dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.cuda.amp.GradScaler()
x = torch.randn(32, 8, device="cuda")
y = torch.randn(32, 1).to(device, non_blocking=True)
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for step in range(3):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16, enabled=False):
            loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch.cuda.synchronize()
        t = loss.detach().clone()
        dist.all_reduce(t)
        print(f"loss {step} {t.item():.6f}")
print("device string kept:", device == "cuda", "on", x.device.type, "memory", torch.cuda.memory_allocated() >= 0)
dist.destroy_process_group()
os.path.exists(store) and os.remove(store)
