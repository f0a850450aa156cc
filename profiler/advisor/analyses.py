"""Analyses over one run: the numbers the rules reason about.

`analyze(run, events, description)` returns a plain dict of sections (`time`, `roofline`,
`overhead`, `fallback`, `transfers`, `dtype`, `layout`, `memory`, `gaps`, `fusion`, `dominant`,
`whatif`, `device`, `train`, `ranks`, `hw`, `run`); rule expressions name its values (`fallback.seconds`, `hw.kind`).
All times are seconds per step; shares are fractions of the step's busy time.

Imported torch.profiler traces nest ops (aten::linear holds aten::addmm) and carry what the GPU ran
(kernels, copies): the step's busy time counts top-level host ops once, the op analyses see host ops
only, and `device` says how much of each step the GPU streams were busy.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, fields

import numpy as np

from opscope.runtime.description import Description
from opscope.runtime.ops import OPS
from opscope.runtime.roofline import bound as roofline_bound
from opscope.profiler.importers.kineto import DEVICE_OPS
from opscope.profiler.store import run_description

from . import whatif

# the sections every analysis dict has: rule files are checked against these names at load time
SECTIONS = ("run", "hw", "time", "roofline", "overhead", "fallback", "transfers", "dtype", "layout", "memory",
            "gaps", "fusion", "dominant", "whatif", "device", "train", "ranks")

_FUSABLE = ("elementwise", "activation")
_CONV = ("conv2d", "conv1d", "conv3d", "convolution", "conv_transpose2d")


@dataclass
class RunData:
    """A run as the advisor sees it: its row, its op events (one dict each), its description."""

    run: dict
    events: list[dict]
    description: Description | None
    steps: int


def load(run_id: str, store=None) -> RunData:
    from opscope.profiler.store import RunStore
    store = store or RunStore()
    run = store.get_run(run_id)
    cols = ["step", "seq", "op", "node", "backend", "device", "depth", "start_ns", "end_ns", "input_dtypes",
            "output_dtypes", "bytes", "flops", "fallback", "live_bytes", "phase", "rank"]
    frame = store.events_frame(run["run_id"], columns=cols)
    return from_frame(run, frame)


def from_frame(run: dict, frame: dict) -> RunData:
    n = len(frame["op"]) if frame else 0
    # Columns as Python lists once (a numpy element read per field per event cost 28 s of a 1M-event advise),
    # and a dtype per distinct pair of dtype texts (a run has a handful; json.loads per event cost 22 s)
    col = {k: (v.tolist() if hasattr(v, "tolist") else list(v)) for k, v in frame.items()} if n else {}
    dtypes: dict = {}

    def dtype_of(i):
        key = (col["input_dtypes"][i], col["output_dtypes"][i])
        if key not in dtypes:
            dtypes[key] = _first_float(key[0]) or _first_float(key[1]) or "float32"
        return dtypes[key]
    on_device = {}
    events = []
    for i in range(n):
        op, start, end = str(col["op"][i]), int(col["start_ns"][i]), int(col["end_ns"][i])
        if op not in on_device:
            on_device[op] = op in DEVICE_OPS
        events.append({
            "step": int(col["step"][i]), "seq": int(col["seq"][i]), "op": op,
            "node": str(col["node"][i]), "backend": str(col["backend"][i]),
            "start": start, "end": end, "seconds": max(end - start, 0) / 1e9,
            "bytes": _int(col["bytes"][i]), "flops": _int(col["flops"][i]),
            "fallback": bool(col["fallback"][i]), "live_bytes": _int(col["live_bytes"][i]), "dtype": dtype_of(i),
            "depth": _int(col["depth"][i]) if "depth" in col else 0,
            "device": str(col["device"][i]) if "device" in col else "",
            "on_device": on_device[op],
            "phase": str(col["phase"][i]) if "phase" in col else "forward",
            "rank": _int(col["rank"][i]) if "rank" in col else 0})
    steps = len({e["step"] for e in events}) or 1
    return RunData(run, events, description_of(run), steps)


def description_of(run: dict) -> Description | None:
    """The description the run was recorded with (so later edits to the file do not rewrite history)."""
    d = run_description(run)
    if not d:
        return None
    known = {f.name for f in fields(Description)}
    return Description(**{k: v for k, v in d.items() if k in known})


def _int(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return 0


# a run's config is JSON someone else may have written (an imported run, a shared store): a field that should
# be a table or a list and is not counts as absent, a number that is not one as 0
def _dict(v) -> dict:
    return v if isinstance(v, dict) else {}


def _list(v) -> list:
    return v if isinstance(v, list) else []


def _float(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return f if np.isfinite(f) else 0.0


def _first_float(text) -> str | None:
    """The first float dtype in an event's dtypes (JSON text of a list). Stored data is the importer's, from a
    file anyone may have written: anything but a list (a number, an object) says no dtype, never a TypeError."""
    if not text:
        return None
    try:
        dts = json.loads(text) if isinstance(text, str) else text
    except (ValueError, RecursionError):
        return None
    if not isinstance(dts, (list, tuple)):
        return None
    for d in dts:
        if isinstance(d, str) and d.startswith(("float", "bfloat")):
            return d
    return None


# --- the analyses ----------------------------------------------------------------------------
def analyze(data: RunData) -> dict:
    run, evs, d, steps = data.run, data.events, data.description, data.steps
    d = d or Description(name=run.get("backend") or "?", implementation="unknown")
    kernels = [e for e in evs if e.get("on_device")]
    evs = [e for e in evs if not e.get("on_device")]
    busy = sum(e["seconds"] for e in evs if not e.get("depth")) / steps
    a = {
        "run": {"id": run.get("run_id"), "model": run.get("model"), "backend": run.get("backend"),
                "steps": steps, "ops": len(evs) // steps, "simulated": d.implementation == "sim",
                # an imported trace: no model here to re-run, tune or apply advice to
                "imported": run.get("engine") == "import"},
        "hw": _hw(d),
        "time": {"seconds": busy, "wall_seconds": _wall(evs) / steps},
    }
    a["overhead"] = _overhead(evs, d, busy, steps)
    a["roofline"] = _roofline(evs, d, busy, steps, a["overhead"]["per_op_seconds"])
    a["fallback"], a["transfers"] = _fallback(evs, d, busy, steps)
    a["dtype"] = _dtype(evs, d, busy, steps)
    a["layout"] = _layout(evs, d, busy, steps)
    a["memory"] = _memory(evs, d)
    a["gaps"] = _gaps(evs, busy, steps)
    a["fusion"] = _fusion(evs, d, busy, steps, a["overhead"]["per_op_seconds"])
    a["dominant"] = _dominant(evs, busy, steps)
    a["whatif"] = _whatif(evs, d, busy, steps)
    a["device"] = _device(kernels, evs, steps)
    a["train"] = _train(evs, run, busy, steps)
    a["ranks"] = _ranks(data.events, run)
    return a


def _train(evs, run, busy, steps) -> dict:
    """A training run's phases: the optimizer's share, activation memory at the peak (what activation
    checkpointing would save and cost), and in a script profile the host time between steps."""
    info = _dict(_dict(run.get("config")).get("train"))
    per = {p: sum(e["seconds"] for e in evs if e["phase"] == p and not e.get("depth")) / steps
           for p in ("forward", "backward", "optimizer")}
    out = {"is_training": per["backward"] > 0 or per["optimizer"] > 0, "script": bool(info.get("script")),
           "optimizer": str(info.get("optimizer") or ""),
           "forward_seconds": per["forward"], "backward_seconds": per["backward"],
           "optimizer_seconds": per["optimizer"], "optimizer_share": _share(per["optimizer"], busy),
           "optimizer_ops": sum(1 for e in evs if e["phase"] == "optimizer") // steps,
           "peak_bytes": 0, "activation_bytes": 0, "activation_share": 0.0, "checkpoint_saved_bytes": 0,
           "recompute_seconds": 0.0, "recompute_share": 0.0,
           "step_gap_seconds": 0.0, "step_gap_share": 0.0, "step_gaps": 0}
    peak = _dict(_dict(info.get("memory_timeline")).get("peak"))
    if _int(peak.get("bytes")) > 0:
        act = _int(peak.get("activation", 0))
        n_fwd = max(sum(1 for e in evs if e["phase"] == "forward") // steps, 1)
        # sqrt(n) checkpointing (Chen et al. 2016): keep about 2/sqrt(n) of the activations, recompute one forward
        saved = int(act * max(0.0, 1 - 2 / n_fwd ** 0.5))
        out.update({"peak_bytes": _int(peak["bytes"]), "activation_bytes": act,
                    "activation_share": _share(act, peak["bytes"]), "checkpoint_saved_bytes": saved,
                    "recompute_seconds": per["forward"], "recompute_share": _share(per["forward"], busy)})
    bounds = {}
    for e in evs:
        if e["op"].startswith("profiler:"):    # torch's record_function bookkeeping (Optimizer.step's exit)
            continue
        lo, hi = bounds.get(e["step"], (e["start"], e["end"]))
        bounds[e["step"]] = (min(lo, e["start"]), max(hi, e["end"]))
    order = sorted(bounds)
    gaps = [max(bounds[b][0] - bounds[a][1], 0) for a, b in zip(order, order[1:])]
    if gaps:
        gap = sum(gaps) / len(gaps) / 1e9
        out.update({"step_gap_seconds": gap, "step_gap_share": _share(gap, busy + gap), "step_gaps": len(gaps)})
    return out


def _device(kernels, host, steps) -> dict:
    """How busy the GPU streams were (an imported torch.profiler trace): their kernels' union over each
    step's wall time, host ops and kernels together. Idle time there is time the GPU waited for the host."""
    if not kernels:
        return {"kernels": 0, "name": "", "busy_seconds": 0.0, "step_seconds": 0.0, "idle_seconds": 0.0,
                "idle_share": 0.0, "busy_share": 0.0}
    busy = wall = 0
    kernels_by, host_by = _by_step(kernels), _by_step(host)
    for step in sorted(kernels_by):
        ks = sorted((e["start"], e["end"]) for e in kernels_by[step])
        every = ks + [(e["start"], e["end"]) for e in host_by.get(step, ())]
        wall += max(e for _, e in every) - min(s for s, _ in every)
        end = None
        for s, e in ks:                               # the union: streams may overlap
            if end is None or s > end:
                busy += e - s
                end = e
            elif e > end:
                busy += e - end
                end = e
    names = sorted({e["device"] or e["backend"] for e in kernels})
    busy_s, wall_s = busy / 1e9 / steps, wall / 1e9 / steps
    return {"kernels": len(kernels) // steps, "name": ", ".join(names), "busy_seconds": busy_s,
            "step_seconds": wall_s, "idle_seconds": max(wall_s - busy_s, 0.0),
            "busy_share": _share(busy_s, wall_s), "idle_share": _share(max(wall_s - busy_s, 0.0), wall_s)}


