"""`--hybrid` for `opscope train` and `python -m opscope.app.hybrid`: the flags, the command, and the run in the
store. Hybrid data-parallel training; works under torchrun as is:

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m opscope.app.hybrid demo:gpt \\
        --hybrid torch:cpu=0.7,sim:npu-a1=0.3

    add_hybrid_arguments(parser)              # --hybrid, --switch-threshold, --rebalance, --timeout, --shared-dir,
                                              # --elastic --checkpoint-dir --checkpoint-every --max-restarts
    if args.hybrid: return train_hybrid(args) # spawns one process per share, or is one rank under torchrun

Under torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set) every process is one rank and rank 0
prints the report; otherwise opscope starts the ranks itself (profiler/hybrid_rank.py, each rank also
writing --shared-dir) and prints the report. Either way the report (runtime/dist/cli_support.py summarize)
has, per step, the full batch's loss, whether every rank held identical parameters, and each rank's rows
and device time; plus every calibration and re-balancing event with its reason. The runtime's dist package
imports none of this: argparse, the run store and the shared folder's writer live here and in the profiler.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from opscope.runtime.errors import ModelError, OpscopeError, UsageError, terminal_text

RANK_MODULE = "opscope.profiler.hybrid_rank"     # each rank launch starts: runtime/dist/worker.py + --shared-dir

SHARED_ENV = "OPSCOPE_SHARED_DIR"

# NOTE: the rank's writer and summarize() (numpy, the dist runtime) are imported where they are used:
# `opscope train` imports this module for add_hybrid_arguments, and its bad values are refused before that weight.


def add_hybrid_arguments(p) -> None:
    from opscope.app.cli.common import count_arg, number_arg    # the numbers are refused while parsing
    p.add_argument("--hybrid", metavar="SPEC=SHARE,...|auto",
                   help="data-parallel over backends, one process per share: torch:cpu=0.7,sim:npu-a1=0.3; "
                        "auto[:A,B] or A=auto,B=auto measures the shares in a probe")
    first = len(p._actions)             # the flags below mean something only with --hybrid
    p.add_argument("--switch-threshold", type=count_arg("--switch-threshold", 0), default=0, metavar="N",
                   help="below this sequence length (dim 1) the first backend takes the batch")
    p.add_argument("--rebalance", action="store_true",
                   help="move shares when a rank's step time drifts (hysteresis: 10%% for 2 steps)")
    p.add_argument("--timeout", type=number_arg("--timeout", above=0, unit="seconds"), default=60.0, metavar="S",
                   help="seconds a collective waits for a silent rank before the run stops (default 60)")
    p.add_argument("--overlap", action="store_true",
                   help="all-reduce the gradients in buckets while backward runs (as DDP does)")
    p.add_argument("--bucket-mb", type=number_arg("--bucket-mb", above=0, unit="MB"), default=None, metavar="MB",
                   help="--overlap: bucket size in MiB (default: a quarter of the model's gradients, at most DDP's "
                        "25; --json says what was chosen)")
    p.add_argument("--shard", choices=["optimizer", "gradients", "parameters"], default=None,
                   help="optimizer: ZeRO-1, each rank updates and keeps the optimizer state of its shard of the "
                        "parameters, then the ranks all-gather them; gradients: ZeRO-2, the gradients are "
                        "reduce-scattered too, bucket by bucket during backward, each rank keeps only its shard's; "
                        "parameters: ZeRO-3 (FSDP-style), each rank keeps only its shard of the parameters and "
                        "gathers the others just before an op reads them (torch backends, fixed shares)")
    p.add_argument("--sync-bn", action="store_true",
                   help="BatchNorm layers normalize with the whole batch's statistics, all-reduced across the ranks "
                        "(as torch's SyncBatchNorm; forward and backward), so a BatchNorm model matches one process; "
                        "without it each rank uses its own rows' (DDP's default), and the run's note says so")
    p.add_argument("--elastic", action="store_true",
                   help="under torchrun --nnodes MIN:MAX (c10d rendezvous): when a node leaves or joins, the ranks "
                        "resume from the last checkpoint with the first WORLD shares of --hybrid; needs --checkpoint-dir")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="--elastic: rank 0 checkpoints parameters and optimizer state here (.npz, no pickle), "
                        "a folder every node reaches")
    p.add_argument("--checkpoint-every", type=count_arg("--checkpoint-every"), default=10, metavar="N",
                   help="--elastic: steps between checkpoints (default 10; one more after the last step)")
    p.add_argument("--max-restarts", type=count_arg("--max-restarts", 0), default=3, metavar="K",
                   help="--elastic: resumes from the checkpoint before the job gives up (default 3)")
    p.add_argument("--shared-dir", default=os.environ.get(SHARED_ENV) or None, metavar="DIR",
                   help="every rank also writes its events to DIR/<job>/ as Parquet (a folder every node "
                        f"reaches); `opscope serve DIR` or `opscope trace import DIR` reads them (or ${SHARED_ENV})")
    p.set_defaults(hybrid_flags=[(a.option_strings[0], a.dest, a.default) for a in p._actions[first:]])


def refuse_without_hybrid(args) -> None:
    """A job's flag (--sync-bn, --overlap, --shard...) given without --hybrid: one line, not a flag ignored."""
    given = [flag for flag, dest, default in getattr(args, "hybrid_flags", ()) if getattr(args, dest) != default]
    if given:
        raise UsageError(f"{', '.join(given)}: for a data-parallel job; add --hybrid SPEC=SHARE,... (e.g. "
                         f"torch:cpu=0.5,torch:cpu=0.5) or drop {'them' if len(given) > 1 else 'it'}")


