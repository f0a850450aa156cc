"""Elastic hybrid training: checkpoints every N steps, and a job that resumes from the last one with the
shares re-computed for the world size it restarts with; every change of size is a scale event in the run.

    torchrun --nnodes 1:2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:PORT --max-restarts 3 \\
        -m opscope.app train demo:mlp --hybrid torch:cpu=0.5,torch:cpu=0.5 --elastic --checkpoint-dir DIR
    ck = read_checkpoint(DIR)            # None, or Checkpoint(meta, headers): checked, never unpickled
    params = ck.load("param", model_params)   # the arrays, once each header matched the model's
    el = Elastic(job, trainer, rank, world); event = el.resume()     # restores the trainer; a scale event or None
    el.after_step()                      # rank 0 writes DIR/checkpoint.npz every N steps (tmp + os.replace)

torchrun's agents (torch.distributed.elastic, c10d rendezvous) restart every rank when a node leaves or joins;
a (re)started rank reads the checkpoint, takes the first WORLD shares of --hybrid (re-normalized; balance.split_rows
gives the rows) and continues at the step after the checkpoint. The global batch is the same at every world
size, so the parameters equal an uninterrupted run's. A rank whose collective fails writes DIR/left.json
(what it saw), which becomes the reason of the next shrink.

The file is a numpy .npz (a zip of .npy arrays plus one JSON entry), read the bounded way (runtime/safe_read.py):
a regular file only (a FIFO is refused, not waited on), each entry's header read and -- for the arrays -- compared
with the model's parameters before its data is, the meta's numbers range-checked. A pickle, a truncated file, a
header that claims 2 GiB or another model's tensors is refused with one line, and nothing in it is executed.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
import zipfile
from dataclasses import dataclass

import numpy as np

from ..dtypes import to_numpy
from ..errors import ModelError, UsageError
from .host_collectives import broadcast_
from ..safe_read import (MAX_RANKS, MAX_STEPS, checked_int, npy_header, open_regular, parse_json, read_bounded,
                         read_small_json)

CHECKPOINT = "checkpoint.npz"
LEFT = "left.json"                 # a rank's last words when a peer went away: the reason of the shrink
FORMAT, VERSION = "opscope-elastic-checkpoint", 1
MAX_BYTES = 8 * 2 ** 30            # uncompressed: a zip bomb is refused before anything is inflated
HOLD_ENV = "OPSCOPE_ELASTIC_HOLD"  # tests and demos: ranks wait before step S while this file holds a number <= S


class CheckpointError(UsageError):
    """A checkpoint opscope will not resume from; every rank finds the same one, so rank 0 alone says it."""


MAX_MEMBERS = 100_000              # a member per parameter and optimizer value; models hold a few thousand
MAX_META = 16 << 20                # the meta entry: the job, its step and its scale events
MAX_RATIO = 1100                   # deflate's ceiling is about 1032:1 (zeros): anything above is a lie
_MEMBER = re.compile(r"^(meta|(param|state)/[^/]+)\.npy$")
_DO = "delete it or pass another folder"


@dataclass
class Checkpoint:
    """A checked checkpoint: its meta, and each entry's shape and dtype from its .npy header. The arrays
    are read only by `load`, after their headers matched the model's (a 5 MB file may claim 2 GiB)."""
    folder: str
    meta: dict
    headers: dict[str, tuple[tuple, np.dtype]]     # "param/NAME" | "state/SLOT" -> (shape, dtype)

    @property
    def step(self) -> int:
        return self.meta["step"]

    @property
    def parameters(self) -> dict[str, np.ndarray]:
        return self.load("param")

    @property
    def state(self) -> dict[str, np.ndarray]:
        """The optimizer's carried values (momentum, Adam's moments, step count)."""
        return self.load("state")

    def load(self, group: str, want: dict[str, np.ndarray] | None = None, keep=None) -> dict[str, np.ndarray]:
        with _one_line():
            return self._load(group, want, keep)

    def _load(self, group: str, want: dict[str, np.ndarray] | None, keep=None) -> dict[str, np.ndarray]:
        """The `group` ("param" or "state") entries; with `want` (name -> the model's array), only once every
        header matched it -- so at most the model's own bytes are ever allocated. keep: read only these entries
        (a sharded rank's own; every header is still checked)."""
        have = {k.partition("/")[2]: v for k, v in self.headers.items() if k.startswith(group + "/")}
        what = "parameter" if group == "param" else "optimizer state"
        if want is not None:
            if set(have) != set(want):
                extra = sorted(set(have) ^ set(want))[:3]
                raise _bad(self.folder, f"holds other {what}s than this model's ({', '.join(extra)} ...)")
            for k, w in want.items():
                shape, dtype = have[k]
                if tuple(shape) != tuple(w.shape) or dtype != w.dtype:
                    raise _bad(self.folder, f"holds {what} {k} as {list(shape)} {dtype}; "
                               f"the model's is {list(w.shape)} {w.dtype}")
        with _open(self.folder) as (z, infos):
            return {k: _array(self.folder, z, infos[f"{group}/{k}"], *have[k]) for k in have
                    if keep is None or k in keep}


