"""pytorch/examples mnist-style: a --no-cuda flag, `torch.device("cuda" if use_cuda else "cpu")`,
loader kwargs chosen by `device.type == 'cuda'`, and a check of `.is_cuda`."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def train(model, device, optimizer, steps):
    model.train()
    for step in range(steps):
        data, target = torch.randn(8, 1, 6, 6).to(device), torch.randint(10, (8,)).to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(F.log_softmax(model(data), dim=1), target)
        loss.backward()
        optimizer.step()
        print(f"loss {step} {loss.item():.6f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--no-cuda', action='store_true', default=False)
    parser.add_argument('--steps', type=int, default=3)
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()
    torch.manual_seed(1)
    device = torch.device("cuda" if use_cuda else "cpu")
    loader_kwargs = {'num_workers': 1, 'pin_memory': True} if device.type == 'cuda' else {}
    model = nn.Sequential(nn.Flatten(), nn.Linear(36, 10)).to(device)
    if next(model.parameters()).is_cuda:
        print("on the GPU", loader_kwargs)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    train(model, device, optimizer, args.steps)


if __name__ == '__main__':
    main()