def job_from_args(args):
    from opscope.runtime.dist.job import DistJob
    lr = args.lr if getattr(args, "lr", None) is not None else (1e-2 if args.optimizer == "sgd" else 1e-3)
    return DistJob.parse(args.model, args.hybrid, steps=args.steps, optimizer=args.optimizer, lr=lr,
                         rebalance=args.rebalance, timeout_s=args.timeout, switch_threshold=args.switch_threshold,
                         allow_fallback=not getattr(args, "no_fallback", False),
                         shared_dir=shared_folder(getattr(args, "shared_dir", None)),
                         overlap=bool(getattr(args, "overlap", False)), bucket_mb=getattr(args, "bucket_mb", None),
                         shard=getattr(args, "shard", None) or "", sync_bn=bool(getattr(args, "sync_bn", False)),
                         elastic=bool(getattr(args, "elastic", False)),
                         checkpoint_dir=shared_folder(getattr(args, "checkpoint_dir", None), "--checkpoint-dir"),
                         checkpoint_every=getattr(args, "checkpoint_every", 10),
                         max_restarts=getattr(args, "max_restarts", 3))


def shared_folder(path: str | None, flag: str = "--shared-dir") -> str:
    """A folder flag as an absolute path to a folder this process can write (created if need be), or one line."""
    if not path:
        return ""
    folder = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except FileExistsError:
        raise UsageError(f"{flag} {path}: it is a file, not a folder") from None
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot create it ({e.strerror or e})") from None
    if not os.path.isdir(folder):
        raise UsageError(f"{flag} {path}: it is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: this user cannot write there")
    return folder


def train_hybrid(args) -> int:
    from opscope.runtime.dist.job import torchrun_env
    env = torchrun_env()
    try:
        job = job_from_args(args)
    except UsageError:
        if env is not None and env["rank"] != 0:     # every rank finds the same bad flag: rank 0 says it, once
            return 2
        raise
    if env is not None:
        return _as_rank(job, env, args)
    if job.elastic:            # a bad checkpoint is one line here, before any rank starts
        from opscope.runtime.dist.elastic import check_resumable
        check_resumable(job, len(job.specs))
    from opscope.runtime.dist.launch import launch
    store, run_id = _open_run(job)
    seen, lock = [], threading.Lock()
    live = _LiveRun(store, run_id, job)

    def keep(rec, procs):
        with lock:
            seen.append(rec)
            live.add(rec, seen)

    result = launch(job, on_record=keep, worker=RANK_MODULE)
    with lock:
        live.close()               # a reader still draining a rank's pipe no longer writes to the store
    if result.error and _usage_error(result):      # every rank refused the same input: its line, once
        result.error = next((r["message"] for r in result.of("error")), result.error)
    from opscope.runtime.dist.cli_support import summarize
    report = summarize(job, result.records, result.error)
    report["run_id"] = run_id
    _close_run(store, run_id, report, result.error)
    _print(report, args)
    if result.error and _usage_error(result):
        return 2
    return 1 if result.error or report["status"] != "ok" else 0


