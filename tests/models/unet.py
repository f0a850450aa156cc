"""A small UNet: strided conv down, ConvTranspose2d and bilinear upsampling back up, skip concat."""
import torch
import torch.nn.functional as F
from torch import nn


class UNet(nn.Module):
    def __init__(self, ch=4):
        super().__init__()
        self.enc = nn.Conv2d(3, ch, 3, padding=1)
        self.down = nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(2 * ch, ch, 2, stride=2)
        self.head = nn.Conv2d(2 * ch, 1, 1)

    def forward(self, x):
        e = torch.relu(self.enc(x))
        d = torch.relu(self.down(e))
        u = self.up(d)
        # bilinear resize of the bottleneck, added back in: the decoder's other upsampling path
        u = u + F.interpolate(d, scale_factor=2, mode="bilinear", align_corners=False).mean(1, keepdim=True)
        return self.head(torch.cat([e, u], dim=1))


def factory():
    torch.manual_seed(0)
    return UNet().eval(), (torch.randn(2, 3, 16, 16),)


class InPlaceUNet(UNet):
    """The UNet written the way real ones are: in-place ReLU, `+=` and `/=` on the skip, a boolean `&` mask and an
    index_put_ (a pixel row set): ops the ONNX exporter runs though its registry names them otherwise."""

    def forward(self, x):
        e = torch.relu_(self.enc(x))
        d = torch.relu_(self.down(e))
        u = self.up(d)
        u += e
        u /= 2.0
        u = u * ((u > 0) & (e > 0))
        u[:, 0, 0] = 0.5
        return self.head(torch.cat([e, u], dim=1))


def in_place_factory():
    torch.manual_seed(0)
    return InPlaceUNet().eval(), (torch.randn(2, 3, 16, 16),)
