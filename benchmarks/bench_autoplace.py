"""-b auto vs each stack alone, eager PyTorch and torch.compile's inductor, interleaved, one thread.

    python benchmarks/bench_autoplace.py [--models demo:gpt,gpt2,bert,llama,t5,vit] [--repeat 20] [--quick]

Per model (transformers' from tests/autoplace_models.py, tiny random-weight configs):
  search      -b auto's search in a fresh $OPSCOPE_HOME: seconds, candidates measured (with the cost model: the
              candidates it predicted; runtime/autoplace/predict.py, none while runtime/cost_model.py has no predict)
  eager       model(*inputs) under torch.no_grad
  auto        opscope's executor on the placement the search chose
  STACK       opscope on -b STACK alone (onnxruntime, openvino, xla), one intra-op thread
  inductor    torch.compile(model), default backend (--no-inductor leaves it out)
Times are the process's CPU time per call (all its threads; what a loaded shared machine does not inflate by
descheduling), medians; wall-clock medians are printed beside them.
Ratios (CPU time): best single stack / auto (aim >= 1.15 on two models, >= 0.97 on every one), auto / eager, auto / inductor
(aim <= 0.5). The sides run in a new random order every round (each follows every other alike); medians over
rounds, so a loaded machine hits every side alike.
One thread everywhere: torch, ONNX Runtime and OpenVINO (threads = 1), XLA (XLA_FLAGS, set before jax loads).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

# XLA's CPU client sizes its thread pool when jax loads: one thread, like the other sides
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
MODELS = "demo:gpt,gpt2,bert,llama,t5,vit"


def load(name: str):
    if name.startswith("demo:"):
        from opscope.runtime import models
        return models.load(name)
    import autoplace_models
    return autoplace_models.TRANSFORMERS[name]()


def single_stack(name, stack, model, inputs):
    """opscope on one stack, its intra-op threads at one (the description's own options, as -b STACK reads them)."""
    from opscope.runtime import registry
    from opscope.runtime.backends import resolve
    from opscope.runtime.capture import capture
    from opscope.runtime.executor import Executor, compile_plan
    backend = resolve(stack)
    if "threads" in registry.get(stack).options:
        backend.description.options = {**backend.description.options, "threads": 1}
    plan = compile_plan(capture(model, inputs, name=name), backend)
    ex = Executor(plan)
    return lambda: ex.run(*inputs)


def bench(name: str, a) -> dict:
    import torch

    from opscope.runtime import autoplace, registry
    from opscope.runtime.session import compare, open_session
    model, inputs = load(name)
    out = {"model": name}
    os.environ["OPSCOPE_HOME"] = tempfile.mkdtemp(prefix="bench-autoplace-")     # a fresh search, no cache
    autoplace.THREADS.set(1)
    t0 = time.perf_counter()
    s = open_session(name, f"auto:{a.stacks},torch:cpu", model=model, inputs=inputs)
    out["open_seconds"] = time.perf_counter() - t0
    auto = s.plan.placement.report()["auto"]
    out["search"] = auto["search"]
    out["segments"] = [(g["backend"], g["nodes"]) for g in auto["segments"]]
    out["max_abs_err"] = compare(s.run_host(), s.eager())["max_abs"]
    sides = {"eager": lambda: model(*inputs), "auto": s.run}
    stacks = [n for n in registry.names(kind="regions") if n in auto["candidates"] and n in a.stacks]
    for stack in stacks:
        try:
            sides[stack] = single_stack(name, stack, model, inputs)
        except Exception as e:          # a stack that cannot run the model alone: a finding, printed
            print(f"  {name}: {stack} alone failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    if not a.no_inductor:
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(*inputs)
        sides["inductor"] = lambda: compiled(*inputs)
    times = {k: [] for k in sides}
    walls = {k: [] for k in sides}
    names, shuffle = list(sides), random.Random(0).shuffle
    with torch.no_grad():
        for r in range(a.warmup + a.repeat):
            # NOTE: shuffled, not rotated: a call pays for what ran before it (caches full of another side's
            # weights, 0.15-0.3 ms on GPT-2's 0.6), and rotating a fixed order keeps every side's predecessor --
            # auto always followed eager and timed 0.68x ONNX Runtime alone on the very same program
            shuffle(names)
            for side in names:
                t, w = time.process_time(), time.perf_counter()
                sides[side]()
                if r >= a.warmup:
                    times[side].append(time.process_time() - t)
                    walls[side].append(time.perf_counter() - w)
    out["median"] = {k: statistics.median(v) for k, v in times.items()}
    out["wall"] = {k: statistics.median(v) for k, v in walls.items()}
    out["stacks"] = [k for k in stacks if k in out["median"]]
    return out


def report(r: dict) -> list[str]:
    med = r["median"]
    best = min(r["stacks"], key=lambda k: med[k]) if r["stacks"] else None
    se = r["search"]
    lines = [f"{r['model']}: CPU " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in med.items()),
             "  wall " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in r["wall"].items()),
             f"  auto placed {' + '.join(f'{b}[{n}]' for b, n in r['segments'])}; max abs err vs eager "
             f"{r['max_abs_err']:.1e}",
             f"  search {se.get('seconds', 0):.1f} s, {se.get('candidates_measured', 0)} candidates measured, "
             f"{se.get('candidates_predicted', 0)} predicted by the cost model; {se.get('segments')} segments "
             f"({se.get('distinct_segments')} distinct), winner of the end-to-end check: {se.get('winner')}"]
    if best:
        lines.append(f"  best single stack {best}: {med[best] / med['auto']:.2f}x auto's speed (aim >= 1.15 on two "
                     f"models, never below 0.97)")
    lines.append(f"  auto vs eager {med['auto'] / med['eager']:.2f}x" +
                 (f"   auto vs inductor {med['auto'] / med['inductor']:.2f}x (aim <= 0.5)" if "inductor" in med else ""))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--stacks", default="onnxruntime,openvino,xla",
                    help="the stacks auto chooses among and each is compared with alone")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="5 rounds, 1 warm-up")
    ap.add_argument("--no-inductor", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.repeat, a.warmup = 5, 1
    import torch
    torch.set_num_threads(1)
    print(f"-b auto, 1 thread, CPU time per call, medians of {a.repeat} interleaved rounds")
    for name in a.models.split(","):
        for line in report(bench(name, a)):
            print(line, flush=True)


if __name__ == "__main__":
    main()
