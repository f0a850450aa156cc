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


SOFTMAX = '''
import torch
from torch import nn


def attend(scores):
    scaled = scores * 0.5                # a helper: its ops have their own source lines
    return torch.softmax(scaled, dim=-1)


class Softmaxed(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        self.fc2 = nn.Linear(64, 16)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        p = attend(h * 8.0)              # the first softmax: low precision on the sim chip
        return self.fc2(p)


def factory():
    torch.manual_seed(0)
    return Softmaxed().eval(), (torch.randn(8, 64),)
'''

LOW_SOFTMAX_TOML = LOW_PRECISION_TOML.replace('low_precision = ["linear"]', 'low_precision = ["softmax"]')

TWO_NANS = '''
import torch
from torch import nn


class TwoNans(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        h = torch.log(torch.relu(self.a(x)) - 10.0)     # NaN #1, made here
        h = torch.tanh(h)                                # carries NaN #1
        g = torch.sqrt(self.b(x) - 100.0)                # NaN #2, made from finite inputs
        return h + 1.0, g * 2.0


def factory():
    torch.manual_seed(0)
    return TwoNans().eval(), (torch.randn(4, 8),)
'''

NAN_WEIGHT = '''
import torch
from torch import nn


class NanWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)
        with torch.no_grad():
            self.head.weight[1, 2] = float("nan")        # a weight a bad checkpoint left behind

    def forward(self, x):
        return self.head(torch.relu(self.pre(x)))


def factory():
    torch.manual_seed(0)
    return NanWeight().eval(), (torch.randn(4, 8),)
'''

RAISE_IN_FORWARD = '''
import torch
from torch import nn


class RaisesInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        if h.shape[-1] == 8:
            raise ValueError("this model refuses width 8")
        return h


def factory():
    return RaisesInForward().eval(), (torch.randn(2, 8),)
'''

GPT2_SMALL = '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def factory():
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, use_cache=False)       # GPT-2 small's widths, two of its blocks
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg).eval()
    return model, (torch.randint(0, cfg.vocab_size, (1, 16)),)
'''


async def until(pilot, app, pred, tries=600):
    """Wait (in the app's loop) until the controller's last event satisfies `pred`."""
    for _ in range(tries):
        await pilot.pause(0.02)
        if app.last_event is not None and pred(app.last_event):
            await pilot.pause()
            return app.last_event
    raise AssertionError(f"the debugger never reached the expected state; last event: {app.last_event!r}")
