"""opscope on IREE (plugins/opscope-iree) vs eager PyTorch, vs IREE's own route and vs ONNX Runtime, interleaved.

    python benchmarks/bench_iree.py [--model demo:gpt] [--repeat 30] [--threads 1] [--quick]

Sides, each run once per round (medians over rounds; the order rotates every round):
  eager         model(*inputs) under torch.no_grad
  iree          opscope's executor on `-b iree` (llvm-cpu, local-task driver at --threads)
  iree-native   the route an IREE user takes without opscope: iree.turbine.aot.export of the whole model,
                compiled for llvm-cpu, its main() called directly
  iree+prof     opscope on iree with per-op spans on (RegionProfile: the step and the spans' read-back)
  onnxruntime   opscope's executor on `-b onnxruntime` at --threads
"""
from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_round_arguments, parse_round_arguments  # noqa: E402


def description(tmp: Path, name: str, body: str) -> str:
    path = tmp / f"bench-iree-{name}.toml"
    path.write_text(f'[backend]\nname = "{name}"\nimplementation = "{name}"\nfallback = "numpy"\n'
                    f"[backend.options]\n{body}\n[passes]\nfuse = false\n")
    return str(path)


def native_iree(model, inputs, threads: int):
    import iree.compiler as ic
    import iree.runtime as rt
    import iree.turbine.aot as aot
    from opscope_iree.program import _device
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = aot.export(model, *inputs)
    vmfb = ic.compile_str(str(exported.mlir_module), target_backends=["llvm-cpu"],
                          extra_args=["--iree-llvmcpu-target-cpu=host"])
    ctx = rt.SystemContext(config=rt.Config(device=_device({"device": "local-task", "threads": threads})))
    module = rt.VmModule.copy_buffer(ctx.instance, vmfb)
    ctx.add_vm_module(module)
    main, arrays = ctx.modules[module.name]["main"], [x.numpy() for x in inputs]

    def call():
        out = main(*arrays)
        return [o.to_host() for o in (out if isinstance(out, (list, tuple)) else [out])]
    return call


def main() -> None:
    import argparse
    import tempfile

    import torch

    from opscope.runtime import models
    from opscope.runtime.regions import RegionProfile
    from opscope.runtime.session import open_session
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(ap)
    a = parse_round_arguments(ap)
    torch.set_num_threads(a.threads)
    model, inputs = models.load(a.model)
    tmp = Path(tempfile.mkdtemp())
    iree = open_session(a.model, description(tmp, "iree", f"threads = {a.threads}"), model=model, inputs=inputs)
    ort = open_session(a.model, description(tmp, "onnxruntime", f"threads = {a.threads}"), model=model, inputs=inputs)
    prof = RegionProfile()

    def profiled():
        with iree.executor.hooked(prof):
            iree.run()
    sides = {"eager": lambda: model(*inputs), "iree": iree.run, "iree+prof": profiled, "onnxruntime": ort.run}
    try:
        sides["iree-native"] = native_iree(model, inputs, a.threads)
    except Exception as e:      # IREE's own route cannot take the model whole: a finding, printed
        print(f"  iree-native: failed on the whole model: {type(e).__name__}: {str(e).strip()[:160]}")
    times = {k: [] for k in sides}
    names = list(sides)
    with torch.no_grad():
        for r in range(a.warmup + a.repeat):
            for name in names[r % len(names):] + names[:r % len(names)]:
                t0 = time.perf_counter()
                sides[name]()
                if r >= a.warmup:
                    times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.model}, {a.threads} thread(s), medians of {a.repeat} interleaved rounds")
    for k, v in med.items():
        print(f"  {k:<14}{v * 1e3:9.2f} ms")
    parity = f"{med['iree-native'] / med['iree']:.2f}" if "iree-native" in med else "n/a"
    print(f"  iree vs eager {med['iree'] / med['eager']:.2f}x   vs onnxruntime {med['iree'] / med['onnxruntime']:.2f}x   "
          f"parity native/opscope {parity}   profiled/unprofiled {med['iree+prof'] / med['iree']:.2f}x")


if __name__ == "__main__":
    main()
