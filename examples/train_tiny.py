"""A tiny training script: a small MLP classifier, SGD, a few seeded steps; prints the loss per step.

    python examples/train_tiny.py --steps 5
    opscope profile -- python examples/train_tiny.py --steps 5      # every ATen op, by phase and step
    python examples/train_tiny.py --compile sim:npu-a1              # the same loop, the model on an opscope backend

--compile BACKEND_SPEC wraps the model in `torch.compile(model, backend="opscope", options={"backend": SPEC})`:
TorchDynamo hands opscope the forward and backward graphs, the chosen backend runs them, and this
loop (its optimizer, its data) is otherwise unchanged.
"""
import argparse

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--compile", metavar="BACKEND_SPEC", help="train through torch.compile(backend='opscope') on "
                   "this opscope backend (numpy, torch:cpu, sim:npu-a1, a description file)")
    args = p.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, foreach=False)
    if args.compile:
        model = torch.compile(model, backend="opscope", options={"backend": args.compile})
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(args.batch, 16)
    y = torch.randint(0, 4, (args.batch,))
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
