"""Small vision nets in the style of timm's MobileNetV3 and ConvNeXt (timm needs torchvision, which does not
load beside the CPU torch): the same blocks, a few channels wide, seeded, with a classification loss."""
import torch
from torch import nn
import torch.nn.functional as F


class SqueezeExcite(nn.Module):
    """MobileNetV3's channel gate: pooled -> reduce -> relu -> expand -> hardsigmoid."""

    def __init__(self, channels, reduced):
        super().__init__()
        self.reduce = nn.Conv2d(channels, reduced, 1)
        self.expand = nn.Conv2d(reduced, channels, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(s))))


class InvertedResidual(nn.Module):
    """expand 1x1 -> depthwise 3x3 -> squeeze-excite -> project 1x1, hardswish between, residual when shapes allow."""

    def __init__(self, cin, hidden, cout, stride):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish())
        self.depthwise = nn.Sequential(nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                                       nn.BatchNorm2d(hidden), nn.Hardswish())
        self.se = SqueezeExcite(hidden, max(hidden // 4, 4))
        self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class MobileNetV3Style(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.Hardswish())
        # NOTE: both blocks residual: a projection's batch-norm bias that only feeds another batch norm has a
        # gradient of exactly 0, which AdamW turns into steps of rounding noise (1e-3 apart between any two backends)
        self.blocks = nn.Sequential(InvertedResidual(8, 16, 8, 1), InvertedResidual(8, 24, 8, 1))
        self.head = nn.Sequential(nn.Linear(8, 16), nn.Hardswish(), nn.Linear(16, classes))

    def forward(self, x, labels):
        y = self.blocks(self.stem(x))
        logits = self.head(F.adaptive_avg_pool2d(y, 1).flatten(1))
        return F.cross_entropy(logits, labels)


class ConvNeXtBlock(nn.Module):
    """depthwise 7x7 -> channels-last LayerNorm -> 4x MLP with GELU -> layer scale -> residual."""

    def __init__(self, dim):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y)))) * self.gamma
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtStyle(nn.Module):
    def __init__(self, classes=4, dim=16):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 4, 4)
        self.stem_norm = nn.LayerNorm(dim, eps=1e-6)
        self.blocks = nn.Sequential(ConvNeXtBlock(dim), ConvNeXtBlock(dim))
        self.head = nn.Linear(dim, classes)

    def forward(self, x, labels):
        y = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        y = self.blocks(y).mean((-2, -1))
        return F.cross_entropy(self.head(y), labels)


def mobilenet_v3():
    torch.manual_seed(0)
    return MobileNetV3Style().train(), (torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,)))


def convnext():
    torch.manual_seed(0)
    return ConvNeXtStyle().train(), (torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,)))
