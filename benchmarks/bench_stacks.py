"""opscope on a real compiler stack vs eager PyTorch and vs the stack's own native route, interleaved.

    python benchmarks/bench_stacks.py [--model demo:gpt] [--repeat 30] [--threads 1] [--quick] [--clock cpu]

Sides, each run once per round (medians over rounds, so load on a shared machine hits every side alike):
  eager       model(*inputs) under torch.no_grad
  STACK       opscope's executor on `-b STACK` (regions compiled by the stack)
  STACK-native  the route a user of that stack takes without opscope (ONNX Runtime: an InferenceSession
              on torch.onnx.export of the whole model; OpenVINO: convert_model + compile_model, f32;
              XLA: the same jitted lowering called directly)
  STACK+prof  opscope with the stack's own per-op profiler on (RegionProfile: the step, profile set-up and read-back included)
  onnxruntime-run  opscope on ONNX Runtime with session.run(feeds) in place of I/O binding (the call before
              binding: how much the binding saves)
  inductor    torch.compile(model) with its default backend: the route a user tries first (--no-inductor skips it)
--clock cpu times each call by this process's CPU time (user + system, every thread) instead of the wall clock: on a
loaded shared machine a call's wall time counts the other processes' turns, its CPU time does not (with --threads 1
every side computes on one thread; XLA's CPU client may use more, which CPU time then counts in full).
Ratios: STACK / eager (aim <= 0.6 on two stacks; XLA never above 1), STACK / native (the abstraction's parity:
native / STACK >= 0.95), the best stack / inductor (aim <= 0.6), profiled / unprofiled. The order of the sides
rotates every round.
transformers' GPT-2, BERT and Llama (2 layers, hidden 256, seq 64): --model benchmarks/gpt2_block.py:gpt2 (:bert,
:llama). Each is one region on every stack now (tests/test_stacks_models.py pins the small configs' regions).
"""
from __future__ import annotations

import io
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_round_arguments, parse_round_arguments  # noqa: E402


def native_onnxruntime(model, inputs, threads: int):
    """An InferenceSession on torch's ONNX export of the whole model."""
    import onnxruntime as ort
    import torch
    f = io.BytesIO()
    torch._C._jit_set_onnx_log_output_stream("stderr")      # the exporter's graph dump on a refusal
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(model, inputs, f, dynamo=False, opset_version=17)
        except Exception as e:     # transformers' masks use aten::diff, which the TorchScript exporter lacks
            print(f"  onnxruntime-native: the TorchScript exporter refused the whole model ({type(e).__name__}); "
                  "trying torch.onnx.export(dynamo=True)")
            f = io.BytesIO()
            torch.onnx.export(model, inputs, f, dynamo=True, opset_version=18)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(f.getvalue(), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs)}
    return lambda: sess.run(None, feeds)


def native_openvino(model, inputs, threads: int):
    """convert_model + compile_model of the whole model, f32 (as opscope asks for)."""
    import openvino as ov
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        om = ov.convert_model(model, example_input=inputs)
    cfg = {"INFERENCE_PRECISION_HINT": "f32", **({"INFERENCE_NUM_THREADS": threads} if threads else {})}
    req = ov.Core().compile_model(om, "CPU", cfg).create_infer_request()
    arrays = [x.numpy() for x in inputs]
    return lambda: req.infer(arrays)


def without_binding(session):
    """The session's ONNX Runtime regions called through session.run(None, feeds), as before I/O binding."""
    import numpy as np
    for st in session.plan.steps:
        if st.node.op == "region":
            p = st.kernel
            p._call = lambda sess, binding, inputs, p=p: sess.run(
                None, {n: np.ascontiguousarray(x) for n, x in zip(p.names, inputs)})
    return session.run


def native_xla(session):
    """jax.jit of the same lowering, called directly (no executor around it)."""
    (st,) = [st for st in session.plan.steps if st.node.op == "region"]
    program = st.kernel
    arrays = [x.numpy() for x in session.inputs]
    return lambda: [o.block_until_ready() for o in program.fn(program.consts, *arrays)]