def _usage_error(result) -> bool:
    """Every rank that failed failed on bad input (exit 2: a checkpoint from another model, ...)."""
    bad = [c for c in result.exit_codes if c != 0]
    return bool(bad) and all(c == 2 for c in bad)


class _LiveRun:
    """The run in the store follows the job as it goes: `opscope monitor --run` watches it live, and a job
    whose ranks die keeps every step reported before. Writes are batched (at most every FLUSH_S, and at
    each error): one write and one summary per step fell behind a fast job -- the summary alone is
    O(steps) -- and the readers' backlog then outlived the job."""
    FLUSH_S = 0.5

    def __init__(self, store, run_id, job):
        self.store, self.run_id, self.job = store, run_id, job
        self.pending: list[dict] = []
        self.summary_due = False
        self.last = 0.0
        self.open = store is not None

    def add(self, rec: dict, seen: list[dict]) -> None:
        if not self.open:
            return
        if rec.get("kind") == "step":
            from opscope.profiler.hybrid_rank import span_events
            self.pending.append(span_events(rec))
        if rec.get("kind") == "error" or (rec.get("kind") == "step" and rec["rank"] == 0):
            self.summary_due = True
        now = time.monotonic()
        if rec.get("kind") == "error" or now - self.last >= self.FLUSH_S:
            self.flush(seen)
            self.last = now

    def flush(self, seen: list[dict] | None) -> None:
        if self.pending:
            batch = {c: [v for cols in self.pending for v in cols[c]] for c in self.pending[0]}
            self.pending = []
            self.store.add_event_columns(self.run_id, batch)
        if self.summary_due and seen is not None:
            self.summary_due = False
            from opscope.runtime.dist.cli_support import summarize
            self.store.update_run(self.run_id, config={"dist": summarize(self.job, seen, None)})

    def close(self) -> None:
        """The last events go in; the final report is written by the caller, once."""
        if self.open:
            self.flush(None)
        self.open = False


def _as_rank(job, env, args) -> int:
    from opscope.profiler.hybrid_rank import SharedRank, span_events
    from opscope.runtime.dist.cli_support import summarize
    from opscope.runtime.dist.elastic import CheckpointError
    from opscope.runtime.dist.job import mismatch, run_rank
    from opscope.runtime.dist.trainer import CollectiveFailed
    try:
        if mismatch(job, env["world_size"]):
            raise UsageError(mismatch(job, env["world_size"]))
        if job.elastic:
            from opscope.runtime.dist.elastic import check_resumable
            check_resumable(job, env["world_size"])
    except OpscopeError as e:
        if env["rank"] == 0:           # one line, once: every rank knows, only rank 0 says it
            raise
        return e.exit_code
    records = []
    try:
        for rec in run_rank(job, env["rank"], env["world_size"], SharedRank):
            records.append(rec)
    except CollectiveFailed as e:
        raise ModelError(f"rank {env['rank']} ({job.specs[env['rank']]}): {e}") from e
    except CheckpointError:
        if env["rank"] == 0:           # a checkpoint of other shapes: every rank finds it, rank 0 says it
            raise
        return 2
    if env["rank"] == 0:
        report = summarize(job, records, None)
        if job.elastic:                # the job outlived its incarnations: its run (and scale events) goes in the store
            store, run_id = _open_run(job)
            if store is not None:
                for rec in records:
                    if rec.get("kind") == "step":
                        store.add_event_columns(run_id, span_events(rec))
                report["run_id"] = run_id
                _close_run(store, run_id, report, None)
        _print(report, args)
        return 0 if report["status"] == "ok" else 1
    return 0


def _open_run(job):
    """A run in the store for the job (its records are kept there even when a rank dies)."""
    try:
        from opscope.profiler.store import RunStore
    except ImportError:          # the runtime runs without the profiler installed
        return None, None
    store = RunStore()
    run_id = store.create_run(model=job.model, backend=f"hybrid:{job.hybrid}", engine="dist",
                              steps=job.steps, config={"hybrid": job.hybrid, "backends": job.specs})
    return store, run_id


