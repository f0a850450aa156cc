"""Debugger stepping speed on a model with 4M-element activations.

    python benchmarks/bench_debugger.py [--quick]

Prints, per op, the bare executor time (no hooks), one controller step (resume, run the op,
summarize inputs and outputs, post the stop) and one step through the TUI (Pilot: press n,
wait until the stop is on screen). The issue's bar: under 100 ms per step.
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one repetition each: a smoke run")
    args = ap.parse_args()
    reps = 1 if args.quick else 3
    s = session()
    print(f"model: {len(s.plan.steps)} ops on a {2048 * 2048 / 1e6:.1f}M-element float32 activation (numpy)")
    rows = []
    for r in range(reps):       # interleave the three so machine load hits them alike
        rows.append((bare_ms_per_op(s, 1), controller_ms_per_step(s, 1), pilot_ms_per_step(s, 1)))
    bare, ctl, pilot = (statistics.median(col) for col in zip(*rows))
    print(f"bare executor     {bare:8.2f} ms/op")
    print(f"controller step   {ctl:8.2f} ms/step   ({ctl / bare:.1f}x the bare op)")
    print(f"TUI step (pilot)  {pilot:8.2f} ms/step   ({pilot / bare:.1f}x the bare op)")
    print(f"bar: 100 ms/step -> controller {'OK' if ctl < 100 else 'OVER'}, TUI {'OK' if pilot < 100 else 'OVER'}")


if __name__ == "__main__":
    main()
