"""opscope on a real compiler stack vs eager PyTorch and vs the stack's own native route, interleaved.

    python benchmarks/bench_stacks.py [--model demo:gpt] [--repeat 30] [--threads 1] [--quick]

Sides, each run once per round (medians over rounds, so load on a shared machine hits every side alike):
  eager       model(*inputs) under torch.no_grad
  STACK       opscope's executor on `-b STACK` (regions compiled by the stack)
  STACK-native  the route a user of that stack takes without opscope (ONNX Runtime: an InferenceSession
              on torch.onnx.export of the whole model)
  STACK+prof  opscope with the stack's own per-op profiler on (RegionProfile)
Ratios: STACK / eager (aim <= 0.7), STACK / native (the abstraction's parity: native / STACK >= 0.95),
profiled / unprofiled.
"""
from __future__ import annotations

import io
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_round_arguments, parse_round_arguments  # noqa: E402


def native_onnxruntime(model, inputs, threads: int):
    import onnxruntime as ort
    import torch
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, f, dynamo=False, opset_version=17)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(f.getvalue(), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs)}
    return lambda: sess.run(None, feeds)


def main() -> None:
    import argparse

    import torch

    from opscope.runtime import models
    from opscope.runtime.backends import BUNDLED
    from opscope.runtime.regions import RegionProfile
    from opscope.runtime.session import open_session
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(ap)
    a = parse_round_arguments(ap)
    torch.set_num_threads(a.threads)
    model, inputs = models.load(a.model)
    chip = Path(f"/tmp/bench-stacks-ort-{a.threads}.toml")      # the bundled description at --threads
    chip.write_text((BUNDLED / "onnxruntime.toml").read_text().replace("threads = 0", f"threads = {a.threads}"))
    s = open_session(a.model, str(chip), model=model, inputs=inputs)
    prof = RegionProfile()

    def profiled():
        with s.executor.hooked(prof):
            s.run()
    sides = {"eager": lambda: model(*inputs), "onnxruntime": s.run,
             "onnxruntime-native": native_onnxruntime(model, inputs, a.threads), "onnxruntime+prof": profiled}
    times = {k: [] for k in sides}
    with torch.no_grad():
        for r in range(a.warmup + a.repeat):
            for name, fn in sides.items():
                t0 = time.perf_counter()
                fn()
                if r >= a.warmup:
                    times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.model}, {a.threads} thread(s), medians of {a.repeat} interleaved rounds")
    for k, v in med.items():
        print(f"  {k:<20}{v * 1e3:9.2f} ms")
    print(f"  onnxruntime / eager            {med['onnxruntime'] / med['eager']:.2f}x  (aim <= 0.7)")
    print(f"  native / onnxruntime (parity)  {med['onnxruntime-native'] / med['onnxruntime']:.2f}   (aim >= 0.95)")
    print(f"  profiled / unprofiled          {med['onnxruntime+prof'] / med['onnxruntime']:.2f}x")


if __name__ == "__main__":
    main()