def _hw(d: Description) -> dict:
    f32 = d.peak("float32")
    fast, ratio = None, 1.0
    for dt in ("bfloat16", "float16"):          # float16 wins a tie: numpy runs it natively on sim chips
        p = float(d.peak_flops.get(dt) or 0.0)
        if f32 and p / f32 >= ratio and p > f32:
            fast, ratio = dt, p / f32
    return {"name": d.name, "kind": d.kind, "implementation": d.implementation, "roofline": whatif.has_roofline(d),
            "peak_float32": f32, "peak_float16": d.peak("float16"), "peak_bfloat16": d.peak("bfloat16"),
            "fast_dtype": fast or "", "fast_ratio": ratio, "memory_bandwidth": d.memory_bandwidth,
            "memory_capacity": d.memory_capacity, "launch_overhead": d.launch_overhead,
            "host_bandwidth": d.host_bandwidth, "preferred_layout": d.preferred_layout}


def _by_step(evs) -> dict[int, list[dict]]:
    """The events of each step, in their order. A filter of every event per step was steps x events: hours for
    a 1M-event run of thousands of steps."""
    out: dict[int, list[dict]] = {}
    for e in evs:
        out.setdefault(e["step"], []).append(e)
    return out


def _wall(evs) -> float:
    total = 0
    for s in _by_step(evs).values():
        total += max(e["end"] for e in s) - min(e["start"] for e in s)
    return total / 1e9


