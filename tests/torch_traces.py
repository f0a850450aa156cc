"""Real torch.profiler traces recorded in the test (issue 27's material): a small training loop with AdamW,
shapes, memory, Python stacks and record_function annotations, as a user records one."""
from __future__ import annotations


def record_training(path, steps: int = 4) -> str:
    """A 4-step AdamW training loop of a small MLP classifier (log_softmax + nll_loss), each phase in a
    record_function, profiled with record_shapes, profile_memory and with_stack; -> the trace's path."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                profile_memory=True, with_stack=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1),
                                on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(steps + 1):      # one warm-up step, then the recorded ones
            with torch.profiler.record_function("forward"):
                loss = torch.nn.functional.nll_loss(torch.log_softmax(model(x), dim=-1), y)
            with torch.profiler.record_function("backward"):
                loss.backward()
            with torch.profiler.record_function("optimizer"):
                opt.step()
                opt.zero_grad()
            prof.step()                 # ProfilerStep#N spans; the trace is written when the steps are done
    return str(path)
