"""`opscope backend check BACKEND`: conformance of every op the backend claims, against
PyTorch's CPU kernels in float64 (runtime/conformance.py); with `--opinfo`, PyTorch's own OpInfo
samples and tolerances for every OpInfo whose ops the backend claims (runtime/opinfo.py)."""
from __future__ import annotations

from opscope.runtime.errors import UsageError

from .common import add_json, check_specs, console, emit_json, number_arg, say, table

# --timeout's bound (NaN and inf are refused too): select() cannot wait past time_t, and a week is more than
# any OpInfo needs
MAX_TIMEOUT_S = 7 * 24 * 3600

# NOTE: torch, the runtime and rich's widgets are imported inside the functions, so `backend --help` is quick.
# The same default as runtime/conformance.DEFAULT_DTYPES (tests/test_cli_contract.py checks they agree).
DEFAULT_DTYPES = ("float32", "float16", "float64", "int64")


def register(sub) -> None:
    p = sub.add_parser("backend", help="work with one backend (conformance check)")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    c = verbs.add_parser("check", help="run every op the backend claims against PyTorch's float64 CPU reference")
    c.add_argument("backend", help="numpy, torch:DEVICE, sim:NAME or a .toml description")
    c.add_argument("--ops", default="", help="comma-separated op names (default: every op the backend claims)")
    c.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES),
                   help=f"comma-separated dtypes to check (default: {','.join(DEFAULT_DTYPES)})")
    c.add_argument("--opinfo", action="store_true",
                   help="run PyTorch's OpInfo samples (float32, first 3 per OpInfo) instead of opscope's own")
    c.add_argument("--opinfos", default="", metavar="NAMES",
                   help="with --opinfo: comma-separated OpInfo names (default: every OpInfo)")
    c.add_argument("--timeout", type=number_arg("--timeout", above=0, maximum=MAX_TIMEOUT_S, unit="seconds"),
                   default=None, metavar="SECONDS",
                   help="with --opinfo on a compiler stack: seconds one OpInfo may take before it counts as a crash "
                        "(default 300; each runs in a worker process, so a stack that dies or hangs ends only its own)")
    add_json(c)
    c.set_defaults(func=main, precheck=lambda args: check_specs(args, model=None))
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def main(args) -> int:
    from opscope.app.progress import progress_bar, shown
    from opscope.runtime.backends import resolve
    from opscope.runtime.conformance import check, plan_cells
    from opscope.runtime.dtypes import ITEMSIZE

    if args.opinfo or args.opinfos:
        return _main_opinfo(args)
    dtypes = tuple(d.strip() for d in args.dtypes.split(",") if d.strip())
    bad = [d for d in dtypes if d not in ITEMSIZE]
    if not dtypes:
        raise UsageError("--dtypes names no dtype: give e.g. --dtypes float32,float16")
    if bad:
        raise UsageError(f"unknown dtype(s) {', '.join(bad)} in --dtypes: use names like float32, float16, int64")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] or None
    backend = resolve(args.backend, with_fallback=False)
    total = len(plan_cells(backend, ops, dtypes))
    with progress_bar(f"checking {args.backend}", total=total, unit="op x dtype", show=shown(args)) as update:
        report = check(backend, ops, dtypes, progress=lambda op, dt: update(advance=1, note=f"{op} {dt}"))
    if args.json:
        emit_json(report.as_dict())
    else:
        _print(report, dtypes)
    return 1 if report.failed else 0


def _print(report, dtypes) -> None:
    cols = [d for d in dtypes if any(c.dtype == d for c in report.cells)]
    if any(c.dtype == "-" for c in report.cells):
        cols.append("-")
    by_op: dict[str, dict] = {}
    for c in report.cells:
        by_op.setdefault(c.op, {})[c.dtype] = c
    rows = []
    for op, cells in by_op.items():
        row = [op]
        for d in cols:
            c = cells.get(d)
            row.append("" if c is None else _cell(c))
        rows.append(row)
    console.print(table(f"conformance of {report.backend} (reference: torch CPU, float64)", ["op", *cols], rows))
    counts = report.counts()
    console.print(", ".join(f"{n} {k}" for k, n in counts.items() if n) or "nothing to check")
    for c in report.failed:
        console.print(say("[red]FAIL[/] {} {}: {}", c.op, c.dtype, c.message))




def _main_opinfo(args) -> int:
    from opscope.app.progress import progress_bar, shown
    from opscope.runtime.backends import resolve
    from opscope.runtime.opinfo import select
    from opscope.runtime.opinfo_worker import check
    names = [n.strip() for n in args.opinfos.split(",") if n.strip()] or None
    backend = resolve(args.backend)
    total = len(select(names))
    with progress_bar(f"OpInfos on {args.backend}", total=total, unit="OpInfos", show=shown(args)) as update:
        # the spec: a compiler stack is checked in worker processes that start from it (runtime/opinfo_worker.py)
        report = check(backend, names, progress=lambda name: update(advance=1, note=name),
                       spec=args.backend, timeout=args.timeout)
    if args.json:
        emit_json(report.as_dict())
    else:
        _print_opinfo(report)
    return 1 if report.failed else 0


_OPINFO_STYLE = {"pass": "green", "fallback": "yellow", "wrong": "red", "crash": "red"}


def _print_opinfo(report) -> None:
    from rich.text import Text

    rows = [[r.name, ", ".join(r.ops), Text(r.status if r.status != "fallback" else "fell back",
                                             style=_OPINFO_STYLE.get(r.status, "")), str(r.samples)]
            for r in report.claimed]
    console.print(table(f"PyTorch OpInfo on {report.backend} (float32, torch.testing.assert_close tolerances)",
                        ["OpInfo", "opscope ops", "result", "samples"], rows))
    c = report.counts()
    console.print(f"{len(report.claimed)} OpInfos claimed: {c['pass']} pass, {c['fallback']} refused and fell back, "
                  f"{c['refused']} refused, {c['wrong']} wrong, {c['crash']} crashed; {c['uncapturable']} not capturable, "
                  f"{c['unclaimed']} with ops opscope does not claim ({report.seconds:.0f} s)")
    for r in report.failed:
        console.print(say("[red]{}[/] {}: {}", r.status.upper(), r.name, r.message))


def _cell(c) -> "Text":
    from rich.text import Text

    # `table` prints strings as written; a Text carries its own style.
    if c.status == "pass":
        return Text("pass", style="green")
    if c.status == "fail":
        return Text.assemble(("FAIL", "red"), f" ({c.max_abs:.1e}, {c.max_rel:.1e})")
    return Text(c.status)