def _overhead(evs, d, busy, steps) -> dict:
    """Time a kernel costs just for being launched. The description says it for described chips;
    elsewhere the median view op (which computes nothing) is the best measure of dispatch cost."""
    per_op = d.launch_overhead
    source = "description"
    if not per_op:
        views = [e["seconds"] for e in evs if OPS.get(e["op"]) is not None and OPS[e["op"]].kind == "view"]
        per_op = float(np.median(views)) if views else 0.0
        source = "view ops"
    n = len(evs) / steps
    # an op cannot spend longer launching than it took in all: on GPT-2 on a sim chip 126 ops x 8 us was
    # 181 % of a 555 us step, because most ops there take less than a launch
    seconds = min(sum(min(per_op, e["seconds"]) for e in evs if not e.get("depth")) / steps, busy)
    return {"per_op_seconds": per_op, "source": source, "ops": n, "seconds": seconds,
            "share": _share(seconds, busy)}


def _share(x, total) -> float:
    """x as a fraction of total, never above 1: every numerator here is part of its total, and a rounding or
    a clock edge must not print 100.3 %."""
    return min(float(x / total), 1.0) if total > 0 else 0.0


def _roofline(evs, d, busy, steps, per_op) -> dict:
    per: dict[str, dict] = {}
    shares = {"compute": 0.0, "memory": 0.0, "overhead": 0.0, "unknown": 0.0}
    for e in evs:
        if e["op"] == "transfer" or e["fallback"]:
            b = "unknown"
        elif whatif.has_roofline(d):
            b = roofline_bound(e["flops"], e["bytes"], e["dtype"], d)
        elif per_op and e["seconds"] <= 2 * per_op:
            b = "overhead"          # no roofs to compare with, but it took no longer than a launch
        else:
            b = "unknown"
        shares[b] += e["seconds"]
        r = per.setdefault(e["op"], {"op": e["op"], "calls": 0, "seconds": 0.0, "flops": 0, "bytes": 0,
                                     "bounds": {}})
        r["calls"] += 1
        r["seconds"] += e["seconds"]
        r["flops"] += e["flops"]
        r["bytes"] += e["bytes"]
        r["bounds"][b] = r["bounds"].get(b, 0.0) + e["seconds"]
    rows = []
    for r in per.values():
        r["bound"] = max(r["bounds"], key=r["bounds"].get)
        r["intensity"] = r["flops"] / r["bytes"] if r["bytes"] else 0.0
        r["achieved_flops"] = r["flops"] / r["seconds"] if r["seconds"] else 0.0
        r["seconds"] /= steps
        r["calls"] //= steps
        r["share"] = _share(r["seconds"], busy)
        del r["bounds"]
        rows.append(r)
    rows.sort(key=lambda r: -r["seconds"])
    total = sum(shares.values()) or 1.0
    out = {f"{k}_share": v / total for k, v in shares.items()}
    out["ridge_intensity"] = d.peak("float32") / d.memory_bandwidth if whatif.has_roofline(d) else 0.0
    out["ops"] = rows
    return out


