"""Runtime overhead: demo:gpt forward through opscope (torch:cpu, no hooks) vs eager PyTorch,
and the numpy backend vs torch:cpu. Both sides run in this process, interleaved, repeated;
medians and ratios are printed.

    python benchmarks/bench_runtime.py [--quick] [--model demo:gpt] [--repeat 30]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness import add_round_arguments, parse_round_arguments
from opscope.runtime import open_session


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(ap)
    args = parse_round_arguments(ap)

    torch.set_num_threads(args.threads)
    torch_s = open_session(args.model, "torch:cpu")
    numpy_s = open_session(args.model, "numpy", model=torch_s.model, inputs=torch_s.inputs)
    model, inputs = torch_s.model, torch_s.inputs

    def eager():
        with torch.no_grad():
            model(*inputs)

    def opscope_torch():
        with torch.no_grad():
            torch_s.run()

    sides = {"eager PyTorch": eager, "opscope torch:cpu": opscope_torch, "opscope numpy": numpy_s.run}
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.warmup):
        for fn in sides.values():
            fn()
    for i in range(args.repeat):
        # Interleave, rotating the order each round so no side always runs after the same one.
        order = list(sides.items())
        order = order[i % len(order):] + order[:i % len(order)]
        for name, fn in order:
            times[name].append(_time(fn))

    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.model}: {len(torch_s.graph.nodes)} ops, {args.repeat} interleaved rounds, "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'side':<22}{'median ms':>12}{'min ms':>10}")
    for k, v in times.items():
        print(f"{k:<22}{med[k] * 1e3:>12.2f}{min(v) * 1e3:>10.2f}")
    print(f"{'ratio opscope torch:cpu / eager':<40}{med['opscope torch:cpu'] / med['eager PyTorch']:>8.3f}  (aim <= 1.05)")
    print(f"{'ratio opscope numpy / opscope torch:cpu':<40}{med['opscope numpy'] / med['opscope torch:cpu']:>8.3f}")


if __name__ == "__main__":
    main()
