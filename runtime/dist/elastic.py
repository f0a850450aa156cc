"""Elastic hybrid training: checkpoints every N steps, and a job that resumes from the last one with the
shares re-computed for the world size it restarts with; every change of size is a scale event in the run.

    torchrun --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT --max-restarts 3 \\
        -m opscope.app train demo:mlp --hybrid torch:cpu=0.5,torch:cpu=0.5 --elastic --checkpoint-dir DIR
    ck = read_checkpoint(DIR)            # None, or Checkpoint(meta, parameters, state): checked, never unpickled
    el = Elastic(job, trainer, rank, world); event = el.resume()     # restores the trainer; a scale event or None
    el.after_step()                      # rank 0 writes DIR/checkpoint.npz every N steps (tmp + os.replace)

torchrun's agents (torch.distributed.elastic, c10d rendezvous) restart every rank when a node leaves or joins;
a (re)started rank reads the checkpoint, takes the first WORLD shares of --hybrid (re-normalized; balance.split_rows
gives the rows) and continues at the step after the checkpoint. The global batch is the same at every world
size, so the parameters equal an uninterrupted run's. A rank whose collective fails writes DIR/left.json
(what it saw), which becomes the reason of the next shrink.

The file is a numpy .npz read with allow_pickle=False (a zip of .npy arrays plus one JSON entry): a pickle,
a truncated file or another model's tensors is refused with one line, and nothing in it is executed.
"""
from __future__ import annotations

import json
import os
import time
import zipfile
from dataclasses import dataclass

import numpy as np

from ..errors import ModelError, UsageError
from ..home import read_small_json

CHECKPOINT = "checkpoint.npz"
LEFT = "left.json"                 # a rank's last words when a peer went away: the reason of the shrink
FORMAT, VERSION = "opscope-elastic-checkpoint", 1
MAX_BYTES = 8 * 2 ** 30            # uncompressed: a zip bomb is refused before anything is inflated
HOLD_ENV = "OPSCOPE_ELASTIC_HOLD"  # tests and demos: ranks wait before step S while this file holds a number <= S


class CheckpointError(UsageError):
    """A checkpoint opscope will not resume from; every rank finds the same one, so rank 0 alone says it."""


@dataclass
class Checkpoint:
    meta: dict
    parameters: dict[str, np.ndarray]
    state: dict[str, np.ndarray]        # the optimizer's carried values (momentum, Adam's moments, step count)

    @property
    def step(self) -> int:
        return self.meta["step"]


def _bad(folder: str, why: str) -> CheckpointError:
    return CheckpointError(f"--checkpoint-dir {folder}: {CHECKPOINT} {why}; delete it or pass another folder")


def read_checkpoint(folder: str) -> Checkpoint | None:
    """The checkpoint in `folder` (None when there is none yet), or one line saying what is wrong with it."""
    path = os.path.join(folder, CHECKPOINT)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _bad(folder, f"cannot be read ({e.strerror or e})") from None
    if magic != b"PK\x03\x04":          # a pickle (or anything else) is never handed to a loader
        raise _bad(folder, "is not an opscope checkpoint (not a .npz archive; opscope never unpickles a file)")
    try:
        with zipfile.ZipFile(path) as z:
            if sum(i.file_size for i in z.infolist()) > MAX_BYTES:
                raise _bad(folder, f"would inflate past {MAX_BYTES >> 30} GiB")
            for info in z.infolist():
                _check_header(folder, z, info)
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except UsageError:
        raise
    except (ValueError, OSError, EOFError, KeyError, MemoryError, zipfile.BadZipFile, zipfile.LargeZipFile) as e:
        raise _bad(folder, f"is damaged or not an opscope checkpoint ({type(e).__name__}: {str(e)[:120]})") from None
    try:
        meta = json.loads(bytes(arrays.pop("meta")).decode())
    except (KeyError, ValueError, TypeError):
        raise _bad(folder, "has no readable meta entry (not written by opscope)") from None
    if not (isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("version") == VERSION):
        raise _bad(folder, f"is not a version-{VERSION} opscope checkpoint")
    for key, kind in (("step", int), ("world_size", int), ("resumes", int), ("events", list), ("model", str)):
        if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
            raise _bad(folder, f"has a bad meta field {key!r} (expected {kind.__name__})")
    if meta["step"] < 0 or meta["world_size"] < 1:
        raise _bad(folder, "has a negative step or an empty world")
    params, state = {}, {}
    for key, value in arrays.items():
        group, _, name = key.partition("/")
        if group not in ("param", "state") or not name or value.dtype.kind not in "fiub":
            raise _bad(folder, f"holds an entry opscope does not write ({key!r}, {value.dtype})")
        (params if group == "param" else state)[name] = value
    return Checkpoint(meta, params, state)