def _fallback(evs, d, busy, steps) -> tuple[dict, dict]:
    """Fallback ops, ranked by what implementing them natively would save: their own time plus the
    transfers they cause, minus what the chip would take to run them ("which op to implement next")."""
    by_node = {(e["step"], e["node"]): e for e in evs}
    per: dict[str, dict] = {}
    last_fb: dict[int, dict] = {}
    tr_count = tr_bytes = 0
    tr_seconds = 0.0
    for e in sorted(evs, key=lambda e: (e["step"], e["seq"])):
        if e["op"] == "transfer":
            payload = e["bytes"]          # a transfer's bytes are the one copy that crosses the link
            tr_count += 1
            tr_bytes += payload
            tr_seconds += e["seconds"]
            # transfer_<consumer>_<slot>: into a fallback op, or back out of the last one that ran
            consumer = by_node.get((e["step"], _consumer(e["node"])))
            owner = consumer if consumer is not None and consumer["fallback"] else last_fb.get(e["step"])
            if owner is not None:
                r = _fb_row(per, owner)
                r["transfer_bytes"] += payload
                r["transfer_seconds"] += e["seconds"]
            continue
        if e["fallback"]:
            last_fb[e["step"]] = e
            r = _fb_row(per, e)
            r["calls"] += 1
            r["seconds"] += e["seconds"]
            r["native_seconds"] += whatif.native_seconds([e], d)
            if e["node"] not in r["nodes"]:
                r["nodes"].append(e["node"])
    rows = []
    for r in per.values():
        for k in ("seconds", "transfer_seconds", "native_seconds"):
            r[k] /= steps
        r["calls"] //= steps
        r["transfer_bytes"] //= steps
        r["cost_seconds"] = r["seconds"] + r["transfer_seconds"]
        r["gain_seconds"] = max(r["cost_seconds"] - r["native_seconds"], 0.0)
        r["share"] = _share(r["cost_seconds"], busy)
        rows.append(r)
    rows.sort(key=lambda r: -r["gain_seconds"])
    fb_seconds = sum(r["seconds"] for r in rows)
    fallback = {"count": len(rows), "calls": sum(r["calls"] for r in rows), "seconds": fb_seconds,
                "share": _share(fb_seconds, busy), "transfer_bytes": sum(r["transfer_bytes"] for r in rows),
                "transfer_seconds": sum(r["transfer_seconds"] for r in rows), "ops": rows,
                "gain_seconds": sum(r["gain_seconds"] for r in rows)}
    transfers = {"count": tr_count // steps, "bytes": tr_bytes // steps, "seconds": tr_seconds / steps,
                 "share": _share(tr_seconds / steps, busy)}
    return fallback, transfers


