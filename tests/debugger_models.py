"""Model files the debugger tests write to disk and load as `file.py:factory` (what a user does)."""

PLANTED_NAN = '''
import torch
from torch import nn


class Planted(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = h - 10.0               # every value negative ...
        h = torch.log(h)           # ... so this log makes the first NaN
        return self.b(torch.tanh(h))


def factory():
    torch.manual_seed(0)
    return Planted().eval(), (torch.randn(4, 8),)
'''

NUMERICS = '''
import torch
from torch import nn


class Numerics(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x):
        h = torch.tanh(x * 2.0)          # exact on every backend
        h = torch.relu(self.fc1(h))      # the first linear: low precision on the sim chip
        return self.fc2(h)


def factory():
    torch.manual_seed(0)
    return Numerics().eval(), (torch.randn(8, 64),)
'''

LOW_PRECISION_TOML = '''
[backend]
name = "lowp-chip"
implementation = "sim"
fallback = "numpy"

[hardware]
peak_flops = { float32 = 1.0e13, float16 = 4.0e13 }
memory_bandwidth = 1.0e12

[operators]
low_precision = ["linear"]
'''

RAISES = '''
import torch
from torch import nn

from opscope.runtime import operator


def _refuse(x):
    raise ValueError("kernel refused its input on purpose")


@operator(reference=_refuse)
def dbg_test_explode(x):
    return x * 2


class Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return torch.tanh(dbg_test_explode(h))


def factory():
    torch.manual_seed(0)
    return Raises().eval(), (torch.randn(2, 8),)
'''


def write(tmp_path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)
