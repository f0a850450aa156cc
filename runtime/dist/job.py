"""What a hybrid training job is, and one rank of it (the code every process runs).

    job = DistJob.parse("demo:gpt", "torch:cpu=0.7,sim:npu-a1=0.3", steps=5)
    for record in run_rank(job, rank, world_size):  # inside a process group's process
        ...                                         # {"kind": "step"|"calibrate"|"rebalance"|"error", ...}

The job travels to child processes as JSON in OPSCOPE_DIST_JOB (nothing is unpickled); ranks,
world size and the rendezvous come from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), which opscope's own launcher sets the same way.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

from ..errors import UsageError

ENV_JOB = "OPSCOPE_DIST_JOB"
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class DistJob:
    model: str
    specs: list[str]
    ratios: list[float] | None = None       # None: measure them (--hybrid auto)
    steps: int = 5
    optimizer: str = "sgd"
    lr: float = 1e-2
    rebalance: bool = False
    tolerance: float = 0.10                 # re-balance when the slowest rank is this much over the mean
    patience: int = 2                       # ... for this many steps in a row
    probe_steps: int = 1
    timeout_s: float = 60.0                 # process-group timeout: a silent peer fails a collective after this
    switch_threshold: int = 0
    allow_fallback: bool = True
    hybrid: str = ""
    extra: dict = field(default_factory=dict)

    @classmethod
    def parse(cls, model: str, hybrid: str, **kw) -> "DistJob":
        """--hybrid: 'A=0.7,B=0.3', or measured: 'auto' (every available backend but numpy),
        'auto:A,B' or 'A=auto,B=auto'."""
        text = (hybrid or "").strip()
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if text == "auto":
            from ..backends import list_backends
            specs = [b["spec"] for b in list_backends() if b.get("available") and b["spec"] != "numpy"]
            ratios = None
        elif text.startswith("auto:"):
            specs, ratios = [p.strip() for p in text[5:].split(",") if p.strip()], None
        elif parts and all(p.endswith("=auto") for p in parts):
            specs, ratios = [p[:-5] for p in parts], None
        else:
            from ..hybrid import HybridStrategy
            named = [p.rpartition("=")[0].strip() for p in parts]
            if len(set(named)) != len(named):
                raise UsageError(f"--hybrid {text!r}: a backend is named twice; each share is one process")
            strategy = HybridStrategy.parse(text)          # the shares' own checks (numbers, sum to 1)
            specs, ratios = list(strategy.ratios), list(strategy.ratios.values())
            if not all(r > 0 for r in ratios):
                raise UsageError(f"--hybrid {text!r}: every share must be > 0 (drop a backend instead)")
        if len(specs) < 1 or not all(specs):
            raise UsageError(f"--hybrid {text!r}: expected BACKEND=SHARE[,...] (e.g. torch:cpu=0.7,sim:npu-a1=0.3) "
                             "or auto[:BACKEND,...]")
        if len(set(specs)) != len(specs):
            raise UsageError(f"--hybrid {text!r}: a backend is named twice; each share is one process")
        job = cls(model=model, specs=specs, ratios=ratios, hybrid=text, **kw)
        job.check()
        return job

    def check(self) -> None:
        if self.steps < 1:
            raise UsageError(f"--steps must be >= 1 (got {self.steps})")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise UsageError(f"--timeout must be > 0 seconds (got {self.timeout_s})")
        from .. import backends
        for spec in self.specs:                 # a backend that is not there fails here, once, not in N children
            backends.resolve(spec)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "DistJob":
        data = json.loads(text)
        if not isinstance(data, dict):
            raise UsageError(f"{ENV_JOB} is not a job description")
        return cls(**data)


def torchrun_env() -> dict | None:
    """rank, world_size, local_rank when this process was started by torchrun (or opscope's launcher)."""
    if not all(v in os.environ for v in TORCHRUN_VARS):
        return None
    try:
        return {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"]),
                "local_rank": int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))}
    except ValueError:
        raise UsageError("RANK / WORLD_SIZE / LOCAL_RANK must be integers (as torchrun sets them)")


def run_rank(job: DistJob, rank: int, world_size: int):
    """Join the process group, train, and yield this rank's records; leaves the group when done."""
    if world_size != len(job.specs):
        raise UsageError(f"{world_size} processes were started but --hybrid names {len(job.specs)} shares "
                         f"({', '.join(job.specs)}): start one process per share")
    from .. import models
    from ..comm import destroy_process_group, init_process_group
    from ..train.step import OptimizerSpec
    from .balance import Rebalancer
    from .trainer import DistTrainer

    engine = init_process_group(rank, world_size, "env://", timeout_s=job.timeout_s)
    try:
        model, inputs = models.load_train(job.model)
        length = int(inputs[0].shape[1]) if inputs and getattr(inputs[0], "dim", lambda: 0)() > 1 else 0
        ratios = job.ratios or [1.0] * world_size
        if length and length < job.switch_threshold:
            # below the switch threshold the first backend takes (nearly) the whole batch, as a
            # single-process hybrid run does; the others keep one row so every rank still has a share
            ratios = [1.0] + [0.0] * (world_size - 1)
        opt = OptimizerSpec(job.optimizer, lr=job.lr)
        trainer = DistTrainer(model, inputs, job.specs, ratios, rank, opt, name=job.model,
                              allow_fallback=job.allow_fallback)
        yield {"kind": "start", "rank": rank, "world_size": world_size, "backend": job.specs[rank],
               "engine": engine, "pid": os.getpid(), "rows": trainer.rows}
        if job.ratios is None:
            yield trainer.calibrate(job.probe_steps)
        if job.rebalance:
            trainer.rebalance = Rebalancer(trainer.ratios, tolerance=job.tolerance, patience=job.patience)
        for _ in range(job.steps):
            yield trainer.step()
        digest = f"{trainer.digest() & (2 ** 64 - 1):016x}"
        trainer.finish()
        yield {"kind": "done", "rank": rank, "parameters_digest": digest}
    finally:
        destroy_process_group()