def _close_run(store, run_id, report, error) -> None:
    if store is None:
        return
    store.update_run(run_id, config={"dist": report})
    store.finish_run(run_id, "failed" if error else "ok", error)


def _print(report: dict, args) -> None:
    if getattr(args, "json", False):
        print(json.dumps(report, default=float))
        return
    out = sys.stdout
    out.write(f"{report['model']}: hybrid data-parallel over {report['world_size']} ranks "
              f"({', '.join(report['backends'])}) on {report['engine']}\n")
    for ev in report["events"]:
        if ev["kind"] == "scale":
            out.write(f"  {ev['direction']} after step {ev['step']}: {ev['from_ranks']} -> {ev['to_ranks']} ranks "
                      f"(rows {ev['rows']}): {ev['reason']}\n")
            continue
        out.write(f"  {ev['kind']} after step {ev['step'] + 1 if ev['kind'] == 'rebalance' else 0}: ratios {ev['old_ratios']} -> {ev['new_ratios']} "
                  f"(rows {ev['rows']}): {ev['reason']}\n")
    out.write(f"  {'step':>4}  {'loss':>10}  {'rows':>10}  {'device ms per rank':>24}  identical\n")
    for s in report["steps"]:
        ms = ", ".join(f"{t * 1e3:.2f}" for t in s["device_seconds"])
        out.write(f"  {s['step'] + 1:>4}  {s['loss']:>10.6f}  {str(s['rows']):>10}  {ms:>24}  "
                  f"{'yes' if s['identical'] else 'NO'}\n")
    if report.get("step_seconds") is not None:
        out.write(f"  step time (rank 0, host wall, median): {report['step_seconds'] * 1e3:.1f} ms\n")
    ref = report.get("single_process")
    if ref:
        out.write(f"  vs {ref['against']}: loss max abs err {ref['loss_error']['max_abs']:.2e}, parameters max abs "
                  f"err {ref['parameter_error']['max_abs']:.2e} -- "
                  f"{'within' if ref['within_tolerance'] else 'OUTSIDE'} {ref['tolerance']:g}; one process's step "
                  f"{ref['step_seconds'] * 1e3:.1f} ms\n")
        if ref.get("note"):
            out.write(f"  {ref['note']}\n")
        if report.get("sync_bn"):
            out.write("  BatchNorm statistics: the whole batch's, all-reduced across the ranks (--sync-bn)\n")
    if report.get("buckets"):
        b = report["buckets"]
        out.write(f"  gradient buckets: {b['count']} of {b['bytes'] / 2 ** 20:.2f} MiB ({b['chosen']})\n")
    mem = report.get("memory") or {}
    if mem.get("peak_rss_bytes"):        # measured, beside what the strategy keeps (counted)
        per = lambda key: ", ".join(f"{(mem.get(key) or {}).get(r, 0) / 2 ** 20:.0f}"  # noqa: E731
                                    for r in sorted(mem["peak_rss_bytes"], key=int))
        out.write(f"  memory per rank (MiB): peak RSS {per('peak_rss_bytes')}; parameters {per('parameter_bytes')}, "
                  f"gradients {per('gradient_bytes')}, optimizer state {per('optimizer_state_bytes')}"
                  f"{' (--shard ' + report['shard'] + ')' if report.get('shard') else ''}\n")
    if (report.get("shares") or {}).get("note"):
        out.write(f"  shares: {report['shares']['note']}\n")
    if report["error"]:              # a rank's own text: one line, no raw control character
        out.write(f"  stopped: {terminal_text(report['error'])}\n")
    if report.get("run_id"):
        out.write(f"  run {report['run_id']} (`opscope runs`)\n")
    if report.get("shared"):
        out.write(f"  every rank's events: {report['shared']} (`opscope serve {os.path.dirname(report['shared'])}`)\n")
    if report["error"]:
        print(f"opscope: error: {terminal_text(report['error'])}", file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"opscope: error: {message}\n")


def main(argv=None) -> int:
    p = _Parser(prog="python -m opscope.app.hybrid", description=__doc__.splitlines()[0])
    p.add_argument("model")
    add_hybrid_arguments(p)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if not args.hybrid:
        p.error("--hybrid is required")
    try:
        return train_hybrid(args)
    except OpscopeError as e:
        print(f"opscope: error: {terminal_text(e)}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
