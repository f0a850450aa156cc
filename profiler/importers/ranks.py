"""A folder of per-rank torch.profiler traces -> one multi-rank run (the way HTA reads a trace folder).

    run_id = import_trace("traces/")      # rank0.json, rank1.json, ... (any names; .json or .json.gz)

Each trace says which rank it is in `distributedInfo` (torch.profiler writes it once torch.distributed is
initialised). The folder must hold exactly one trace per rank of one job: every rank 0..world_size-1 once,
with the same world_size; anything else is a folder of mixed runs and is refused in one line (exit 2). A folder
that holds some of a job's ranks (2 of 128: what was copied off the cluster) imports the ranks present, as HTA
analyses them; the run's config lists the missing ones (`ranks_missing`) and says so in `warnings`.

Clocks: each trace counts microseconds from its own `baseTimeNanoseconds` (the Unix time of its process's
clock origin), so base + ts puts every rank on the wall clock. Where a trace lacks it, every rank's first
ProfilerStep is taken to start at the same moment instead. The run's config says which (`clock`).
"""
from __future__ import annotations

from pathlib import Path

from opscope.runtime.errors import UsageError

from . import kineto
from .common import read_json, save

PATTERNS = ("*.json", "*.json.gz")


def trace_files(folder: Path) -> list[Path]:
    files = sorted({p for pat in PATTERNS for p in folder.glob(pat) if p.is_file()})
    if not files:
        raise UsageError(f"cannot import {folder}: no trace files ({', '.join(PATTERNS)}) in the folder")
    return files


def import_rank_folder(folder, store=None, max_bytes: int | None = None) -> str:
    folder = Path(folder)
    docs = []
    for f in trace_files(folder):
        doc = read_json(f, max_bytes)
        if not kineto.is_chrome(doc):
            raise UsageError(f"cannot import {folder}: {f.name} is not a torch.profiler trace (no 'traceEvents')")
        info = kineto.distributed_info(doc, str(f))
        if info is None:
            raise UsageError(f"cannot import {folder}: {f.name} has no distributedInfo (rank, world_size); a folder "
                             "import takes one torch.profiler trace per rank of a torch.distributed job")
        docs.append((f, doc, info))
    missing = _check_one_job(folder, docs)
    docs.sort(key=lambda d: d[2]["rank"])
    shifts, clock = _clock_shifts(folder, [doc for _, doc, _ in docs])

    tables, per_rank, steps = [], [], 0
    for (f, doc, info), shift in zip(docs, shifts):
        table, run = kineto.parse(doc, str(f), shift_ns=shift)
        if run["config"]["format"] != "kineto":
            raise UsageError(f"cannot import {folder}: {f.name} is not a torch.profiler (Kineto) trace")
        del doc                      # the parsed table is all that is needed from here on
        tables.append(table)
        steps = max(steps, run["steps"])
        per_rank.append({"rank": info["rank"], "file": f.name, "events": len(table), "steps": run["steps"],
                         "shift_ns": shift, "import": run["config"]["import"]})
    world = docs[0][2]["world_size"]
    config = {"format": "kineto", "world_size": world, "distributed": docs[0][2]["backend"], "clock": clock,
              "ranks": per_rank, "events": sum(map(len, tables)),
              "skipped": _summed(r["import"].get("kinds_dropped", {}) for r in per_rank),
              "import": {"kinds_kept": _summed(r["import"].get("kinds_kept", {}) for r in per_rank),
                         "kinds_dropped": _summed(r["import"].get("kinds_dropped", {}) for r in per_rank)}}
    if missing:
        more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
        config["ranks_missing"] = missing
        config["warnings"] = [f"{folder.name}: {len(docs)} of {world} ranks imported; rank(s) "
                              f"{', '.join(map(str, missing[:20]))}{more} have no trace in the folder (cross-rank "
                              "figures cover the ranks present)"]
    if store is None:
        from opscope.profiler.store import RunStore
        store = RunStore()
    return save(store, tables, model=f"import:{folder.resolve().name}", backend="torch.profiler", device="cpu",
                source=str(folder.resolve()), config=config, steps=max(1, steps))


def _check_one_job(folder: Path, docs: list) -> list[int]:
    """One trace per rank of one job, or one line saying how the folder mixes runs. -> the ranks missing."""
    worlds: dict[int, str] = {}
    for f, _, info in docs:
        worlds.setdefault(info["world_size"], f.name)
    if len(worlds) > 1:
        (w1, f1), (w2, f2) = list(worlds.items())[:2]
        raise UsageError(f"cannot import {folder}: it mixes runs: {f1} has world_size {w1}, {f2} has world_size {w2}")
    world = docs[0][2]["world_size"]
    seen: dict[int, str] = {}
    for f, _, info in docs:
        if info["rank"] in seen:
            raise UsageError(f"cannot import {folder}: it mixes runs: rank {info['rank']} is in both "
                             f"{seen[info['rank']]} and {f.name}")
        seen[info["rank"]] = f.name
    # world_size is bounded (kineto.MAX_WORLD_SIZE): listing the missing ones is cheap
    return [r for r in range(world) if r not in seen]


def _clock_shifts(folder: Path, docs: list) -> tuple[list[int], str]:
    """ns to add to each rank's times to put all ranks on one clock, and which clock that is."""
    bases = [base_time_ns(d) for d in docs]
    if all(b is not None for b in bases):
        lo = min(bases)
        return [b - lo for b in bases], "baseTimeNanoseconds"
    firsts = [first_step_ns(d) for d in docs]
    if all(t is not None for t in firsts):
        return [firsts[0] - t for t in firsts], "first ProfilerStep"
    raise UsageError(f"cannot import {folder}: its traces have neither baseTimeNanoseconds nor ProfilerStep spans, "
                     "so their clocks cannot be aligned")


def base_time_ns(doc) -> int | None:
    """`baseTimeNanoseconds`: the wall clock (Unix ns) the trace's microseconds count from."""
    v = doc.get("baseTimeNanoseconds") if isinstance(doc, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < kineto.NS_MAX else None


def first_step_ns(doc) -> int | None:
    """Where the first ProfilerStep starts (ns of the trace's own clock), or None when it has no steps."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    ts = [e.get("ts") for e in events or () if isinstance(e, dict) and kineto.is_step_span(e.get("name"), e.get("cat"))]
    ts = [t for t in ts if isinstance(t, (int, float)) and not isinstance(t, bool) and abs(t) < 1e15]
    return round(min(ts) * 1000) if ts else None


def _summed(counts) -> dict:
    out: dict = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out
