"""demo:cnn -- a small ResNet: conv, batch norm, ReLU, residual adds, pooling, a linear head."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class SmallResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.layer1 = Block(16, 16, 1)
        self.layer2 = Block(16, 32, 2)
        self.layer3 = Block(32, 64, 2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.head(torch.flatten(self.pool(x), 1))


def factory():
    torch.manual_seed(0)
    model = SmallResNet().eval()
    with torch.no_grad():   # non-trivial running stats, so batch norm is really exercised
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.8, 1.2)
    return model, (torch.randn(8, 3, 32, 32),)


def train_factory():
    """(model returning a cross-entropy loss, (images, seeded class labels))."""
    from .losses import Classification
    model, (x,) = factory()
    g = torch.Generator().manual_seed(1)
    return Classification(model), (x, torch.randint(0, 10, (x.shape[0],), generator=g))
