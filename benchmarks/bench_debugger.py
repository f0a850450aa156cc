"""Debugger stepping speed on a model with 4M-element activations.

    python benchmarks/bench_debugger.py [--quick] [--lockstep-only]

Prints, per op, the bare executor time (no hooks), one controller step (resume, run the op,
summarize inputs and outputs, post the stop), and two TUI figures:

    TUI latency   what a user sees: from the `n` action to the callback Textual runs once the screen
                  showing the stop has been composed (call_after_refresh), split into "stop handled"
                  (worker ran the op + stats, UI thread picked the event up) and "drawn" (panels
                  updated + screen composed). No polling of ours is inside these timestamps.
    TUI (pilot)   Pilot presses `n` and polls until the stop is rendered: adds Pilot's own waits.

    lockstep      a GPT-2-style block at batch 8, seq 512, hidden 512 (eager attention: a 16.8M-element
                  score matmul) on a sim chip with --reference numpy: TUI latency per `n` over every op
                  (the reference kernel once per op while the runs agree; exact max abs/rel). Bar: 1 s.

The machine may be shared: every figure is repeated (interleaved) and reported as median and min.
The issue's bar: under 100 ms per step.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from torch import nn

from opscope.debugger.controller import Controller, Stop
from opscope.runtime import open_session


class Wide(nn.Module):
    """Elementwise ops on a 4M-element activation: the debugger's overhead is not hidden by FLOPs."""

    def forward(self, x):
        for _ in range(6):
            x = torch.tanh(x * 1.01 + 0.1)
        return x


class Block(nn.Module):
    """A GPT-2 block with eager attention (the scores are a matmul, then softmax), as transformers runs it."""

    def __init__(self, hidden=512, heads=8):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) * (c // self.heads) ** -0.5
        att = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(att)
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln_2(x))))


def block_session():
    torch.manual_seed(0)
    return open_session("bench:gpt2-block", "sim:edge-gpu", model=Block().eval(), inputs=(torch.randn(8, 512, 512),))


def lockstep_latency_ms(s) -> list[float]:
    """Per `n` over the block's ops with --reference numpy: ms from the key to the drawn stop."""
    from opscope.debugger.app import DebuggerApp

    async def one():
        app = DebuggerApp(Controller(s, reference="numpy"), model="bench:gpt2-block")
        async with app.run_test(size=(160, 50)):
            async def drawn(k):
                while len(app.timings) < k:
                    await asyncio.sleep(0.002)
            await drawn(1)
            for i in range(1, len(s.plan.steps)):
                app.call_later(app.action_next)
                await drawn(i + 1)
            ops = [st.node.name for st in s.plan.steps[1:]]
            return [(a + b) * 1e3 for a, b in app.timings[1:]], ops

    return asyncio.run(one())


def session():
    torch.manual_seed(0)
    return open_session("bench:wide", "numpy", model=Wide().eval(), inputs=(torch.randn(2048, 2048),))


def bare_ms_per_op(s, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        s.run()
        times.append((time.perf_counter() - t0) * 1e3 / len(s.plan.steps))
    return statistics.median(times)


def controller_ms_per_step(s, reps: int) -> float:
    times = []
    for _ in range(reps):
        c = Controller(s)
        c.step()
        c.wait()
        n = len(s.plan.steps) - 1
        t0 = time.perf_counter()
        for _ in range(n):
            c.step()
            assert isinstance(c.wait(), Stop)
        times.append((time.perf_counter() - t0) * 1e3 / n)
        c.quit()
    return statistics.median(times)


def tui_latency_ms(s) -> list[tuple[float, float, float]]:
    """Per step: (total, until the stop is handled, until it is drawn), ms, measured inside the app."""
    from opscope.debugger.app import DebuggerApp

    async def one():
        app = DebuggerApp(Controller(s), model="bench:wide")
        async with app.run_test(size=(160, 50)):
            async def drawn(k):
                while len(app.timings) < k:
                    await asyncio.sleep(0.002)
            await drawn(1)                      # the first stop (autostart)
            for i in range(1, len(s.plan.steps)):
                app.call_later(app.action_next)     # as a key binding does: the action runs in the app
                await drawn(i + 1)
            return [(a * 1e3 + b * 1e3, a * 1e3, b * 1e3) for a, b in app.timings[1:]]

    return asyncio.run(one())


def pilot_ms_per_step(s, reps: int) -> float:
    from opscope.debugger.app import DebuggerApp

    async def one() -> float:
        app = DebuggerApp(Controller(s), model="bench:wide")
        async with app.run_test(size=(160, 50)) as pilot:
            async def at(seq):
                while not (isinstance(app.last_event, Stop) and app.last_event.seq == seq):
                    await asyncio.sleep(0.001)
                await pilot.pause()            # the stop is rendered
            await at(0)
            n = len(s.plan.steps) - 1
            t0 = time.perf_counter()
            for i in range(1, n + 1):
                await pilot.press("n")
                await at(i)
            return (time.perf_counter() - t0) * 1e3 / n

    return statistics.median(asyncio.run(one()) for _ in range(reps))


def _line(name, values, unit="ms/step"):
    med, lo = statistics.median(values), min(values)
    return f"{name:<22}{med:8.2f} {unit}  (min {lo:6.2f}, n={len(values)})", med


def lockstep_main(reps: int) -> None:
    s = block_session()
    print(f"lockstep: GPT-2-style block, batch 8 x seq 512 x hidden 512, {len(s.plan.steps)} ops on "
          f"{s.backend.name} vs numpy")
    times, slowest = [], (0.0, "")
    for _ in range(reps):
        per_op, ops = lockstep_latency_ms(s)
        times += per_op
        slowest = max([slowest] + list(zip(per_op, ops)))
    line, med = _line("TUI latency (n->drawn)", times)
    print(line + f"  slowest {slowest[0]:.0f} ms ({slowest[1]})")
    print(f"bar: 1000 ms median key-to-screen with --reference numpy -> {'OK' if med < 1000 else 'OVER'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one repetition each: a smoke run")
    ap.add_argument("--lockstep-only", action="store_true", help="only the GPT-2 block with --reference numpy")
    args = ap.parse_args()
    reps = 1 if args.quick else 5
    lockstep_main(1 if args.quick else 3)
    if args.lockstep_only:
        return
    s = session()
    print(f"model: {len(s.plan.steps)} ops on a {2048 * 2048 / 1e6:.1f}M-element float32 activation (numpy)")
    bare, ctl, pilot, lat = [], [], [], []
    for r in range(reps):       # interleave them so machine load hits them alike
        bare.append(bare_ms_per_op(s, 1))
        ctl.append(controller_ms_per_step(s, 1))
        lat += tui_latency_ms(s)
        pilot.append(pilot_ms_per_step(s, 1))
    b_line, b = _line("bare executor", bare, "ms/op  ")
    print(b_line)
    c_line, c = _line("controller step", ctl)
    print(c_line + f"  {c / b:.1f}x the bare op")
    t_line, t = _line("TUI latency (n->drawn)", [x[0] for x in lat])
    print(t_line + f"  {t / b:.1f}x the bare op")
    print(_line("  until stop handled", [x[1] for x in lat])[0])
    print(_line("  until drawn", [x[2] for x in lat])[0])
    p_line, p = _line("TUI step (pilot)", pilot)
    print(p_line + "  (includes Pilot's own waiting)")
    print(f"bar: 100 ms/step -> controller {'OK' if c < 100 else 'OVER'}, TUI latency {'OK' if t < 100 else 'OVER'}, "
          f"pilot {'OK' if p < 100 else 'OVER'}")


if __name__ == "__main__":
    main()