def _bad(folder: str, why: str) -> CheckpointError:
    return CheckpointError(f"--checkpoint-dir {folder}: {CHECKPOINT} {why}; {_DO}")


class _open:
    """The checkpoint's zip, opened the bounded way (a regular file; members vetted before any is read)."""

    def __init__(self, folder: str):
        self.folder = folder

    def __enter__(self):
        folder = self.folder
        self.f = open_regular(os.path.join(folder, CHECKPOINT), f"--checkpoint-dir {folder}: {CHECKPOINT}", _DO)
        try:
            if self.f.read(4) != b"PK\x03\x04":     # a pickle (or anything else) is never handed to a loader
                raise _bad(folder, "is not an opscope checkpoint (not a .npz archive; opscope never unpickles a file)")
            self.f.seek(0)
            self.z = zipfile.ZipFile(self.f)
            return self.z, _vetted(folder, self.z, os.fstat(self.f.fileno()).st_size)
        except UsageError:
            self.f.close()
            raise
        except Exception as e:        # zipfile raises many types on a damaged archive
            self.f.close()
            raise _bad(folder, f"is damaged or not an opscope checkpoint ({type(e).__name__}: {str(e)[:120]})") \
                from None

    def __exit__(self, *exc):
        self.z.close()
        self.f.close()


def _vetted(folder: str, z: zipfile.ZipFile, file_bytes: int) -> dict[str, zipfile.ZipInfo]:
    infos = z.infolist()
    if len(infos) > MAX_MEMBERS:
        raise _bad(folder, f"holds {len(infos)} entries, more than the {MAX_MEMBERS} opscope reads")
    if sum(i.file_size for i in infos) > MAX_BYTES:
        raise _bad(folder, f"would inflate past {MAX_BYTES >> 30} GiB")
    out = {}
    for i in infos:
        if not _MEMBER.match(i.filename) or i.filename in out:
            raise _bad(folder, f"holds an entry opscope does not write ({ascii(i.filename)[:80]})")
        if i.compress_size > file_bytes or i.file_size > MAX_RATIO * max(i.compress_size, 1):
            raise _bad(folder, f"entry {i.filename} claims {i.file_size} bytes from {i.compress_size} (more than "
                       "any real compression gives)")
        out[i.filename[:-4]] = i
    if "meta" not in out:
        raise _bad(folder, "has no readable meta entry (not written by opscope)")
    return out


def _header(folder: str, info: zipfile.ZipInfo, m) -> tuple[tuple, np.dtype, bool]:
    """An entry's .npy header (read from its open stream `m`) before anything is allocated for it: a header
    that claims more than the entry holds, or an object array (a pickle), stops here."""
    shape, dtype, fortran = npy_header(m, f"--checkpoint-dir {folder}: {CHECKPOINT} entry {info.filename}", _DO)
    if dtype.kind not in "fiub":
        raise _bad(folder, f"holds an entry opscope does not write ({info.filename!r}, {dtype})")
    if math.prod(shape) * dtype.itemsize > info.file_size:
        raise _bad(folder, f"entry {info.filename} claims {list(shape)} {dtype} but holds {info.file_size} bytes")
    return shape, dtype, fortran


