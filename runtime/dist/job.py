"""What a hybrid training job is, and one rank of it (the code every process runs).

    job = DistJob.parse("demo:gpt", "torch:cpu=0.7,sim:npu-a1=0.3", steps=5)
    for record in run_rank(job, rank, world_size):  # inside a process group's process
        ...                                         # {"kind": "start"|"step"|"calibrate"|"done"|"error", ...}
    DistJob.parse(..., shared_dir="/mnt/shared")    # every rank also writes its steps there (profiler/hybrid_rank.py)
    DistJob.parse(..., elastic=True, checkpoint_dir="/mnt/ck")   # 1..N ranks, resumed from a checkpoint (elastic.py)

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
    shared_dir: str = ""                    # each rank also writes its events here (profiler/shared.py)
    overlap: bool = False                   # all-reduce gradient buckets while backward runs (buckets.py)
    bucket_mb: float | None = None          # ... of this many MiB (None: buckets.auto_bucket_bytes)
    shard: str = ""                         # "optimizer": ZeRO-1, each rank keeps the optimizer state of its shard;
                                            # "gradients": ZeRO-2, its shard's reduced gradients too (reduce-scatter)
    sync_bn: bool = False                   # BatchNorm statistics over every rank's rows (sync_bn.py)
    elastic: bool = False                   # 1..len(specs) ranks, resumed from checkpoint_dir (elastic.py)
    checkpoint_dir: str = ""
    checkpoint_every: int = 10              # steps between checkpoints (and one after the last step)
    max_restarts: int = 3                   # resumes from the checkpoint before the job gives up
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
            from ..hybrid import SUM_TOLERANCE, HybridStrategy
            for p in parts:                                # each share's own checks (BACKEND=NUMBER)
                HybridStrategy.parse(p.rpartition("=")[0] + "=1" if "=" in p else p)
                try:
                    float(p.rpartition("=")[2])
                except ValueError:
                    HybridStrategy.parse(text)             # its one-line message for a share that is no number
            # a list, not HybridStrategy's dict: two ranks may run the same backend (two CPU processes)
            specs = [p.rpartition("=")[0].strip() for p in parts]
            ratios = [float(p.rpartition("=")[2]) for p in parts]
            if all(math.isfinite(r) for r in ratios) and abs(sum(ratios) - 1.0) > SUM_TOLERANCE:
                raise UsageError(f"--hybrid {text!r}: the shares sum to {sum(ratios):g}; they must sum to 1")
            if not all(math.isfinite(r) and r > 0 for r in ratios):
                raise UsageError(f"--hybrid {text!r}: every share must be > 0 (drop a backend instead)")
        if len(specs) < 1 or not all(specs):
            raise UsageError(f"--hybrid {text!r}: expected BACKEND=SHARE[,...] (e.g. torch:cpu=0.7,sim:npu-a1=0.3) "
                             "or auto[:BACKEND,...]")
        job = cls(model=model, specs=specs, ratios=ratios, hybrid=text, **kw)
        job.check()
        return job

    def check(self) -> None:
        if self.bucket_mb is not None and not (math.isfinite(self.bucket_mb) and self.bucket_mb > 0):
            raise UsageError(f"--bucket-mb must be > 0 (got {self.bucket_mb})")
        if self.shard not in ("", "optimizer", "gradients", "parameters"):
            raise UsageError(f"--shard {self.shard}: expected optimizer (ZeRO-1: each rank keeps its shard's optimizer "
                             "state), gradients (ZeRO-2: its shard's gradients too) or parameters (ZeRO-3: and only "
                             "its shard of the parameters)")
        if self.shard == "parameters":
            # NOTE: shares first: `auto` names every registered backend, and the line then was about backends the
            # user never typed
            if self.ratios is None or self.rebalance:
                raise UsageError("--shard parameters needs fixed shares (not auto, no --rebalance): a new split "
                                 "would capture the model again from parameters no rank holds whole")
            # every rank must take the same gather decisions in the same order (zero3.py): the same kind of plan
            others = [s for s in self.specs if not s.startswith("torch:")]
            if others:
                raise UsageError(f"--shard parameters needs every rank on a torch backend (got {', '.join(others)}): "
                                 "its gathers follow the plan's ops, which must be the same on every rank")
        if self.steps < 1:
            raise UsageError(f"--steps must be >= 1 (got {self.steps})")
        if self.elastic and not self.checkpoint_dir:
            raise UsageError("--elastic needs --checkpoint-dir DIR: restarted ranks resume from the last checkpoint "
                             "there (a folder every node reaches)")
        if self.checkpoint_dir and not self.elastic:
            raise UsageError("--checkpoint-dir is for --elastic jobs: add --elastic (or drop --checkpoint-dir)")
        if self.checkpoint_every < 1 or self.max_restarts < 0:
            raise UsageError(f"--checkpoint-every must be >= 1 and --max-restarts >= 0 "
                             f"(got {self.checkpoint_every}, {self.max_restarts})")
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


def _threads() -> int:
    import torch
    return torch.get_num_threads()


def mismatch(job: DistJob, world_size: int) -> str | None:
    """The one line for a process count that is not the number of shares (None when they agree); an elastic
    job runs on 1 to len(specs) ranks, the first shares of --hybrid."""
    if world_size == len(job.specs) or (job.elastic and 1 <= world_size <= len(job.specs)):
        return None
    if job.elastic:
        return (f"{world_size} processes were started but --hybrid names {len(job.specs)} shares "
                f"({', '.join(job.specs)}): an elastic job runs 1 to {len(job.specs)} ranks "
                f"(torchrun --nnodes 1:{len(job.specs)} --nproc-per-node 1)")
    return (f"{world_size} processes were started but --hybrid names {len(job.specs)} shares "
            f"({', '.join(job.specs)}): start one process per share (torchrun --nproc-per-node {len(job.specs)})")


def run_rank(job: DistJob, rank: int, world_size: int, records=None):
    """Join the process group, train, and yield this rank's records; leaves the group when done.
    `records(job, start)`: what keeps them (a context manager with keep(rec), records and writer); the tools pass
    one that also writes --shared-dir (profiler/hybrid_rank.py), the runtime alone keeps them in memory."""
    if mismatch(job, world_size):
        raise UsageError(mismatch(job, world_size))
    from .. import models
    from ..comm import destroy_process_group, init_process_group
    from ..train.step import OptimizerSpec
    from .balance import Rebalancer
    from .trainer import CollectiveFailed, DistTrainer, digest_of

    specs, asked = job.specs, job.ratios
    checkpoint = None
    if job.elastic:           # read before the group forms: a bad file fails every rank alike, at once
        from . import elastic
        checkpoint = elastic.check_resumable(job, world_size)
        specs, asked = elastic.shares_for(job, world_size)
    from .host_collectives import return_freed_memory
    return_freed_memory()           # a rank's resident set follows what it holds (host_collectives.py)
    engine = init_process_group(rank, world_size, "env://", timeout_s=job.timeout_s)
    try:
        model, inputs = models.load_train(job.model)
        length = int(inputs[0].shape[1]) if inputs and getattr(inputs[0], "dim", lambda: 0)() > 1 else 0
        ratios = asked or [1.0] * world_size
        if length and length < job.switch_threshold:
            # below the switch threshold the first backend takes (nearly) the whole batch, as a
            # single-process hybrid run does; the others keep one row so every rank still has a share
            ratios = [1.0] + [0.0] * (world_size - 1)
        opt = OptimizerSpec(job.optimizer, lr=job.lr)
        # rank 0's reference starts from the initial weights; the trainer makes the model's parameters views
        # of the ones it trains (one copy per process), so they wait on disk meanwhile
        initial = InitialWeights(model) if rank == 0 else None
        trainer = DistTrainer(model, inputs, specs, ratios, rank, opt, name=job.model,
                              allow_fallback=job.allow_fallback, overlap=job.overlap,
                              bucket_bytes=int(job.bucket_mb * 2 ** 20) if job.bucket_mb else None,
                              shard=job.shard, sync_bn=job.sync_bn)
        el = elastic.Elastic(job, trainer, rank, world_size, checkpoint) if job.elastic else None
        if el is not None:
            el.resume()
        start = {"kind": "start", "rank": rank, "world_size": world_size, "backend": specs[rank],
                 "engine": engine, "pid": os.getpid(), "rows": trainer.rows, "base": trainer.base,
                 "threads": _threads()}
        shared = (records or Records)(job, start)
        if shared.writer is not None:
            start["shared"] = str(shared.writer.folder)
        with shared:
            yield start
            for ev in (el.meta["events"] if el else []):    # this job's scale events so far, the new one last
                yield shared.keep({**ev, "rank": rank})
            if job.ratios is None:
                yield shared.keep(trainer.calibrate(job.probe_steps))
            if job.rebalance:
                trainer.rebalance = Rebalancer(trainer.ratios, tolerance=job.tolerance, patience=job.patience)
            while trainer.step_index < job.steps:
                if el is not None:
                    elastic.hold(trainer.step_index)
                try:
                    rec = trainer.step()
                except CollectiveFailed as e:
                    if el is not None:     # the reason of the shrink that follows
                        elastic.note_left(job, rank, world_size, trainer.step_index, str(e))
                    raise
                yield shared.keep(rec)
                if el is not None:
                    el.after_step()
            final = trainer.parameters()          # ZeRO-3: gathered from their owners, every rank takes part
            digest = f"{digest_of(final) & (2 ** 64 - 1):016x}"
            if rank == 0:
                initial.restore()
                yield shared.keep(_reference(job, model, inputs, opt, final, shared.records))
            del final
            trainer.finish()
            yield shared.keep({"kind": "done", "rank": rank, "parameters_digest": digest})
    finally:
        destroy_process_group()


def _reference(job: DistJob, model, inputs, opt, final: dict, records: list[dict]) -> dict:
    """Rank 0, after the last step: the same steps as one process on the full batch in eager PyTorch (what
    data parallelism must equal), and how far the job's loss per step and final parameters are from it."""
    from ..train.compare import _err, _errors, _worst, eager_steps
    ref = eager_steps(model, inputs, opt, job.steps)
    steps = [r for r in records if r.get("kind") == "step"]
    losses = [r["loss"] for r in steps]
    # an elastic job that resumed ran only the steps after its checkpoint: compare those
    want = [ref["losses"][r["step"]] for r in steps]
    params = _errors(final, ref["parameters"])
    import torch
    # BatchNorm in training mode normalizes with each rank's own rows (as DDP without SyncBatchNorm does) unless
    # --sync-bn: one process's statistics over the full batch differ, so the job cannot match it -- the report says so
    norms = [n or type(m).__name__ for n, m in model.named_modules()
             if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training]
    return {"kind": "reference", "rank": 0, "against": "one process, full batch, eager PyTorch",
            "batch_norm": norms, "sync_bn": job.sync_bn, "losses": ref["losses"], "loss_error": _err(losses, want),
            "parameter_error": _worst(params), "step_seconds": sorted(ref["step_seconds"])[len(ref["step_seconds"]) // 2]}


class InitialWeights:
    """A model's parameters as they are now, kept in a private temporary file (raw bytes, no pickle) until
    restore() puts them back into the model as its own tensors."""

    def __init__(self, model):
        import tempfile
        import torch
        self.model = model
        self.file = tempfile.TemporaryFile()
        self.meta = []
        for name, p in model.named_parameters():
            t = p.detach().contiguous()
            self.meta.append((name, t.dtype, tuple(t.shape), t.numel() * t.element_size()))
            if t.numel():
                self.file.write(memoryview(t.view(-1).view(torch.uint8).numpy()))
        self.file.flush()

    def restore(self) -> None:
        import numpy as np
        import torch
        params = dict(self.model.named_parameters())
        self.file.seek(0)
        for name, dtype, shape, nbytes in self.meta:
            raw = np.fromfile(self.file, np.uint8, count=nbytes)
            params[name].data = torch.from_numpy(raw).view(dtype).view(shape)
        self.file.close()


class Records:
    """A rank's records, kept for its reference check: no --shared-dir writer in the runtime (the tools' keeper,
    profiler/hybrid_rank.py SharedRank, writes the shared folder)."""
    writer = None

    def __init__(self, job: DistJob, start: dict):
        self.job, self.records = job, [start]

    def keep(self, rec: dict) -> dict:
        self.records.append(rec)
        return rec

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return False