def _consumer(name: str) -> str:
    # transfer_<consumer node>_<slot>; node names may themselves contain underscores
    body = name[len("transfer_"):] if name.startswith("transfer_") else name
    return body.rsplit("_", 1)[0]


def _fb_row(per, e) -> dict:
    return per.setdefault(e["op"], {"op": e["op"], "backend": e["backend"], "calls": 0, "seconds": 0.0,
                                    "transfer_bytes": 0, "transfer_seconds": 0.0, "native_seconds": 0.0,
                                    "nodes": []})


def _dtype(evs, d, busy, steps) -> dict:
    """How much of the time runs in float32 on a chip whose peak is higher in a narrower dtype."""
    hw = _hw(d)
    fast = hw["fast_dtype"]
    f32 = [e for e in evs if e["dtype"] == "float32" and not e["fallback"] and e["op"] != "transfer"]
    f32_seconds = sum(e["seconds"] for e in f32) / steps
    out = {"current": _mode([e["dtype"] for e in evs if e["op"] != "transfer"]) or "float32",
           "fast": fast, "ratio": hw["fast_ratio"], "float32_seconds": f32_seconds,
           "float32_share": _share(f32_seconds, busy), "before_seconds": 0.0, "after_seconds": 0.0,
           "gain_seconds": 0.0, "gain_fraction": 0.0, "ops": [], "model_before_seconds": 0.0,
           "model_after_seconds": 0.0, "rescaled": False, "basis": ""}
    if not fast or not whatif.has_roofline(d):
        return out
    est = whatif.dtype_estimate(evs, d, fast)
    # NOTE: the roofline is a model; on a chip whose ops are measured it can be 4x the step. Before it is
    # compared with anything it is rescaled to the measured time of the same ops: the model gives the ratio
    # after / before, the measurement gives before
    measured = sum(e["seconds"] for e in evs if not (e["fallback"] and e["op"] != "transfer")) / steps
    model = est["before_seconds"] / steps
    scale = measured / model if model > 0 else 0.0
    out.update({"model_before_seconds": model, "model_after_seconds": est["after_seconds"] / steps,
                "rescaled": abs(scale - 1.0) > 1e-9, "before_seconds": measured,
                "after_seconds": est["after_seconds"] / steps * scale,
                "gain_seconds": min(est["gain_seconds"] / steps * scale, measured)})
    out["basis"] = (f"the roofline ({model * 1e3:.3f} ms -> {out['model_after_seconds'] * 1e3:.3f} ms modelled), "
                    f"rescaled to the measured time of the same ops" if out["rescaled"] else "the roofline")
    out["gain_fraction"] = _share(out["gain_seconds"], busy)
    per: dict[str, float] = {}
    for e in f32:
        per[e["op"]] = per.get(e["op"], 0.0) + whatif.event_seconds(e, d) - whatif.event_seconds(e, d, dtype=fast)
    out["ops"] = [op for op, g in sorted(per.items(), key=lambda kv: -kv[1]) if g > 0][:5]
    return out


