"""The report of a `--hybrid` job, from every rank's records (rank 0's view of the steps, every rank's identity
check, the shares used, the single-process reference). The flags, the command and the run in the store are the
app's (app/hybrid.py); the shared folder's writer is the profiler's (profiler/hybrid_rank.py).

    report = summarize(job, records, error)   # JSON-ready: losses, identical_parameters, events, status, ...
"""
from __future__ import annotations


def summarize(job, records: list[dict], error: str | None) -> dict:
    """The run as one JSON-ready report (rank 0's view of the steps, every rank's identity check)."""
    steps: dict[int, dict] = {}
    for r in records:
        if r.get("kind") != "step":
            continue
        s = steps.setdefault(r["step"], {"step": r["step"], "loss": r["loss"], "rows": r["rows"],
                                         "ratios": r["ratios"], "device_seconds": r["device_seconds"],
                                         "digests": {}, "identical": True})
        s["digests"].update({str(k): d for k, d in enumerate(r["digests"])})   # every rank's, as each rank saw them
        s["identical"] = s["identical"] and r["identical"] and len(set(s["digests"].values())) == 1
        if r["rank"] == 0:
            s["comm_seconds"], s["step_seconds"] = r["comm_seconds"], r["step_seconds"]
            s["exposed_gradient_comm_seconds"], s["buckets"] = r.get("exposed_gradient_comm_seconds"), r.get("buckets")
            s["bucket_bytes"] = r.get("bucket_bytes")
        for key in ("optimizer_state_bytes", "gradient_bytes", "parameter_bytes", "peak_rss_bytes"):
            # per-rank memory: what --shard divides, counted, and the process's measured high-water mark
            if key in r:
                s.setdefault(key, {})[str(r["rank"])] = r[key]
        if "thermal" in r:
            s.setdefault("thermal", {})[r["rank"]] = r["thermal"]
    events, seen = [], set()
    for r in records:
        ev = r.get("rebalance") if r.get("kind") == "step" else (r if r.get("kind") in ("calibrate", "scale") else None)
        if ev and (ev["kind"], ev["step"], ev.get("n")) not in seen:      # every rank sends the same decision
            seen.add((ev["kind"], ev["step"], ev.get("n")))
            events.append({k: v for k, v in ev.items() if k != "rank"})
    ref = next((r for r in records if r.get("kind") == "reference"), None)
    ordered = [steps[k] for k in sorted(steps)]
    times = sorted(s["step_seconds"] for s in ordered if "step_seconds" in s)
    extra = {"step_seconds": times[len(times) // 2] if times else None, "shares": _shares(job, ordered),
             "threads_per_rank": {str(r["rank"]): r.get("threads") for r in records if r.get("kind") == "start"},
             "single_process": None if ref is None else
             {k: ref[k] for k in ("against", "losses", "loss_error", "parameter_error", "step_seconds")}}
    if ref is not None:
        worst = max(ref["loss_error"]["max_abs"], ref["parameter_error"]["max_abs"])
        extra["single_process"]["within_tolerance"] = bool(worst <= TOLERANCE)
        extra["single_process"]["tolerance"] = TOLERANCE
        extra["single_process"]["note"] = _tolerance_note(ref, worst, len(ordered[0]["rows"]) if ordered else 1)
    if job.overlap and ordered and ordered[0].get("bucket_bytes"):
        extra["buckets"] = {"bytes": ordered[0]["bucket_bytes"], "count": ordered[0].get("buckets"),
                            "chosen": f"--bucket-mb {job.bucket_mb:g}" if job.bucket_mb else
                            ("a quarter of the model's gradients, at most 4 MiB when sharded (--bucket-mb sets it)"
                             if job.shard in ("gradients", "parameters") else
                             "a quarter of the model's gradients, at most DDP's 25 MiB (--bucket-mb sets it)")}
    extra["memory"] = _memory(ordered)
    report = {**_report(job, records, steps, events, error), **extra}
    if ref is not None and not extra["single_process"]["within_tolerance"] and report["status"] == "ok" \
            and not (ref.get("batch_norm") and not ref.get("sync_bn")):
        report["status"] = "outside_tolerance"     # no cause known: never "ok" (the note says what to check)
    return report


def _tolerance_note(ref: dict, worst: float, ranks: int) -> str | None:
    """Why a job is outside tolerance of one process, in words: None when it is within."""
    if worst <= TOLERANCE:
        return None
    if ref.get("batch_norm") and ranks > 1 and not ref.get("sync_bn"):
        names = ", ".join(ref["batch_norm"][:4]) + (f" and {len(ref['batch_norm']) - 4} more"
                                                    if len(ref["batch_norm"]) > 4 else "")
        return (f"outside {TOLERANCE:g} by {worst:.2e}: expected, the model's BatchNorm layers ({names}) normalize "
                f"with each rank's own rows, as DDP without SyncBatchNorm does, while one process uses the full "
                f"batch's statistics (running mean/var differ too). --sync-bn all-reduces them across the ranks "
                f"(as SyncBatchNorm) to match")
    cause = "BatchNorm statistics synchronised (--sync-bn)" if ref.get("batch_norm") else "no BatchNorm"
    return (f"outside {TOLERANCE:g} by {worst:.2e} and no known cause ({cause}): a backend's numerics or a "
            f"bug; compare one backend alone with `opscope train MODEL --backend B`")


def _memory(steps: list[dict]) -> dict | None:
    """Each rank's measured peak resident set (the process's high-water mark through its last step: loading,
    capture and training, not rank 0's single-process reference after it) beside the bytes the strategy keeps."""
    if not steps:
        return None
    last = steps[-1]
    peak = {r: max((s.get("peak_rss_bytes") or {}).get(r) or 0 for s in steps) or None
            for r in (last.get("peak_rss_bytes") or {})}
    return {"peak_rss_bytes": peak, "parameter_bytes": last.get("parameter_bytes"),
            "gradient_bytes": last.get("gradient_bytes"), "optimizer_state_bytes": last.get("optimizer_state_bytes")}


TOLERANCE = 1e-4        # what `train` holds a backend to against eager: the loss per step and every parameter


def _shares(job, steps: list[dict]) -> dict | None:
    """The shares asked and the ones used (a rank takes whole rows), with why they differ."""
    if not steps:
        return None
    rows = steps[0]["rows"]
    used = [r / sum(rows) for r in rows]
    out = {"asked": job.ratios, "rows": rows, "used": [round(u, 6) for u in used], "note": None}
    if job.ratios is not None and any(abs(u - a / sum(job.ratios)) > 1e-6 for u, a in zip(used, job.ratios)):
        out["note"] = (f"asked {'/'.join(f'{a:g}' for a in job.ratios)} of a {sum(rows)}-row batch; a rank takes whole "
                       f"rows (and at least one), so the ranks take {rows} rows: "
                       f"{'/'.join(f'{u:.3g}' for u in used)}")
    return out


def _report(job, records, steps, events, error) -> dict:
    world = next((r["world_size"] for r in records if r.get("kind") == "start"), len(job.specs))   # elastic: the last
    return {"model": job.model, "hybrid": job.hybrid, "backends": job.specs[:world], "world_size": world,
            "engine": next((r["engine"] for r in records if r.get("kind") == "start"), None),
            "optimizer": {"name": job.optimizer, "lr": job.lr}, "shard": job.shard, "overlap": job.overlap, "sync_bn": job.sync_bn,
            "steps_requested": job.steps,
            "steps": [steps[k] for k in sorted(steps)], "losses": [steps[k]["loss"] for k in sorted(steps)],
            "identical_parameters": bool(steps) and all(s["identical"] for s in steps.values()),
            "events": events, "status": "failed" if error else "ok", "error": error,
            "shared": next((r["shared"] for r in records if r.get("kind") == "start" and r.get("shared")), None)}
