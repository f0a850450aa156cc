"""Optimizer step, training step and peak memory of `opscope train` against eager PyTorch (issue 26).

    python benchmarks/bench_optim.py [--quick] [--models resnet18,gpt2-30m] [--repeat 15] [--no-rss]

On ResNet-18's parameters (transformers' ResNetConfig at resnet-18's shape: 11.7M) and a ~30M-parameter GPT-2:
(1) the optimizer step through opscope on torch:cpu (first optimizer op's start to the last one's end, inside a
    real Trainer.step, updating in place as an unwatched step does) vs eager torch.optim.AdamW(foreach=True).step()
    on the same gradients. Aim <= 1.1x.
(2) a whole training step (Trainer.step, unhooked) vs the eager step (zero_grad, forward, backward, AdamW foreach).
    Aim <= 1.05x.
(3) peak RSS of what `opscope train` runs (compare_with_eager: eager steps, then the same steps on torch:cpu) vs
    eager training alone, each side in its own fresh process (ru_maxrss and VmHWM). Aim <= 1.3x.
Sides run interleaved, the order rotating each round; medians are printed. One thread (--threads to change).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

STEPS_RSS = 3


def model(name: str):
    """(loss-returning model, inputs): random weights, seeded."""
    import torch
    import transformers
    torch.manual_seed(0)
    if name == "resnet18":
        cfg = transformers.ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                                        layer_type="basic", num_labels=1000)
        inner, x, y = transformers.ResNetForImageClassification(cfg), torch.randn(4, 3, 64, 64), \
            torch.randint(0, 1000, (4,))
    elif name == "gpt2-30m":
        cfg = transformers.GPT2Config(n_layer=6, n_head=8, n_embd=512, vocab_size=20000, n_positions=128,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
        inner = transformers.GPT2LMHeadModel(cfg)
        x = y = torch.randint(0, 20000, (2, 64))
    else:
        raise SystemExit(f"unknown model {name!r}: use resnet18 or gpt2-30m")

    class ByKeyword(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = inner

        def forward(self, x, labels):
            return self.model(x, labels=labels).loss
    return ByKeyword().train(), (x, y)


class OptimizerSpan:
    """An executor hook: wall ns from the first optimizer op's start to the last one's end. It reads no op's
    inputs after the op, so the trainer keeps its in-place updates (what an unwatched step runs)."""

    reads_inputs_after_op = False

    def __init__(self):
        self.start = self.end = 0

    def on_run_start(self, run) -> None:
        self.start = self.end = 0

    def after_op(self, call) -> None:
        if call.node.attrs.get("phase") == "optimizer":
            self.start = self.start or call.start_ns
            self.end = call.end_ns


def sides(name: str) -> dict:
    import copy

    import torch

    from opscope.runtime import backends
    from opscope.runtime.train import OptimizerSpec, Trainer
    m, inputs = model(name)
    opt = OptimizerSpec("adamw", lr=1e-4, weight_decay=0.01)
    trainer = Trainer.create(m, inputs, backends.resolve("torch:cpu"), opt, name=name)
    eager = copy.deepcopy(m)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=opt.lr, betas=opt.betas, eps=opt.eps,
                                  weight_decay=opt.weight_decay, foreach=True)
    n_params = sum(p.numel() for p in m.parameters())
    print(f"{name}: {n_params / 1e6:.1f}M parameters in {len(list(m.parameters()))} tensors, "
          f"{len(trainer.train.graph.nodes)} ops per step {trainer.phase_counts()}")
    span = OptimizerSpan()
    times: dict = {}

    def opscope_optimizer():
        with trainer.executor.hooked(span):
            trainer.step()
        return (span.end - span.start) / 1e9

    def eager_step():
        t0 = time.perf_counter()
        eager_opt.zero_grad(set_to_none=True)
        eager(*inputs).backward()
        t1 = time.perf_counter()
        eager_opt.step()
        t2 = time.perf_counter()
        times["eager AdamW(foreach).step"] = t2 - t1
        return t2 - t0

    def opscope_step():
        t0 = time.perf_counter()
        trainer.step()
        return time.perf_counter() - t0

    return {"opscope optimizer": opscope_optimizer, "eager step": eager_step, "opscope step": opscope_step}, times


def speed(name: str, repeat: int, warmup: int) -> dict:
    fns, side_times = sides(name)
    samples = {k: [] for k in [*fns, "eager AdamW(foreach).step"]}
    items = list(fns.items())
    for i in range(warmup + repeat):
        for key, f in items[i % len(items):] + items[:i % len(items)]:
            t = f()
            if i >= warmup:
                samples[key].append(t)
                if key == "eager step":
                    samples["eager AdamW(foreach).step"].append(side_times["eager AdamW(foreach).step"])
    med = {k: statistics.median(v) for k, v in samples.items()}
    print("  medians of %d interleaved rounds: " % repeat + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in med.items()))
    r1 = med["opscope optimizer"] / med["eager AdamW(foreach).step"]
    r2 = med["opscope step"] / med["eager step"]
    print(f"  (1) optimizer step opscope / eager AdamW(foreach=True): {r1:.3f}x (aim <= 1.1)")
    print(f"  (2) training step opscope torch:cpu / eager:            {r2:.3f}x (aim <= 1.05)")
    return {"optimizer_ratio": r1, "step_ratio": r2, "medians_ms": {k: v * 1e3 for k, v in med.items()}}


def rss_side(name: str, side: str) -> None:
    """One side of (3), in this fresh process: train, then print peak RSS (MiB) as JSON."""
    import resource

    import torch

    from opscope.runtime.train import OptimizerSpec, compare_with_eager, eager_steps
    torch.set_num_threads(1)
    m, inputs = model(name)
    opt = OptimizerSpec("adamw", lr=1e-4, weight_decay=0.01)
    if side == "eager":
        eager_steps(m, inputs, opt, STEPS_RSS)
    else:
        compare_with_eager(name, "torch:cpu", steps=STEPS_RSS, optimizer=opt, model=m, inputs=inputs)
    hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
    print(json.dumps({"ru_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "vmhwm_mib": hwm / 1024}))


def rss(name: str) -> dict:
    # NOTE: this parent has not imported torch: a child's ru_maxrss counts the RSS it was forked with
    out = {}
    for side in ("eager", "train"):
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--rss-side", side, "--models", name],
                           capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if p.returncode:
            raise SystemExit(f"rss side {side} of {name} failed:\n{p.stderr[-2000:]}")
        out[side] = json.loads(p.stdout.strip().splitlines()[-1])
    ratio = out["train"]["ru_maxrss_mib"] / out["eager"]["ru_maxrss_mib"]
    print(f"  (3) peak RSS `opscope train` (torch:cpu, {STEPS_RSS} steps) {out['train']['ru_maxrss_mib']:.0f} MiB / "
          f"eager alone {out['eager']['ru_maxrss_mib']:.0f} MiB: {ratio:.2f}x (aim <= 1.3; VmHWM "
          f"{out['train']['vmhwm_mib']:.0f} / {out['eager']['vmhwm_mib']:.0f})")
    return {"rss_ratio": ratio, **out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,gpt2-30m")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 3 rounds, 1 warm-up")
    ap.add_argument("--no-rss", action="store_true", help="skip (3)")
    ap.add_argument("--rss-side", choices=["eager", "train"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.repeat, args.warmup = 3, 1
    if args.rss_side:
        return rss_side(args.models, args.rss_side)
    names = args.models.split(",")
    memory = {} if args.no_rss else {n: rss(n) for n in names}     # first: before this process imports torch
    import torch
    torch.set_num_threads(args.threads)
    for n in names:
        if n in memory:
            print(f"{n}: peak RSS ratio {memory[n]['rss_ratio']:.2f}x")
        speed(n, args.repeat, args.warmup)


if __name__ == "__main__":
    main()