def _check_header(folder: str, z: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    """An entry's .npy header before numpy allocates for it: numpy sizes the array from the header, so a
    header that claims more than the entry holds (or an object array: a pickle) stops here."""
    with z.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise _bad(folder, f"holds an entry of .npy version {version}, which opscope does not write")
    if dtype.hasobject:
        raise _bad(folder, f"holds an object array ({info.filename}: a pickle, which opscope never loads)")
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize > info.file_size:
        raise _bad(folder, f"entry {info.filename} claims {list(shape)} {dtype} but holds {info.file_size} bytes")


def write_checkpoint(folder: str, meta: dict, params: dict, state: dict) -> str:
    """Atomically: a reader (another rank, a restarted job) sees the old file or the new one, never half."""
    path = os.path.join(folder, CHECKPOINT)
    tmp = os.path.join(folder, f".{CHECKPOINT}.{os.getpid()}.tmp")
    arrays = {"meta": np.frombuffer(json.dumps({**meta, "format": FORMAT, "version": VERSION}).encode(), np.uint8)}
    arrays.update({f"param/{k}": np.ascontiguousarray(v) for k, v in params.items()})
    arrays.update({f"state/{k}": np.ascontiguousarray(v) for k, v in state.items()})
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def check_resumable(job, world: int) -> Checkpoint | None:
    """Before the process group forms (every rank alike): the checkpoint is sound, is this model's, and the
    job has not resumed more than --max-restarts times."""
    ck = read_checkpoint(job.checkpoint_dir)
    if ck is None:
        return None
    if ck.meta["model"] != job.model:
        raise _bad(job.checkpoint_dir, f"is of model {ck.meta['model']!r}, not {job.model!r}")
    if ck.step < job.steps and ck.meta["resumes"] >= job.max_restarts:
        raise ModelError(f"the job resumed {ck.meta['resumes']} times (--max-restarts {job.max_restarts}); stopping "
                         f"with the checkpoint after step {ck.step} in {job.checkpoint_dir}")
    return ck


def shares_for(job, world: int) -> tuple[list[str], list[float] | None]:
    """The first `world` shares of --hybrid, re-normalized: what a job that shrank or grew runs."""
    ratios = job.ratios[:world] if job.ratios else None
    return job.specs[:world], None if ratios is None else [r / sum(ratios) for r in ratios]


def note_left(job, rank: int, world: int, step: int, message: str) -> None:
    """A rank saw a peer go away: say so where the next incarnation looks (best effort: it is leaving)."""
    tmp = os.path.join(job.checkpoint_dir, f".{LEFT}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump({"rank": rank, "world_size": world, "step": step, "message": message}, f)
        os.replace(tmp, os.path.join(job.checkpoint_dir, LEFT))
    except OSError:
        pass


MAX_LEFT = 64 << 10


def _read_left(folder: str) -> dict | None:
    # the checkpoint folder is shared: what another node wrote there is read bounded, its message cut short
    left = read_small_json(os.path.join(folder, LEFT), MAX_LEFT)
    if not (isinstance(left, dict) and isinstance(left.get("message"), str)):
        return None
    return {**left, "message": left["message"][:500]}


def hold(step: int) -> None:
    """OPSCOPE_ELASTIC_HOLD=FILE: wait before `step` while FILE holds a number <= step (a test or a demo
    paces the job so a node can leave or join at a known step; torchrun's SIGTERM ends the wait)."""
    path = os.environ.get(HOLD_ENV)
    while path:
        try:
            with open(path) as f:
                at = int(f.read().strip() or "-1")
        except (OSError, ValueError):
            return
        if at > step or at < 0:
            return
        time.sleep(0.1)


class Elastic:
    """One rank's side of an elastic job: restore from the checkpoint, record the scale event, checkpoint."""

    def __init__(self, job, trainer, rank: int, world: int, checkpoint: Checkpoint | None):
        self.job, self.trainer, self.rank, self.world, self.ck = job, trainer, rank, world, checkpoint
        self.meta = {"model": job.model, "hybrid": job.hybrid, "steps": job.steps, "step": 0, "world_size": world,
                     "resumes": 0, "events": []}

    # the optimizer plan's carried values other than the parameters: its state between steps
    def _state_slots(self) -> list[int]:
        opt = self.trainer.optimizer
        params = set(opt.param_slots.values())
        return sorted(c for c in opt.plan.carry if c not in params and opt.plan.constants.get(c) is not None)

    def _state(self) -> dict[str, np.ndarray]:
        plan = self.trainer.optimizer.plan
        return {str(c): np.asarray(plan.constant_backend[c].memory.to_host(plan.constants[c]))
                for c in self._state_slots()}

    def resume(self) -> dict | None:
        """Restore parameters, optimizer state and step from the checkpoint; on rank 0 write it back with this
        incarnation's size (and its scale event). Returns the event, or None (a fresh start, the same size)."""
        ck, t = self.ck, self.trainer
        if ck is None:
            self._write()
            self._forget_left()
            return None
        want_p = {k: v for k, v in t.parameters().items()}
        want_s = self._state()
        for have, want, what in ((ck.parameters, want_p, "parameter"), (ck.state, want_s, "optimizer state")):
            if set(have) != set(want):
                extra = sorted(set(have) ^ set(want))[:3]
                raise _bad(self.job.checkpoint_dir, f"holds other {what}s than this model's ({', '.join(extra)} ...)")
            for k in want:
                if have[k].shape != want[k].shape or have[k].dtype != want[k].dtype:
                    raise _bad(self.job.checkpoint_dir, f"holds {what} {k} as {list(have[k].shape)} {have[k].dtype}; "
                               f"the model's is {list(want[k].shape)} {want[k].dtype}")
        opt, plan = t.optimizer, t.optimizer.plan
        params = {k: v.copy() for k, v in ck.parameters.items()}
        opt.set_parameters(params)
        for c in self._state_slots():
            plan.constants[c] = plan.constant_backend[c].memory.to_device(ck.state[str(c)].copy())
        for gs in t._steps.values():
            gs.set_parameters(params)
        t.params, t.step_index = params, ck.step
        self.meta.update(step=ck.step, resumes=ck.meta["resumes"] + (ck.step < self.job.steps),
                         events=list(ck.meta["events"]))
        event = self._event(ck)
        if event is not None:
            self.meta["events"].append(event)
        self._write()
        self._forget_left()
        return event

    def _event(self, ck: Checkpoint) -> dict | None:
        old, new, step = ck.meta["world_size"], self.world, ck.step
        left = _read_left(self.job.checkpoint_dir)
        if old == new and left is None:
            return None
        direction = "shrink" if new < old else "grow" if new > old else "restart"
        where = f"resumed from the checkpoint after step {step} with {new} rank(s)"
        if left is not None:
            seen = (f"rank {left.get('rank')} of {left.get('world_size')} saw: {left['message']}")
        if direction == "grow":
            reason = f"{new - old} rank(s) joined (torchrun's rendezvous admitted a new node); {where}"
        elif direction == "shrink":
            reason = f"{old - new} rank(s) left" + (f" ({seen})" if left else "") + f"; {where}"
        else:
            reason = f"a rank failed ({seen}) and torchrun restarted the job at the same size; {where}"
        rows = self.trainer.rows
        return {"kind": "scale", "direction": direction, "step": step, "from_ranks": old, "to_ranks": new,
                "n": len(ck.meta["events"]), "rows": rows, "backends": list(self.trainer.specs),
                "new_ratios": [round(r, 4) for r in self.trainer.ratios], "reason": reason}

    def after_step(self) -> None:
        step = self.trainer.step_index
        if step % max(1, self.job.checkpoint_every) == 0 or step >= self.job.steps:
            self.meta["step"] = step
            self._write()

    def _write(self) -> None:
        if self.rank != 0:
            return
        self.meta["world_size"] = self.world
        write_checkpoint(self.job.checkpoint_dir, self.meta, self.trainer.parameters(), self._state())

    def _forget_left(self) -> None:
        if self.rank != 0:
            return
        try:                      # its reason is in an event now (or stale): the next restart must not reuse it
            os.remove(os.path.join(self.job.checkpoint_dir, LEFT))
        except OSError:
            pass