def _mode(values):
    counts: dict = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return max(counts, key=counts.get) if counts else None


def _layout(evs, d, busy, steps) -> dict:
    """Convolutions arrive NCHW (PyTorch's default); a chip that prefers NHWC pays a layout change on
    the way in and out of each one, which is what switching the model's layout would save."""
    convs = [e for e in evs if e["op"] in _CONV]
    conv_seconds = sum(e["seconds"] for e in convs) / steps
    transform = 0.0
    if d.preferred_layout == "nhwc" and d.memory_bandwidth:
        # a modelled cost: it cannot save more than the measured time of the convolutions it is paid around
        transform = min(sum(2 * e["bytes"] / d.memory_bandwidth for e in convs) / steps, conv_seconds)
    return {"current": "nchw", "preferred": d.preferred_layout, "mismatch": bool(convs) and d.preferred_layout != "nchw",
            "conv_calls": len(convs) // steps, "conv_seconds": conv_seconds, "conv_share": _share(conv_seconds, busy),
            "transform_seconds": transform, "nodes": sorted({e["node"] for e in convs})[:10]}


def _memory(evs, d) -> dict:
    peak = max((e["live_bytes"] for e in evs), default=0)
    cap = d.memory_capacity
    return {"peak_bytes": peak, "capacity_bytes": cap, "ratio": _share(peak, cap) if cap else 0.0}


def _gaps(evs, busy, steps) -> dict:
    gaps = []
    by_step = _by_step(evs)
    for step in sorted(by_step):
        s = sorted(by_step[step], key=lambda e: e["start"])
        end = None
        for e in s:
            if end is not None and e["start"] > end:
                gaps.append(e["start"] - end)
            end = e["end"] if end is None else max(end, e["end"])
    total = sum(gaps) / 1e9 / steps
    return {"seconds": total, "count": len(gaps) // steps, "largest_seconds": max(gaps, default=0) / 1e9,
            "share": _share(total, busy + total)}


def _fusion(evs, d, busy, steps, per_op) -> dict:
    """Runs of consecutive small elementwise ops: fused, they launch once and keep intermediates
    out of memory (the bytes each one writes and the next one reads back)."""
    chains, cur = [], []
    first_step = min((e["step"] for e in evs), default=0)
    for e in sorted((e for e in evs if e["step"] == first_step), key=lambda e: e["seq"]):
        kind = OPS[e["op"]].kind if e["op"] in OPS else ""
        if kind in _FUSABLE and not e["fallback"]:
            cur.append(e)
            continue
        if len(cur) >= 2:
            chains.append(cur)
        cur = []
    if len(cur) >= 2:
        chains.append(cur)
    gain = 0.0
    for c in chains:
        saved_bytes = sum(e["bytes"] for e in c[1:]) // 2      # roughly: each link's round trip to memory
        gain += (len(c) - 1) * per_op + (saved_bytes / d.memory_bandwidth if d.memory_bandwidth else 0.0)
    seconds = sum(e["seconds"] for c in chains for e in c)
    return {"chains": len(chains), "ops": sum(len(c) for c in chains), "seconds": seconds,
            "share": _share(seconds, busy), "gain_seconds": min(gain, seconds),
            "examples": [_chain_text(c) for c in chains[:3]],
            "nodes": [e["node"] for c in chains[:3] for e in c]}


def _chain_text(chain: list) -> str:
    """`add -> mul -> gelu (node)`: a chain's first ops only -- a model can chain thousands, and the text goes
    into a rule's message, whose length is bounded (expr.py)."""
    head = " -> ".join(e["op"] for e in chain[:8])
    more = f" -> ... ({len(chain)} ops)" if len(chain) > 8 else ""
    return f"{head}{more} ({chain[0]['node']})"


