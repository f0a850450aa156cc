"""`opscope profile MODEL --backend B`: record every op of a model into a run and print the top ops.

    opscope profile demo:gpt --train --steps 2          # training steps: forward, backward, optimizer
    opscope profile model.py:factory --capture dynamo   # through torch.compile: every region's ops
    opscope profile -- python train.py ARGS             # a training script as written (like nsys profile)
"""
from __future__ import annotations

import argparse
import sys

from opscope.runtime.errors import UsageError, terminal_text

from .common import (OPTIMIZERS, BACKEND_HELP, MODEL_HELP, add_fallback, add_json, check_specs, choice_arg, console,
                     count_arg, emit_json, fallback_of, number_arg, port_arg, say, table)
from .runs import print_op_table, stats_doc


def register(sub) -> None:
    p = sub.add_parser("profile", help="profile a model op by op into a run (see `opscope runs`); "
                       "`opscope profile -- python train.py ARGS` profiles a script as written")
    p.add_argument("model", nargs="?", help=MODEL_HELP + "; or, after --, a command: python train.py ARGS")
    p.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--backend", "-b", default="torch:cpu", help=BACKEND_HELP)
    p.add_argument("--train", action="store_true", help="record training steps: forward, backward and the "
                   "optimizer update, each op with its phase")
    p.add_argument("--optimizer", default="sgd", type=choice_arg("optimizer", OPTIMIZERS), metavar="sgd|adamw",
                   help="--train: optimizer (default sgd)")
    p.add_argument("--lr", type=number_arg("--lr", above=0), default=None,
                   help="--train: learning rate (default 1e-2 sgd, 1e-3 adamw)")
    p.add_argument("--steps", type=count_arg("--steps"), default=1, help="recorded steps (default 1)")
    p.add_argument("--warmup", type=count_arg("--warmup", 0), default=0, help="steps run first, unrecorded (default 0)")
    p.add_argument("--values", action="store_true", help="also summarize every op output (min/max/mean/std/NaN/"
                   "histogram); costs time")
    p.add_argument("--engine", choices=["graph", "eager", "native"], default=None,
                   help="graph (default for a model): the captured graph on the backend; eager: the model or script "
                        "as written, every ATen op (a Python dispatch mode); native (default for a script): the "
                        "same ops from a C++ observer at a fraction of the cost, built once (the eager engine where "
                        "no compiler is found)")
    p.add_argument("--capture", choices=["export", "dynamo"], default="export",
                   help="export: one graph through torch.export (default); dynamo: torch.compile with the opscope "
                        "backend, for models torch.export cannot capture (every region's ops, node names "
                        "prefixed by their region)")
    p.add_argument("--py-spy", action="store_true", help="sample the runner's Python stacks with py-spy")
    add_fallback(p)
    p.add_argument("--no-tune", action="store_true",
                   help="ignore the configuration `opscope tune` cached for this model and backend")
    p.add_argument("--top", type=count_arg("--top"), default=15, help="ops in the table (default 15)")
    p.add_argument("--web", action="store_true", help="open the web analyzer on the live run")
    p.add_argument("--host", default="127.0.0.1",
                   help="--web: address to bind (default 127.0.0.1); the URL printed carries its token")
    p.add_argument("--port", type=port_arg(), default=8050, help="--web: port (default 8050)")
    from .serve import add_token_options
    add_token_options(p)
    add_json(p)
    p.set_defaults(func=main, precheck=precheck)


def precheck(args) -> None:
    """Every value and combination that needs no model, before torch is imported (app/cli/__init__.py)."""
    command = _command(args)
    check_specs(args, model=None if command else "model")
    if command is not None:
        from opscope.profiler.script import parse_command
        from opscope.profiler.torchrun import is_launcher
        if args.train or args.web or args.steps != 1 or args.warmup or args.engine == "graph" \
                or args.capture != "export":
            raise UsageError("a script decides its own steps and model: --train, --steps, --warmup, --capture, "
                             "--engine graph and --web apply to a model spec, not to `-- python script.py`")
        if not is_launcher(command):      # torchrun's own arguments are its to check
            parse_command(command)        # python, a script that exists, or -m MODULE
        return
    if not args.model:
        raise UsageError("nothing to profile: give a model (demo:NAME or file.py:factory) or a command after --")
    if args.engine == "native":
        raise UsageError("--engine native records a script: opscope profile --engine native -- python train.py; "
                         "for a model use --engine graph or eager")


