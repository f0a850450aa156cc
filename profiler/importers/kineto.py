"""Chrome trace JSON: torch.profiler's `export_chrome_trace` (Kineto), our own export, or any other.

Kineto traces: every `cpu_op` event becomes an op event. Its name (`aten::linear`) is kept as the
node, so `op_stats(by="node")` lines up with torch.profiler's `key_averages()` name for name; the
op is the opscope op that ATen packet maps to (`linear`), or the ATen name when opscope has none.
`ProfilerStep#N` spans (torch.profiler schedules) become steps.

What the GPU did (`kernel`, `gpu_memcpy`, `gpu_memset`) becomes op events of its own, on a track per
device and stream: backend `cuda` (or the device kind the launch calls name: `xpu_runtime` -> `xpu`),
device `cuda:<args.device>`, thread = `args.stream`, op `kernel` / `memcpy` / `memset`, node = the
kernel's name as in the file, bytes = `args.bytes`, module = the cpu_op that launched it, step = the
step it was *launched* in (see gpu.py). A stream runs one kernel at a time: its rows never nest
(depth 0), even where the us -> ns rounding makes two overlap by a nanosecond. Matmul-family ops get FLOPs
and bytes from their recorded shapes (flops.py), once per nest. Everything else the trace holds -- Python
stacks, annotations, launches, memory samples, flows, kernel args, track names -- is kept by details.py,
and what is kept nowhere is counted by kind in the run's config (`import.kinds_dropped`).

Our own export (otherData.opscope): op events come back with their step, seq, node, module,
shapes and FLOPs; step spans and stacks are skipped.

Anything else: every complete (`X`) span and every `B`/`E` pair is an op event named as in the file.

Speed: a trace of a million events is read a column at a time (column_parser.py: one C-level pass
per group of fields, numpy for the times). Anything it does not expect -- B/E pairs, times that are
not numbers, events that are not objects -- hands the file to the event-by-event parser
(event_parser.py), which is also the one that says, in one line, what is wrong with a bad file.
What both share -- categories, the clock, track names, the last steps -- is in chrome.py.
"""
from __future__ import annotations

from .chrome import DEVICE_OPS, NS_MAX, Irregular, is_collective, is_step_span  # noqa: F401 (the names importers and views use)
from .column_parser import parse_columns
from opscope.runtime.errors import UsageError

from .common import JSON_ERRORS, EventTable, check_other_times, not_json, short, text
from .event_parser import parse_events
from . import typed

__all__ = ["DEVICE_OPS", "NS_MAX", "Irregular", "distributed_info", "is_chrome", "is_collective", "is_step_span",
           "parse", "parse_columns", "parse_events"]


def is_chrome(doc) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)) or \
        (isinstance(doc, list) and bool(doc) and all(isinstance(e, dict) and "ph" in e for e in doc[:100]))


def parse(doc, source: str, shift_ns: int = 0) -> tuple[EventTable, dict]:
    """-> (events, run fields: model, backend, device, steps, config). `shift_ns` moves every time (what a
    folder of per-rank traces uses to put the ranks on one clock)."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    other = doc.get("otherData") if isinstance(doc, dict) else None
    try:
        try:
            table, run = parse_columns(events, other, source, shift_ns)
        except Irregular:     # anything unusual: the event-by-event parser, which also names what is wrong
            if typed.is_typed(events):
                events = events.as_dicts()
            table, run = parse_events(events, other, source, shift_ns)
    except JSON_ERRORS:
        # only typed events get here: args kept as text until read (typed.KinetoEvent) that do not decode
        # (a number past a double's range). The file is refused as the dict road refuses it, word for word
        if not typed.is_typed(events):
            raise
        try:
            events.as_dicts()
        except JSON_ERRORS as e:
            raise not_json(source, e) from None
        raise
    check_other_times(events, source)
    dist = distributed_info(doc, source)
    if dist is not None:
        table.rank, table.world_size = dist["rank"], dist["world_size"]
        run["config"]["distributed"] = dist
    return table, run


MAX_WORLD_SIZE = 65536      # ranks in one job: a per-rank table is sized by it (the largest jobs run ~10^5 GPUs)


def distributed_info(doc, source: str = "") -> dict | None:
    """torch.profiler's `distributedInfo` (written when torch.distributed is initialised): {rank, world_size,
    backend}, or None when the trace has none (or it lacks rank or world_size). Present but wrong -- not
    whole numbers, world_size past MAX_WORLD_SIZE, a rank outside 0..world_size-1 -- is one line (exit 2):
    a world_size of 1e12 would size per-rank structures, and a rank past it is a trace of no job."""
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    if not isinstance(info, dict) or "rank" not in info or "world_size" not in info:
        return None
    rank, world = _whole(info.get("rank")), _whole(info.get("world_size"))
    problem = None
    if world is None or not 1 <= world <= MAX_WORLD_SIZE:
        problem = f"world_size is {short(info.get('world_size'))}, expected a whole number from 1 to {MAX_WORLD_SIZE}"
    elif rank is None or not 0 <= rank < world:
        problem = f"rank is {short(info.get('rank'))}, expected a whole number from 0 to world_size - 1 ({world - 1})"
    if problem:
        raise UsageError(f"cannot import {source or 'the trace'}: distributedInfo {problem}")
    return {"rank": rank, "world_size": world, "backend": text(info.get("backend")) or ""}


def _whole(v) -> int | None:
    """An int, or a float that is one (JSON writers may put 4.0); None for anything else."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None
