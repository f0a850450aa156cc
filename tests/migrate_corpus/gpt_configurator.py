"""nanoGPT-style: settings are module globals, overridden by `--key=value` through a configurator
that keeps each global's type (so `--device=cpu` must find a str)."""
import sys
from ast import literal_eval
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

device = 'cuda'
backend = 'nccl'
dtype = 'float32'
steps = 4
batch_size = 4
compile = False
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True

for arg in sys.argv[1:]:
    key, val = arg[2:].split('=', 1)
    assert key in globals(), f"unknown config key {key}"
    try:
        attempt = literal_eval(val)
    except (SyntaxError, ValueError):
        attempt = val
    assert type(attempt) == type(globals()[key]), f"type mismatch for {key}: {type(attempt)} vs {type(globals()[key])}"
    globals()[key] = attempt

device_type = 'cuda' if 'cuda' in device else 'cpu'
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

torch.manual_seed(1337)
vocab, block = 32, 8
model = nn.Sequential(nn.Embedding(vocab, 16), nn.Linear(16, vocab)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler(enabled=(dtype == 'float16'))
data = torch.randint(vocab, (64,))


def get_batch():
    ix = torch.randint(len(data) - block - 1, (batch_size,))
    x = torch.stack([data[i:i + block] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
    if device_type == 'cuda':
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


for step in range(steps):
    x, y = get_batch()
    with ctx:
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, vocab), y.view(-1))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    print(f"loss {step} {loss.item():.6f}")