def _array(folder: str, z: zipfile.ZipFile, info: zipfile.ZipInfo, shape, dtype) -> np.ndarray:
    """The entry's data: exactly the bytes of the (already compared) shape and dtype. Its header is read
    again here, since the file may have been replaced after it was checked."""
    try:
        with z.open(info) as m:
            got, got_dtype, fortran = _header(folder, info, m)
            if (got, got_dtype) != (tuple(shape), dtype):
                raise _bad(folder, f"changed while it was read (entry {info.filename}); run the job again")
            n = math.prod(shape) * dtype.itemsize
            data = m.read(n)
    except UsageError:
        raise
    except Exception as e:            # a CRC error, a truncated stream
        raise _bad(folder, f"is damaged ({type(e).__name__}: {str(e)[:120]})") from None
    if len(data) != n:
        raise _bad(folder, f"is damaged (entry {info.filename} is cut short)")
    a = np.frombuffer(data, dtype)
    return a.reshape(shape[::-1]).T.copy() if fortran else a.reshape(shape).copy()


def _headers(folder: str, z: zipfile.ZipFile, infos: dict) -> dict[str, tuple[tuple, np.dtype]]:
    out = {}
    for k, info in infos.items():
        try:
            with z.open(info) as m:
                out[k] = _header(folder, info, m)[:2]
        except UsageError:
            raise
        except Exception as e:
            raise _bad(folder, f"is damaged ({type(e).__name__}: {str(e)[:120]})") from None
    return out


class _one_line:
    """The bounded reader's refusals as CheckpointError: every rank finds them, rank 0 alone says them."""

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if isinstance(e, UsageError) and not isinstance(e, CheckpointError):
            raise CheckpointError(str(e)) from None
        return False


def read_checkpoint(folder: str) -> Checkpoint | None:
    """The checkpoint in `folder` (None when there is none yet) with its meta and headers checked, or one line
    saying what is wrong with it. No array is read here (`Checkpoint.load` reads them)."""
    with _one_line():
        return _read_checkpoint(folder)


def _read_checkpoint(folder: str) -> Checkpoint | None:
    if not os.path.lexists(os.path.join(folder, CHECKPOINT)):
        return None
    with _open(folder) as (z, infos):
        headers = _headers(folder, z, infos)
        meta_shape, meta_dtype = headers.pop("meta")
        if meta_dtype != np.uint8 or len(meta_shape) != 1 or meta_shape[0] > MAX_META:
            raise _bad(folder, "has no readable meta entry (not written by opscope)")
        raw = _array(folder, z, infos["meta"], meta_shape, meta_dtype).tobytes()
    meta = parse_json(raw, f"--checkpoint-dir {folder}: {CHECKPOINT}'s meta entry", _DO)
    if not (isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("version") == VERSION):
        raise _bad(folder, f"is not a version-{VERSION} opscope checkpoint")
    where = f"--checkpoint-dir {folder}: {CHECKPOINT}'s meta"
    for key, lo, hi in (("step", 0, MAX_STEPS), ("world_size", 1, MAX_RANKS), ("resumes", 0, MAX_STEPS)):
        checked_int(meta.get(key), where, key, lo, hi, _DO)
    for key, kind in (("events", list), ("model", str)):
        if not isinstance(meta.get(key), kind):
            raise _bad(folder, f"has a bad meta field {key!r} (expected {kind.__name__})")
    return Checkpoint(folder, meta, headers)


