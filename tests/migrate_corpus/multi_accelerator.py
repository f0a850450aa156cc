"""accelerate-style: branches for several accelerators, each with its own memory calls."""
import torch
import torch.nn as nn


def is_xpu_available():
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def reset_memory():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_max_memory_allocated()
        return torch.cuda.memory_allocated()
    elif is_xpu_available():
        torch.xpu.empty_cache()
        return torch.xpu.memory_allocated()
    return 0


def main():
    torch.manual_seed(3)
    start = reset_memory()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(6, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        x = torch.randn(5, 6, device=device)
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"loss {step} {loss.item():.6f}")
    print("memory", start >= 0)


if __name__ == "__main__":
    main()
