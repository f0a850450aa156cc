"""pytorch/examples imagenet-style: a torch.device built from args.gpu, then `.cuda(device)` and
`.cuda(args.gpu, non_blocking=True)` on every batch."""
import argparse

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument('--gpu', default=None, type=int)
parser.add_argument('--steps', default=3, type=int)
args = parser.parse_args()


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    if torch.cuda.is_available():
        if args.gpu is not None:
            device = torch.device('cuda:{}'.format(args.gpu))
        else:
            device = torch.device("cuda")
        model.cuda(device)
    else:
        device = torch.device("cpu")
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(args.steps):
        images = torch.randn(4, 3, 8, 8)
        target = torch.randint(5, (4,))
        if torch.cuda.is_available():
            images = images.cuda(args.gpu, non_blocking=True)
            target = target.cuda(args.gpu, non_blocking=True)
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"loss {step} {loss.item():.6f}")


if __name__ == '__main__':
    main()