def write_checkpoint(folder: str, meta: dict, params: dict, state: dict) -> str:
    """Atomically: a reader (another rank, a restarted job) sees the old file or the new one, never half."""
    path = os.path.join(folder, CHECKPOINT)
    tmp = os.path.join(folder, f".{CHECKPOINT}.{os.getpid()}.tmp")
    arrays = {"meta": np.frombuffer(json.dumps({**meta, "format": FORMAT, "version": VERSION}).encode(), np.uint8)}
    # NOTE: np.require, not ascontiguousarray: that makes a 0-d value (AdamW's step count) 1-d, and the resumed
    # job then found the checkpoint's count shaped unlike its own
    arrays.update({f"param/{k}": np.require(v, requirements="C") for k, v in params.items()})
    arrays.update({f"state/{k}": np.require(v, requirements="C") for k, v in state.items()})
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
    if ck.step > job.steps:            # a job of --steps N never writes a checkpoint after a later step
        raise CheckpointError(f"--checkpoint-dir {job.checkpoint_dir}: {CHECKPOINT} is after step {ck.step}, past "
                              f"this job's --steps {job.steps}; pass --steps {ck.step} or more, or another folder")
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
        try:                          # bounded like every file a user points at: a FIFO ends the wait
            at = int(read_bounded(path, 64, HOLD_ENV, "").strip() or b"-1")
        except (UsageError, ValueError):
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

    def _layout(self) -> list[tuple[int, int | None]]:
        """(slot, the rank that keeps it) of the whole model's optimizer state, every shard's: a checkpoint holds
        all of it, so a job resumed on another number of ranks re-shards it. None: every rank keeps it (the
        step count, and every slot when nothing is sharded)."""
        t = self.trainer
        owner = {n: r for r, names in enumerate(t.shards) for n in names} if t.shards else {}
        out = [(c, owner.get(n)) for n, slots in t.optimizer.state_of.items() for c in slots]
        return sorted(out + [(c, None) for c in t.optimizer.shared_state])

    def _state(self) -> dict[str, np.ndarray]:
        """The whole optimizer state, on rank 0 (each sharded slot broadcast from its owner: every rank calls)."""
        opt = self.trainer.optimizer
        plan, out = opt.plan, {}
        for c, r in self._layout():
            if r is None or r == self.rank:
                v = np.asarray(plan.constant_backend[c].memory.to_host(plan.constants[c]))
            else:
                m = opt.graph.slot_meta[c]
                v = np.empty(m.shape, to_numpy(m.dtype))
            if r is not None:
                broadcast_(v, r)
            if self.rank == 0:
                out[str(c)] = v
        return out

    def _like(self) -> tuple[dict, dict]:
        """Stand-ins of the checkpoint's arrays (shape and dtype, no memory) to check it against."""
        t, opt = self.trainer, self.trainer.optimizer
        params = t.parameter_meta()
        state = {}
        for c, r in self._layout():       # a slot this rank keeps as it holds it; another's from the graph
            v = opt.plan.constants.get(c) if r is None or r == self.rank else None
            v = np.asarray(opt.plan.constant_backend[c].memory.to_host(v)) if v is not None else None
            shape, dtype = (v.shape, v.dtype) if v is not None else \
                (opt.graph.slot_meta[c].shape, to_numpy(opt.graph.slot_meta[c].dtype))
            state[str(c)] = np.broadcast_to(np.zeros((), dtype), shape)
        return params, state

    def resume(self) -> dict | None:
        """Restore parameters, optimizer state and step from the checkpoint; on rank 0 write it back with this
        incarnation's size (and its scale event). Returns the event, or None (a fresh start, the same size)."""
        ck, t = self.ck, self.trainer
        if ck is None:
            self._write()
            self._forget_left()
            return None
        want_params, want_state = self._like()
        # this rank's shard under this job's partition (the checkpoint's may have had other ranks): only its own
        # entries are read, so a sharded rank never holds the whole model's state (ZeRO-3: its parameters)
        mine = [c for c, r in self._layout() if r is None or r == self.rank]
        params = ck.load("param", want_params, keep=set(t.params))
        state = ck.load("state", want_state, keep={str(c) for c in mine})
        t.load_parameters(params)          # copied into the arrays every plan reads
        t.optimizer.set_state({c: state[str(c)] for c in mine})
        del params, state
        t.step_index = ck.step
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
        # sharded: the parameters (ZeRO-3) and the state come from every rank, so every rank takes part
        params, state = self.trainer.parameters(), self._state()
        if self.rank != 0:
            return
        self.meta["world_size"] = self.world
        write_checkpoint(self.job.checkpoint_dir, self.meta, params, state)

    def _forget_left(self) -> None:
        if self.rank != 0:
            return
        try:                      # its reason is in an event now (or stale): the next restart must not reuse it
            os.remove(os.path.join(self.job.checkpoint_dir, LEFT))
        except OSError:
            pass
