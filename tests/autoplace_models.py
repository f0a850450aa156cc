"""Tiny random-weight models for -b auto's tests (tests/test_autoplace.py) and benchmark: transformers' GPT-2, BERT,
Llama, T5 and ViT with two layers (so the search meets repeated blocks), and a scan OpenVINO cannot convert.
Each factory returns (model, inputs), usable as `tests/autoplace_models.py:NAME` on the command line."""
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))     # also loaded by path: `opscope run tests/autoplace_models.py:gpt2`
import matrix_models  # noqa: E402

# the matrix's factories (tests/matrix_models.py) at this size
TWO_LAYERS = matrix_models.Size(layers=2, hidden=64, heads=4, vocab=256, seq=16, decoder_seq=8, image=32, labels=10)
gpt2, bert, llama, t5, vit = (partial(getattr(matrix_models, name), TWO_LAYERS)
                              for name in ("gpt2", "bert", "llama", "t5", "vit"))


class Scan(torch.nn.Module):
    """A log-space running sum between two linears: OpenVINO's importer has no rule for aten::logcumsumexp."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.logcumsumexp(self.a(x).relu(), dim=1)).softmax(-1)


def scan():
    torch.manual_seed(0)
    return Scan().eval(), (torch.randn(2, 5, 8),)


TRANSFORMERS = {"gpt2": gpt2, "bert": bert, "llama": llama, "t5": t5, "vit": vit}
