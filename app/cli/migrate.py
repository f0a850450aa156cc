"""`opscope migrate`: find CUDA-specific code, rewrite it to opscope's device helpers, predict how a model runs.

    opscope migrate scan PATH [--json | --csv | --html -o FILE]
    opscope migrate apply PATH [--diff | --write]
    opscope migrate check file.py:factory --backend B [--backend B2 ...] [--json]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from opscope.runtime.errors import UsageError, terminal_text

from .common import add_json, console, count_arg, emit_json, number_arg, output_path, say, table


# a readiness score is what the scanner saw; a run says whether the script works off CUDA
NOT_VERIFIED = "not verified: `opscope migrate check FILE:FACTORY -b BACKEND` runs it"


def register(sub) -> None:
    p = sub.add_parser("migrate", help="find CUDA-specific code, rewrite it, predict how a model runs elsewhere")
    msub = p.add_subparsers(dest="migrate_command", metavar="SUBCOMMAND", parser_class=type(p))
    p.set_defaults(func=lambda args: _usage(p))

    s = msub.add_parser("scan", help="report every CUDA-specific API in a code base, with a readiness score")
    s.add_argument("path", help="a folder or a source file")
    fmt = s.add_mutually_exclusive_group()
    add_json(fmt)
    fmt.add_argument("--csv", action="store_true", help="one row per finding")
    fmt.add_argument("--html", action="store_true", help="a self-contained HTML report (needs -o)")
    s.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    s.add_argument("--max-size", default="2MiB", help="skip files larger than this (default 2MiB)")
    s.add_argument("--jobs", "-j", type=count_arg("--jobs", 0), default=1, help="worker processes (default 1; 0 = one per CPU)")
    s.add_argument("--fail-under", type=number_arg("--fail-under", minimum=0, maximum=100), metavar="SCORE",
                   help="exit 1 when the readiness score (0 to 100) is below SCORE")
    bar = s.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a terminal")
    bar.add_argument("--no-progress", action="store_true", help="never show the progress bar")
    s.set_defaults(func=scan_main)

    a = msub.add_parser("apply", help="rewrite the findings that have a safe replacement (Python to opscope's "
                                      "device helpers, C/C++/CUDA to HIP)")
    a.add_argument("path", help="a folder or a source file")
    how = a.add_mutually_exclusive_group()
    how.add_argument("--diff", action="store_true", help="print a unified diff (the default)")
    how.add_argument("--write", action="store_true", help="rewrite the files, keeping FILE.orig backups")
    a.add_argument("--max-size", default="2MiB", help="skip files larger than this (default 2MiB)")
    add_json(a)
    a.set_defaults(func=apply_main)

    r = msub.add_parser("run", help="run an unchanged command with its CUDA calls sent to another device",
                        description="Runs COMMAND (python train.py ..., torchrun ...) with opscope.app.migrate.auto "
                                    "loaded first in every Python process it starts: .cuda(), device='cuda', "
                                    "torch.cuda.*, autocast/GradScaler, nccl and ProfilerActivity.CUDA go to the "
                                    "chosen device. Example: opscope migrate run --device cpu -- python train.py")
    r.add_argument("--device", help="the torch device to run on (default: $OPSCOPE_DEVICE, else an accelerator, "
                                    "else cpu)")
    r.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    r.set_defaults(func=run_main)

    c = msub.add_parser("check", help="predict native / fallback / unsupported per op and line, then confirm by running")
    c.add_argument("model", nargs="?", help="path/to/file.py:factory or demo:NAME")
    c.add_argument("--backend", "-b", action="append", help="a backend spec; repeat for several")
    c.add_argument("--compile", metavar="TREE", help="instead: rewrite the CUDA sources under TREE to HIP and compile "
                   "them with hipcc, or HIP-CPU ($OPSCOPE_HIP_CPU) and g++")
    c.add_argument("--run", action="store_true", help="with --compile: run each program built and check its exit code")
    c.add_argument("--train", action="store_true", help="check a whole training step (forward, loss, backward, "
                   "optimizer) instead of the forward pass; the model returns its loss (demos know theirs)")
    add_json(c)
    c.set_defaults(func=check_main)


def _usage(p) -> int:
    p.print_help(sys.stderr)
    return 2


def _size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)(i?[bB])?\s*", text or "")
    if not m:
        raise UsageError(f"--max-size {text!r}: give a size such as 500KiB, 2MiB or 1048576")
    scale = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def scan_main(args) -> int:
    from opscope.app.migrate.report import summarize, to_json
    from opscope.app.migrate.scan import scan_path

    if args.html and not args.output:
        raise UsageError("--html needs -o FILE: the report is a file to open in a browser")
    out = output_path(args.output)
    show = args.progress or (sys.stderr.isatty() and not args.json and not args.no_progress)
    import os
    jobs = args.jobs if args.jobs != 0 else (os.cpu_count() or 1)
    result = scan_path(args.path, max_bytes=_size(args.max_size), progress=show, jobs=jobs)
    summary = summarize(result)
    fmt = "json" if args.json else "csv" if args.csv else "html" if args.html else None
    if fmt is None:
        _print_scan(result, summary)
    if out:
        # No format flag: the file's suffix picks one (.csv, .html/.htm, else JSON).
        _write(out, _report(result, fmt or {".csv": "csv", ".html": "html", ".htm": "html"}.get(out.suffix, "json")))
        if fmt:
            print(f"wrote {out} ({summary['findings_total']} findings, readiness {summary['readiness']:.1f})",
                  file=sys.stderr)
        else:
            console.print(f"wrote {out}")
    elif fmt == "json":
        emit_json(to_json(result))
    elif fmt:
        sys.stdout.write(_report(result, fmt))
    if args.fail_under is not None and summary["readiness"] < args.fail_under:
        print(f"opscope: readiness {summary['readiness']:.1f} is below --fail-under {args.fail_under:g}",
              file=sys.stderr)
        return 1
    return 0


def _report(result, fmt: str) -> str:
    """The scan report as the text of a file: fmt is json, csv or html."""
    from opscope.app.migrate.report import to_csv, to_html, to_json
    if fmt == "csv":
        return to_csv(result)
    if fmt == "html":
        return to_html(result)
    return json.dumps(to_json(result), indent=1) + "\n"


def _write(out: Path, text: str) -> None:
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"-o {out}: cannot write it ({e.strerror or e}); write elsewhere")


def _print_scan(result, s) -> None:
    console.print(f"[bold]{s['findings_total']}[/] CUDA-specific findings in {s['files_with_findings']} of "
                  f"{s['files_scanned']} files ({s['lines']} lines); [bold]{s['unresolved']}[/] left after "
                  f"`opscope migrate apply`; readiness [bold]{s['readiness']:.1f}[/]/100 "
                  f"({s['readiness_after_apply']:.1f} after apply; {NOT_VERIFIED})")
    if s["by_category"]:
        console.print(table("by category", ["category", "findings", "left after apply"],
                            [[c["category"], c["findings"], c["unresolved"]] for c in s["by_category"]],
                            justify_right={"findings", "left after apply"}))
    rows = [[f"{f.file}:{f.line}", f.api, f.category, f.severity,
             "apply" if f.rewritable else "ok" if f.resolved else "manual",
             f.replacement + (f"\nHIP: {f.hip}" if f.hip else "") + (f"\nSYCL: {f.sycl}" if f.sycl else "")]
            for f in result.findings[:200]]
    if rows:
        console.print(table("findings" + (f" (first 200 of {len(result.findings)}; --json for all)"
                                          if len(result.findings) > 200 else ""),
                            ["where", "API", "category", "severity", "fix", "use instead"], rows))
    for sk in s["skipped"]:
        console.print(say("[dim]skipped {}: {}[/]", sk["file"], sk["reason"]))


def apply_main(args) -> int:
    from opscope.app.migrate.files import backup_problem
    from opscope.app.migrate.report import readiness
    from opscope.app.migrate.rewrite import rewrite, verify
    from opscope.app.migrate.scan import Skipped, scan_path

    root = Path(args.path)
    if not root.exists():
        raise UsageError(f"{args.path} does not exist: give a folder or a Python file to rewrite")
    max_bytes = _size(args.max_size)
    result = scan_path(root, max_bytes=max_bytes, keep_trees=True)
    changes, refused, after = [], [], {f.file: [] for f in result.findings}
    for f in result.findings:
        after[f.file].append(f)
    for rel, tree in sorted(result.python_trees.items()):
        fr = rewrite(rel, tree)
        if not fr.changed:
            continue
        problem, left_here = verify(fr)          # the result must parse, and a second apply must change nothing
        if problem:
            refused.append(f"{rel}: {problem}")
            continue
        target = root / rel if root.is_dir() else root
        # a FILE.orig that is a link (or a FIFO...) would take the backup somewhere else: the file is left alone,
        # in the diff as in --write, so what --diff shows is what --write does
        why = backup_problem(target)
        if why is None and args.write:
            why = _write_rewrite(target, fr.after.encode(tree.module.encoding), len(changes), max_bytes)
        if why is not None:
            result.skipped.append(Skipped(rel, why))
            continue
        after[rel] = left_here
        changes.append(fr)
    unmapped = _apply_c(result, root, args, changes, after, max_bytes)
    left = [f for fs in after.values() for f in fs if not f.resolved]
    lines_after = result.lines + sum(c.after.count("\n") - c.before.count("\n") for c in changes)
    score = {"before": readiness(result.findings, result.lines),
             "after": readiness([f for fs in after.values() for f in fs], lines_after)}
    skipped = [{"file": k.file, "reason": k.reason} for k in result.skipped]
    if args.json:
        emit_json({"path": args.path, "written": bool(args.write),
                   "files": [{"file": c.path, "rewritten": c.rewritten, "marked": c.marked,
                              **({} if args.write else {"diff": c.diff()})} for c in changes],
                   "rewritten": sum(c.rewritten for c in changes), "marked": sum(c.marked for c in changes),
                   "rolled_back": refused, "skipped": skipped, "readiness": score,
                   "unmapped": [f.as_dict() for f in unmapped],
                   "manual": [f.as_dict() for f in left]})
        return 1 if refused else 0
    if not args.write:
        for c in changes:
            sys.stdout.write(c.diff())
        msg = sys.stderr
    else:
        msg = sys.stdout
    for r in refused:
        print(f"opscope: error: not rewritten, the result would break it: {r}", file=sys.stderr)
    for k in skipped:
        print(f"skipped {k['file']}: {k['reason']}", file=msg)
    for f in unmapped:
        print(f"not mapped to HIP, left as written: {f.file}:{f.line}:{f.column} {f.api}", file=msg)
    verb = "rewrote" if args.write else "would rewrite"
    print(f"{verb} {sum(c.rewritten for c in changes)} findings in {len(changes)} files"
          + (" (backups: FILE.orig)" if args.write and changes else "")
          + f"; {len(left)} need a manual change (marked `# opscope-migrate:` in Python files); "
          f"readiness {score['before']:.1f} -> {score['after']:.1f} (scanned after the rewrite; {NOT_VERIFIED})",
          file=msg)
    return 1 if refused else 0


def _apply_c(result, root: Path, args, changes: list, after: dict, max_bytes: int) -> list:
    """Rewrite the C/C++/CUDA sources to HIP (c_rewrite); -> the names left as written because nothing maps them."""
    from opscope.app.migrate.c_rewrite import rewrite_c
    from opscope.app.migrate.c_scan import scan_c
    from opscope.app.migrate.files import backup_problem
    from opscope.app.migrate.rules import default_table
    from opscope.app.migrate.scan import Skipped

    table, unmapped = default_table(), []
    for rel, text in sorted(result.c_texts.items()):
        cr = rewrite_c(rel, text, table)
        unmapped.extend(cr.unmapped)
        if not cr.changed:
            continue
        target = root / rel if root.is_dir() else root
        why = backup_problem(target)
        if why is None and args.write:
            why = _write_rewrite(target, cr.after.encode("utf-8", errors="surrogateescape"), len(changes), max_bytes)
        if why is not None:
            result.skipped.append(Skipped(rel, why))
            continue
        after[rel] = scan_c(rel, cr.after, table)
        changes.append(cr)
    return unmapped


def _write_rewrite(target: Path, data: bytes, done: int, max_bytes: int) -> str | None:
    """Write one rewritten file (files.write_source: never through a link); -> why it was skipped, or None."""
    from opscope.app.migrate.files import Skip, write_source
    try:
        write_source(target, data, max_bytes)
    except Skip as e:
        return str(e)
    except OSError as e:
        raise UsageError(f"cannot write {e.filename or target} ({e.strerror or e}); stopped after rewriting "
                         f"{done} files (backups: FILE.orig)")
    return None


def run_main(args) -> int:
    import os
    import shutil
    import subprocess
    import tempfile

    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        raise UsageError("no command to run: give one after --, e.g. opscope migrate run -- python train.py")
    if shutil.which(cmd[0]) is None:
        raise UsageError(f"command not found: {cmd[0]!r}; give an executable on PATH, e.g. python")
    env = dict(os.environ)
    if args.device:
        try:
            import torch
            torch.device(args.device)
        except (RuntimeError, ValueError) as e:
            raise UsageError(f"--device {args.device!r} is not a torch device ({e}); e.g. cpu, xpu, cuda:1")
        env["OPSCOPE_DEVICE"] = args.device
    # NOTE: a sitecustomize on PYTHONPATH is imported by every Python process the command starts (torchrun's
    # workers too), before the script: the same reach as editing each script's first line.
    with tempfile.TemporaryDirectory(prefix="opscope-auto-") as site:
        Path(site, "sitecustomize.py").write_text("import opscope.app.migrate.auto  # noqa: F401\n")
        env["PYTHONPATH"] = os.pathsep.join([site, *filter(None, [env.get("PYTHONPATH")])])
        try:
            code = subprocess.call(cmd, env=env)
        except KeyboardInterrupt:
            return 130
    if code != 0:
        print(f"opscope: error: {' '.join(cmd)} exited with code {code}", file=sys.stderr)
        return 1
    return 0


def check_main(args) -> int:
    from opscope.app.migrate.predict import check

    if args.compile:
        return _compile_main(args)
    if not args.model or not args.backend:
        raise UsageError("migrate check needs MODEL and --backend B (e.g. demo:mlp -b sim), or --compile TREE")

    import contextlib
    # NOTE: the model's own prints go to stderr, so --json keeps one JSON document on stdout
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        doc = check(args.model, args.backend, train=args.train)
    if args.json:
        emit_json(doc)
        if not doc["confirmed"]:
            print(terminal_text(f"opscope: {doc['model']} not confirmed: {doc['why_not']}"), file=sys.stderr)
        return 0 if doc["confirmed"] else 1
    for b in doc["backends"]:
        c, run = b["counts"], b["run"]
        console.print(say("[bold]{}[/] on [bold]{}[/]{}", doc["model"], b["backend"],    # names: say(), not markup
                          (f" (fallback {b['fallback']})" if b["fallback"] else "")
                          + (" (training step: " + ", ".join(f"{p} {sum(v.values())}" for p, v in b["phases"].items())
                             + ")" if doc.get("train") else "")
                          + f": {c['native']} native, {c['fallback']} fallback, {c['missing-op']} with no opscope op "
                          f"yet, {c['unsupported']} unsupported"))
        not_native = [o for o in b["ops"] if o["status"] != "native"]
        if not_native:
            console.print(table("ops that are not native", ["op", "nodes", "prediction", "runs on", "why"],
                                [[o["op"], o["nodes"], o["status"], o["runs_on"] or "-", o["reason"]] for o in not_native]))
            lines = [d for d in b["lines"] if d["status"] != "native"]
            console.print(table("source lines", ["line", "prediction", "ops", "code"],
                                [[d["source"], d["status"], ", ".join(d["ops"]), d["code"]] for d in lines[:40]]))
        if run["ran"] and run.get("error") is None:
            numerics = (f"loss {run['loss']:.6g} vs eager {run['eager_loss']:.6g} (abs err {run['max_abs_err']:.2e})"
                        if doc.get("train") else
                        f"max abs err {run['max_abs_err']:.2e} vs eager PyTorch (cosine {run['cosine']:.6f})")
            within = "" if run.get("numerics_ok", True) else " -- OUTSIDE the tolerance"
            console.print(f"checked by a real run: placement {'matched' if run['matched'] else 'DID NOT match'} the "
                          f"prediction; {numerics}{within}")
            times = run.get("times") or []
            if times:
                console.print(table("time per op: predicted (roofline estimate from the description) vs measured",
                                    ["op", "backend", "nodes", "predicted", "measured", "measured/predicted"],
                                    [[t["op"], t["backend"], t["nodes"], _ms(t["predicted_seconds"]),
                                      f"{_ms(t['measured_seconds'])} {t['measured_clock']}",
                                      "-" if t["ratio"] is None else f"{t['ratio']:.2f}x"] for t in times[:15]]))
        elif run["ran"]:
            console.print(say("[red]the run failed[/]: {}", run["error"]))
        else:
            console.print(say(("confirmed: the backend refuses " if run["matched"] else "[red]NOT confirmed[/]: refused ")
                              + "{}", ", ".join(run.get("refused_ops", []))))
    if not doc["confirmed"]:
        print(terminal_text(f"opscope: {doc['model']} not confirmed: {doc['why_not']}"), file=sys.stderr)
    return 0 if doc["confirmed"] else 1


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def _compile_main(args) -> int:
    from opscope.app.migrate.compile_check import compile_tree

    res = compile_tree(args.compile, run=args.run)
    if args.json:
        emit_json({"tree": args.compile, "compiler": res.compiler, "ok": res.ok,
                   "programs": [p.__dict__ for p in res.programs]})
        return 0 if res.ok and res.programs else 1
    for p in res.programs:
        state = ("built" if p.built else "FAILED to build") + (
            "" if p.returncode is None else f", ran: exit {p.returncode}")
        console.print(say("{}: {}", p.source, state))
        if p.error:
            console.print(say("[dim]{}[/]", p.error))
    built = sum(p.built for p in res.programs)
    print(f"compiled {built} of {len(res.programs)} programs with {res.compiler}"
          + ("" if res.programs else " (no source with a main() found)"))
    return 0 if res.ok and res.programs else 1

