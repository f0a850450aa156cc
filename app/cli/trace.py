"""`opscope trace export RUN -o FILE` and `opscope trace import FILE`: speak the field's trace formats."""
from __future__ import annotations

import sys

from opscope.runtime.errors import UsageError

from .common import add_json, console, count_arg, emit_json, fmt_bytes, say, terminal_text


def register(sub) -> None:
    p = sub.add_parser("trace", help="export a run as a Chrome/Perfetto trace or CSV; import torch.profiler "
                                     "and ONNX Runtime traces")
    tsub = p.add_subparsers(dest="trace_command", metavar="{export,import}")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    e = tsub.add_parser("export", help="write a run as Chrome trace JSON, Perfetto protobuf or per-op CSV")
    e.add_argument("run", help="run id (or a unique prefix; `opscope runs` lists them)")
    e.add_argument("--format", "-f", choices=["chrome", "perfetto", "csv"],
                   help="default: from the file name (.json, .pftrace, .csv), else chrome")
    e.add_argument("-o", "--output", help="file to write (default: opscope-RUN.json / .pftrace / .csv)")
    e.add_argument("--gzip", action="store_true", help="gzip the file (implied by a .gz file name)")
    e.add_argument("--by", choices=["name", "op", "module", "node"], default="name",
                   help="csv: group ops by this (name: as the trace names them, aten::mm; op: opscope op types)")
    add_json(e)
    e.set_defaults(func=export_main, precheck=_check_export)

    i = tsub.add_parser("import", help="a torch.profiler (Kineto) / Chrome trace or ONNX Runtime profile -> a run; "
                                       "a folder of per-rank torch.profiler traces -> one multi-rank run")
    i.add_argument("file", help="trace JSON (.json or .json.gz), a folder holding one torch.profiler trace per "
                                "rank (each with distributedInfo, as torch.distributed jobs write them), or a "
                                "--shared-dir folder of per-rank Parquet (one run per job in it)")
    i.add_argument("--max-bytes", type=count_arg("--max-bytes"), default=None,
                   help="refuse files larger than this (default 2 GiB, or $OPSCOPE_IMPORT_MAX_BYTES)")
    add_json(i)
    i.set_defaults(func=import_main, precheck=_check_import)


SUFFIX = {"chrome": ".json", "perfetto": ".pftrace", "csv": ".csv"}     # what each format's file is named


def _check_export(args) -> None:
    """Before the run store (DuckDB) is opened: a name that says another format than --format."""
    from opscope.profiler.export import guess_format
    named = guess_format(args.output) if args.output else None
    if args.format and named and named != args.format:      # e.g. Perfetto's protobuf in a .json: refused, unwritten
        raise UsageError(f"-o {args.output}: the name says {named} but --format is {args.format}; name it "
                         f"*{SUFFIX[args.format]}, or leave out --format to write {named}")


def export_main(args) -> int:
    from opscope.profiler.export import export, guess_format
    from opscope.profiler.store import RunStore

    named = guess_format(args.output) if args.output else None
    store = RunStore()
    run = store.get_run(args.run)
    fmt = args.format or named or "chrome"
    out = args.output or f"opscope-{run['run_id']}" + SUFFIX[fmt]
    gz = args.gzip or str(out).endswith(".gz")
    if args.gzip and not str(out).endswith(".gz") and args.output is None:
        out += ".gz"
    report = export(store, run["run_id"], fmt, out, gzip=gz, by=args.by)
    if args.json:
        emit_json(report)
        return 0
    what = f"{report['rows']} rows" if fmt == "csv" else f"{report['ops']} ops, {report['steps']} step spans"
    console.print(say("wrote {} ({}{}, {}, {})", report["path"], fmt, ", gzip" if gz else "", what, fmt_bytes(report["bytes"])))
    return 0


def _check_import(args) -> None:
    """Before the importers (numpy) and the run store (DuckDB): a file that is not there, in the importers' words
    (profiler/importers/common.py); a folder of ranks is the importers' to read."""
    import os

    from opscope.runtime.safe_read import open_regular
    if not os.path.isdir(args.file):
        open_regular(args.file, f"cannot import {args.file}: the file", "give a trace file").close()


def import_main(args) -> int:
    from opscope.profiler.importers import import_trace
    from opscope.profiler.store import RunStore

    from opscope.profiler.shared import import_shared, is_shared

    store = RunStore()
    if is_shared(args.file):            # `train --hybrid --shared-dir`: one run per job in the folder
        run_ids = import_shared(args.file, store, max_bytes=args.max_bytes)
    else:
        from opscope.app.progress import progress_bar, shown
        with progress_bar(f"importing {args.file}", show=shown(args)) as update:
            run_ids = [import_trace(args.file, store=store, max_bytes=args.max_bytes,
                                    progress=lambda what: update(note=what))]
    run_id = run_ids[0]
    run = store.get_run(run_id)
    cfg = run.get("config") or {}
    for w in cfg.get("warnings") or []:      # e.g. a rank folder with some of the job's ranks (on stderr, --json too)
        print(terminal_text(f"opscope: warning: {w}"), file=sys.stderr)
    if args.json:
        emit_json({"run_id": run_id, "run_ids": run_ids, "format": cfg.get("format"), "events": run.get("events"),
                   "steps": run.get("steps"), "backend": run.get("backend"), "source": run.get("source"),
                   "skipped": cfg.get("skipped", {}), "import": cfg.get("import"),
                   "world_size": cfg.get("world_size", 1), "clock": cfg.get("clock"), "cut": cfg.get("cut"),
                   "status": run.get("status"), "error": run.get("error"), "warnings": cfg.get("warnings", [])})
        return 0
    if cfg.get("cut"):        # names past the bound cut, shapes that are not lists dropped (importers/common.py)
        c = cfg["cut"]
        said = [f"{sum(c['names'].values())} names past {c['max_name']} characters cut ({', '.join(c['names'])})"
                if c["names"] else "",
                f"{sum(c['shapes'].values())} shapes/dtypes that are not a JSON list (or past {c['max_shapes']} "
                f"characters) dropped ({', '.join(c['shapes'])})" if c["shapes"] else ""]
        print(terminal_text(f"opscope: note: {'; '.join(filter(None, said))}"), file=sys.stderr)
    if len(run_ids) > 1 or cfg.get("format") == "opscope-shared":
        for rid in run_ids:
            r = store.get_run(rid)
            print(rid)
            print(terminal_text(f"imported {r.get('events')} events of {r.get('model')} "
                                f"({r['config'].get('world_size')} ranks, {r['config'].get('steps_written')} step(s)) "
                                f"from {r.get('source')} as run {rid}: {r.get('status')}"
                                + (f" ({r['error']})" if r.get("error") else "")), file=sys.stderr)
        return 0
    # the id alone on stdout, so RUN=$(opscope trace import f.json) works; the story on stderr
    print(run_id)
    ranks = f", {cfg['world_size']} ranks on one clock ({cfg.get('clock')})" if cfg.get("world_size") else ""
    print(terminal_text(f"imported {run.get('events')} op events ({cfg.get('format')}, {run.get('steps')} "
                        f"step(s){ranks}) from {args.file} as run {run_id}"), file=sys.stderr)
    return 0