def _dominant(evs, busy, steps) -> dict:
    per: dict[str, list] = {}
    for e in evs:
        r = per.setdefault(e["op"], [0, 0.0])
        r[0] += 1
        r[1] += e["seconds"]
    rows = [{"op": op, "calls": c // steps, "seconds": s / steps, "share": _share(s / steps, busy)}
            for op, (c, s) in per.items()]
    rows.sort(key=lambda r: -r["seconds"])
    top = rows[0] if rows else {"op": "", "share": 0.0, "seconds": 0.0, "calls": 0}
    return {"ops": rows[:5], "top_op": top["op"], "top_share": top["share"], "top_seconds": top["seconds"],
            "top3_share": sum(r["share"] for r in rows[:3])}


def _whatif(evs, d, busy, steps) -> dict:
    """The run on every other described chip, by the roofline. Only comparable when this run's
    own times come from a roofline too (sim); a real chip's times and a model's are not."""
    out = {"backends": [], "best_backend": "", "best_seconds": 0.0, "best_speedup": 1.0, "best_unsupported": []}
    if not whatif.has_roofline(d) or d.implementation != "sim":
        return out
    from opscope.runtime import description as _description
    from opscope.runtime.backends import description_paths
    for name, path in description_paths().items():
        try:
            other = _description.load(path)
        except Exception:       # a broken user description is `opscope backends`' business, not ours
            continue
        if other.name == d.name or other.implementation != "sim" or not whatif.has_roofline(other):
            continue
        est = whatif.backend_estimate(evs, other)
        secs = est["seconds"] / steps
        out["backends"].append({"backend": f"sim:{name}", "seconds": secs, "speedup": busy / secs if secs else 1.0,
                                "unsupported": est["unsupported"]})
    out["backends"].sort(key=lambda r: r["seconds"])
    if out["backends"]:
        b = out["backends"][0]
        out.update(best_backend=b["backend"], best_seconds=b["seconds"], best_speedup=b["speedup"],
                   best_unsupported=b["unsupported"], best_gain_seconds=max(busy - b["seconds"], 0.0))
    out.setdefault("best_gain_seconds", 0.0)
    return out


def _ranks(evs, run) -> dict:
    """A multi-rank run (hybrid training, an imported folder of per-rank traces), read by profiler/ranks.py.

    Imbalance: a rank's work is the step minus the communication it waited in (the rest of the step it
    computed or stalled on its own); the others wait for the slowest (profiler/ranks.py's slow rank).
    With each rank's share of the batch (the hybrid run's ratios; equal shares otherwise) its speed is
    share / work, and shares proportional to speed give every rank the same work: 1 / sum(speeds). The
    expected step is today's minus what that saves (work assumed linear in the share; fixed costs such as
    the optimizer make it optimistic).
    Exposed communication: the least any rank spends in collectives outside compute (the slowest rank's:
    the collectives themselves, no waiting); hiding it under the backward (all-reduce per gradient bucket
    as gradients are ready) saves up to that rank's compute time.
    Medians over steps: a first step that warms up does not decide."""
    from opscope.profiler.ranks import Ranks, clock_of
    out = {"world_size": len({e["rank"] for e in evs}) or 1, "hybrid": False, "clock": "wall", "slowest_rank": -1,
           "step_seconds": 0.0, "work_seconds": [], "wait_seconds": [], "ratios": [], "new_ratios": [],
           "backends": [], "current_hybrid": "", "new_hybrid": "", "balanced_seconds": 0.0,
           "expected_step_seconds": 0.0, "gain_seconds": 0.0, "imbalance": 0.0, "slowest_lag": 0.0,
           "exposed_communication_seconds": 0.0, "exposed_communication_share": 0.0, "overlap_ratio": 0.0,
           "overlap_gain_seconds": 0.0, "per_rank": [], "work_text": "", "ratios_text": "", "new_ratios_text": ""}
    if out["world_size"] < 2:
        return out
    ranks = Ranks({"rank": [e["rank"] for e in evs], "step": [e["step"] for e in evs],
                   "op": [e["op"] for e in evs], "start_ns": [e["start"] for e in evs],
                   "end_ns": [e["end"] for e in evs]}, clock_of(run))
    rows = ranks.temporal_breakdown()
    ids = sorted({r["rank"] for r in rows})
    per = {k: [r for r in rows if r["rank"] == k] for k in ids}
    # the ranks meet in every step's collectives, so a step lasts as long on each: its longest window (a rank's
    # own window misses time before its first op, e.g. a stall at the top of the step)
    windows: dict[int, float] = {}
    for r in rows:
        windows[r["step"]] = max(windows.get(r["step"], 0.0), r["window_s"])
    if ranks.clock == "simulated":
        # compute lasts the chips' simulated time, the host's own time is noise: a step is the slowest rank's
        # compute and the collectives themselves (the least any rank spent in them: no waiting)
        by_step: dict[int, list] = {}
        for r in rows:
            by_step.setdefault(r["step"], []).append(r)
        windows = {k: max(r["compute_s"] for r in rs) + min(r["communication_s"] for r in rs)
                   for k, rs in by_step.items()}
        work = [float(np.median([r["compute_s"] for r in per[k]])) for k in ids]
    else:
        work = [float(np.median([windows[r["step"]] - r["exposed_communication_s"] for r in per[k]])) for k in ids]
    step = float(np.median(list(windows.values())))
    wait = [float(np.median([r["exposed_communication_s"] for r in per[k]])) for k in ids]
    compute = [float(np.median([r["compute_s"] for r in per[k]])) for k in ids]
    dist = _dict(_dict(run.get("config")).get("dist"))
    backends = [str(b) for b in _list(dist.get("backends"))]
    last = _dict((_list(dist.get("steps")) or [{}])[-1])
    ratios = [_float(x) for x in _list(last.get("ratios"))]
    hybrid = len(backends) == len(ids) == len(ratios)
    if not hybrid:
        ratios, backends = [1.0 / len(ids)] * len(ids), [f"rank {k}" for k in ids]
    speed = [r / w if w > 0 else 0.0 for r, w in zip(ratios, work)]
    new = _rounded_shares(speed) if all(speed) else list(ratios)
    balanced = 1.0 / sum(speed) if all(speed) else max(work)
    gain = max(max(work) - balanced, 0.0)
    slow = ids[int(np.argmax(work))]
    s_wait = min(wait)        # what even the rank the others wait for spends in collectives: no rank avoids it
    overlap = next((o["overlap_ratio"] for o in ranks.overlap() if o["rank"] == slow), 0.0)
    out.update({"hybrid": hybrid, "slowest_rank": slow, "clock": ranks.clock, "step_seconds": step,
                "work_seconds": work,
                "wait_seconds": wait, "ratios": ratios, "new_ratios": new, "backends": backends,
                "current_hybrid": ",".join(f"{b}={r:g}" for b, r in zip(backends, ratios)) if hybrid else "",
                "new_hybrid": ",".join(f"{b}={r:g}" for b, r in zip(backends, new)) if hybrid else "",
                "balanced_seconds": balanced, "expected_step_seconds": max(step - gain, 0.0), "gain_seconds": gain,
                "imbalance": _share(gain, step), "slowest_lag": max(work) / float(np.median(work)) - 1,
                "exposed_communication_seconds": s_wait, "exposed_communication_share": _share(s_wait, step),
                "overlap_ratio": overlap, "overlap_gain_seconds": min(s_wait, compute[ids.index(slow)]),
                "work_text": ", ".join(f"{w * 1e3:.2f} ms" for w in work),
                "ratios_text": ", ".join(f"{r:.3g}" for r in ratios),
                "new_ratios_text": ", ".join(f"{r:g}" for r in new),
                "per_rank": [{"rank": k, "backend": b, "share": r, "work_seconds": w, "wait_seconds": x,
                              "compute_seconds": c, "new_share": n}
                             for k, b, r, w, x, c, n in zip(ids, backends, ratios, work, wait, compute, new)]})
    return out


def _rounded_shares(speed: list[float]) -> list[float]:
    """Shares proportional to speed, to 3 decimals, summing to 1 (what --hybrid takes)."""
    total = sum(speed)
    shares = [round(s / total, 3) for s in speed]
    shares[int(np.argmax(shares))] += round(1.0 - sum(shares), 3)
    return [round(s, 3) for s in shares]