def main(args) -> int:
    from opscope.profiler import RunFailed, RunStore, profile, start_profile
    store = RunStore()
    command = _command(args)
    if command is not None:
        return _script(args, command, store)
    args.engine = args.engine or "graph"
    opts = dict(steps=args.steps, warmup=args.warmup, values=args.values, engine=args.engine, py_spy=args.py_spy,
                allow_fallback=fallback_of(args), store=store, capture=args.capture, use_tuned=not args.no_tune)
    if args.train:
        opts["train"] = {"optimizer": args.optimizer, "lr": args.lr}
    if args.web:
        # --- hook for the web analyzer (app/web): it follows the live run while the model runs ---
        try:
            from opscope.app.web import serve
        except ImportError:
            raise UsageError("the web analyzer is not installed: `opscope profile` without --web still works")
        from .serve import token_from, token_in_url
        token = token_from(args)              # a bad token file is a usage error before a runner starts
        check_port(args.host, args.port)      # before a runner starts: a busy port must not leave a failed run
        live = start_profile(args.model, args.backend, **opts)
        try:
            if not args.json:
                console.print(say("run [bold]{}[/]: {} on {}, {} step(s); open the page below to watch it stream, "
                                  "Ctrl-C stops the server", live.run_id, args.model, args.backend, args.steps))
            serve(run_id=live.run_id, live=live, host=args.host, port=args.port, token=token,
                  token_in_url=token_in_url(args),
                  allow_hosts=args.allow_host, no_token=args.no_token)  # until Ctrl-C
        except KeyboardInterrupt:          # Ctrl-C before the server was up: same as after
            pass
        except OSError as e:
            live.kill()
            raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}; pick another --port")
        if live.poll() == "running":       # Ctrl-C before the model finished: stop it, keep what arrived
            live.interrupt()
            run = store.get_run(live.run_id)
            print(f"opscope: interrupted: run {live.run_id} stopped before it ended "
                  f"({run['events']} events, {run['steps']} step(s) kept; `opscope show {live.run_id}`)",
                  file=sys.stderr)
            return 130
        if live.status != "ok":
            return 1
        raise KeyboardInterrupt    # the server ran until Ctrl-C: 130 and one line, as `opscope serve`
    from opscope.app.progress import progress_bar, shown
    try:
        with progress_bar(f"profiling {args.model} on {args.backend}", total=args.steps, unit="steps",
                          show=shown(args)) as update:
            run_id = profile(args.model, args.backend, progress=lambda steps, events: update(
                done=steps, note=f"{events:,} events" if events else "capturing"), **opts)
    except RunFailed as e:
        run = store.get_run(e.run_id)
        if args.json:         # the document on stdout; the one line on stderr as without --json
            emit_json({"run_id": e.run_id, "status": "failed", "error": run["error"] or str(e),
                       "events": run["events"], "dropped": run["dropped"]})
        print(terminal_text(f"opscope: error: {e} ({run['events']} events kept; `opscope show {e.run_id}`)"),
              file=sys.stderr)
        return 1
    run = store.get_run(run_id)
    stats = store.op_stats(run_id)
    if args.json:
        doc = {"run_id": run_id, **{k: run[k] for k in ("status", "model", "backend", "device", "engine", "steps",
                                                           "warmup", "events", "dropped")},
               "top_ops": stats_doc(stats[:args.top], run)}
        doc.update(step_time(store, run))
        if args.train:
            doc["phases"] = phases(store, run_id)
        if isinstance(run.get("config"), dict) and isinstance(run["config"].get("capture"), dict):
            doc["capture"] = run["config"]["capture"]
        if isinstance(run.get("config"), dict) and isinstance(run["config"].get("py_spy"), str):
            doc["py_spy"] = run["config"]["py_spy"]
        tuned = run["config"].get("tuned") if isinstance(run.get("config"), dict) else None
        doc["tuned"] = tuned if isinstance(tuned, dict) else None
        if run["status"] == "incomplete":
            doc["error"] = run["error"]
        emit_json(doc)
        return _incomplete(run)
    if args.train:
        doc_phases = phases(store, run_id)
    tuned = run["config"].get("tuned") if isinstance(run.get("config"), dict) else None
    if isinstance(tuned, dict) and tuned.get("says"):
        console.print(say("{}", tuned["says"]))
    st = step_time(store, run)
    print_op_table(run, stats[:args.top], f"top ops of {run['model']} on {run['backend']} ({args.engine}; "
                                          f"{st['clock']} clock)")
    if st["step_ns"] is not None:
        console.print(say("step time: {:.3f} ms {} ({}, median of {} step(s))", st["step_ns"] / 1e6, st["clock"],
                          "the chip's clock: what run, train and optimize report" if st["clock"] == "simulated"
                          else "its ops' host durations summed", run["steps"]))
    if args.train:
        print_phases(doc_phases, st["clock"])
    cap = run["config"].get("capture") if isinstance(run.get("config"), dict) else None
    if isinstance(cap, dict) and "regions" in cap:
        console.print(say("through torch.compile: {} regions, {} graph breaks", cap["regions"], cap["graph_breaks"]))
    extra = f", {run['dropped']} dropped" if run["dropped"] else ""
    console.print(say("run [bold]{0}[/]: {1} events over {2} step(s){3}. `opscope show {0}` for all ops",
                      run_id, run["events"], run["steps"], extra))
    if isinstance(run.get("config"), dict) and isinstance(run["config"].get("py_spy"), str):
        console.print(say("[yellow]{}[/]", run["config"]["py_spy"]))
    return _incomplete(run)