NATIVE = {"onnxruntime": native_onnxruntime, "openvino": native_openvino}
STACKS = ("onnxruntime", "openvino", "xla")          # the bundled stacks this script knows a native route for
OPTIONS = {"onnxruntime": "threads = {t}", "openvino": "threads = {t}", "xla": ""}


def main() -> None:
    import argparse

    import torch

    from opscope.runtime import models, registry
    from opscope.runtime.backends import BUNDLED
    from opscope.runtime.description import load
    from opscope.runtime.regions import RegionProfile
    from opscope.runtime.session import open_session
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_round_arguments(ap)
    ap.add_argument("--stacks", default=",".join(STACKS), help="comma-separated stacks to measure")
    ap.add_argument("--no-inductor", action="store_true", help="leave torch.compile's inductor side out")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="time each call by the wall clock (default) or by this process's CPU time (a loaded host)")
    a = parse_round_arguments(ap)
    torch.set_num_threads(a.threads)
    model, inputs = models.load(a.model)
    sides = {"eager": lambda: model(*inputs)}
    for stack in a.stacks.split(","):
        if not registry.get(stack).declared.available(load(BUNDLED / f"{stack}.toml"))[0]:
            print(f"  {stack}: not installed, skipped")
            continue
        text = (BUNDLED / f"{stack}.toml").read_text().replace("threads = 0", OPTIONS[stack].format(t=a.threads))
        chip = Path(f"/tmp/bench-stacks-{stack}-{a.threads}.toml")     # the bundled description at --threads
        chip.write_text(text)
        s = open_session(a.model, str(chip), model=model, inputs=inputs)
        prof = RegionProfile()

        def profiled(s=s, prof=prof):
            with s.executor.hooked(prof):
                s.run()
        sides[stack] = s.run
        try:
            sides[f"{stack}-native"] = NATIVE[stack](model, inputs, a.threads) if stack in NATIVE else native_xla(s)
        except Exception as e:     # the stack's own route cannot take the model whole: a finding, printed
            print(f"  {stack}-native: the stack's own route failed on the whole model: {type(e).__name__}: "
                  f"{str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}")
        sides[f"{stack}+prof"] = profiled
        if stack == "onnxruntime":
            sides["onnxruntime-run"] = without_binding(open_session(a.model, str(chip), model=model, inputs=inputs))
    if not a.no_inductor:
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(*inputs)                      # compile outside the timed rounds
        sides["inductor"] = lambda: compiled(*inputs)
    times = {k: [] for k in sides}
    names = list(sides)
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    with torch.no_grad():
        for r in range(a.warmup + a.repeat):
            for name in names[r % len(names):] + names[:r % len(names)]:      # rotated: drift hits every side
                fn = sides[name]
                t0 = clock()
                fn()
                if r >= a.warmup:
                    times[name].append(clock() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.model}, {a.threads} thread(s) (xla: all cores), {a.clock} time, medians of {a.repeat} interleaved "
          f"rounds, load average {os.getloadavg()[0]:.1f} at the end")
    for k, v in med.items():
        print(f"  {k:<22}{v * 1e3:9.2f} ms")
    for stack in [k for k in sides if k in STACKS]:
        parity = f"{med[stack + '-native'] / med[stack]:.2f}" if stack + "-native" in med else "n/a (no native run)"
        print(f"  {stack:<12} vs eager {med[stack] / med['eager']:.2f}x (aim <= 0.6)   parity native/opscope "
              f"{parity} (aim >= 0.95)   profiled/unprofiled {med[stack + '+prof'] / med[stack]:.2f}x")
    ran = [k for k in sides if k in STACKS]
    if "inductor" in med and ran:
        best = min(ran, key=lambda k: med[k])
        print(f"  best stack ({best}) vs torch.compile inductor {med[best] / med['inductor']:.2f}x (aim <= 0.6); "
              f"inductor vs eager {med['inductor'] / med['eager']:.2f}x")
    if "onnxruntime-run" in med:
        print(f"  onnxruntime I/O binding: bound/run {med['onnxruntime'] / med['onnxruntime-run']:.3f}x")


if __name__ == "__main__":
    main()