def _command(args) -> list[str] | None:
    """The command after -- (`python train.py ARGS`), or None when profiling a model spec."""
    if args.command or (args.model and not args.model.startswith("demo:") and ":" not in args.model
                        and (args.model.endswith(".py") or args.model.rsplit("/", 1)[-1].startswith("python"))):
        return [args.model, *args.command]
    return None


def _script(args, command: list[str], store) -> int:
    from opscope.profiler import start_script
    from opscope.profiler.torchrun import is_launcher
    if is_launcher(command):              # torchrun / python -m torch.distributed.run: every rank, one run
        from .profile_ranks import main as profile_ranks
        return profile_ranks(args, command, store)
    live = start_script(command, args.backend, values=args.values, py_spy=args.py_spy, store=store,
                        echo=sys.stderr if args.json else sys.stdout, engine=args.engine or "native")
    try:
        status = live.wait()
    except KeyboardInterrupt:
        live.kill()
        print(f"opscope: interrupted: run {live.run_id} stopped ({live.events_received} events kept)",
              file=sys.stderr)
        return 130
    run = store.get_run(live.run_id)
    if status == "failed":
        if live.error_kind == "usage":
            raise UsageError(live.error)
        error = run["error"] or live.error       # the store may not have taken the error (a full disk)
        if args.json:         # the document on stdout; the one line on stderr as without --json
            emit_json({"run_id": run["run_id"], "status": "failed", "error": error, "events": run["events"],
                       "steps": run["steps"], "dropped": run["dropped"]})
        print(terminal_text(f"opscope: error: run {run['run_id']} failed: {error} ({run['events']} events kept; "
                            f"`opscope show {run['run_id']}`)"), file=sys.stderr)
        return 1
    stats = store.op_stats(run["run_id"])
    doc_phases = phases(store, run["run_id"])
    if args.json:
        doc = {"run_id": run["run_id"], **{k: run[k] for k in ("status", "model", "backend", "device", "engine",
                                                                 "steps", "events", "dropped")},
               "phases": doc_phases, "top_ops": stats_doc(stats[:args.top], run)}
        if run["status"] == "incomplete":
            doc["error"] = run["error"]
        emit_json(doc)
        return _incomplete(run)
    print_op_table(run, stats[:args.top], f"top ops of {run['model']} ({run['engine']} engine)")
    print_phases(doc_phases)
    console.print(say("run [bold]{0}[/]: {1} events over {2} step(s) (optimizer steps). `opscope show {0}` for all ops",
                      run["run_id"], run["events"], run["steps"]))
    return _incomplete(run)


def phases(store, run_id: str) -> dict:
    """Events and time per phase (forward / backward / optimizer)."""
    rows = store.query("SELECT phase, count(*), sum(end_ns - start_ns) FROM events WHERE run_id = ? "
                       "GROUP BY phase ORDER BY min(seq)", [run_id])
    return {p: {"events": int(n), "time_ns": int(t or 0)} for p, n, t in rows}


def step_time(store, run: dict) -> dict:
    """The median step's time from the stored top-level ops, and its clock: on a sim chip the
    chip's clock (fallback ops at their modelled host time), the same number `run` prints."""
    rows = store.query("SELECT step, sum(end_ns - start_ns) FROM events WHERE run_id = ? AND depth = 0 "
                       "GROUP BY step ORDER BY step", [run["run_id"]])
    ns = sorted(int(t or 0) for _, t in rows)
    desc = run.get("description") if isinstance(run.get("description"), dict) else {}
    return {"step_ns": ns[len(ns) // 2] if ns else None,
            "clock": "simulated" if desc.get("implementation") == "sim" else "wall"}


def print_phases(doc: dict, clock: str = "wall") -> None:
    total = sum(v["time_ns"] for v in doc.values()) or 1
    console.print(table(f"time by phase ({clock} clock)", ["phase", "events", "time ms", "share"],
                        [[p, v["events"], f"{v['time_ns'] / 1e6:.2f}", f"{100 * v['time_ns'] / total:.1f}%"]
                         for p, v in doc.items()], justify_right={"events", "time ms", "share"}))


def _incomplete(run) -> int:
    """A run whose events were lost on the way (not dropped and counted) is kept, but the command fails:
    a profile with silent holes must not pass for a whole one."""
    if run["status"] != "incomplete":
        return 0
    print(terminal_text(f"opscope: error: run {run['run_id']} is {run['error']}"), file=sys.stderr)
    return 1


def check_port(host: str, port: int) -> None:
    """Bind once and let go, so a bad --port, an unknown --host or a busy port is a usage error before a
    runner or a server starts (werkzeug would print its own message and exit 1). `serve` uses it too."""
    import socket
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}; check --host or pick another --port")
