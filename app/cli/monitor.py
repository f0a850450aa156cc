"""`opscope monitor`: watch the host, described chips and (with --run) a live run against alert rules."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

from opscope.runtime.errors import UsageError

from .common import add_json, console, emit_json, say


def register(sub) -> None:
    p = sub.add_parser("monitor", help="watch devices (and a live run) against alert rules")
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="alert rules (TOML, [[alert]] tables) added to the bundled ones; repeatable")
    p.add_argument("--run", metavar="RUN", help="also watch this run (multi-rank step times, temperatures, "
                                               "dropped events) and store the alerts with it")
    p.add_argument("--device", action="append", default=[], metavar="SPEC",
                   help="a sim chip (sim:NAME or a .toml) to watch through its thermal model; repeatable")
    p.add_argument("--sim-load", type=float, default=1.0, metavar="F",
                   help="busy fraction the sim chips run at (default 1.0)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between samples (default 1)")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C, or until the --run finishes)")
    p.add_argument("--exec", dest="exec_cmd", metavar="CMD",
                   help="run CMD for every alert (the alert as JSON on stdin, OPSCOPE_ALERT_* in its environment)")
    add_json(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from opscope.profiler.alerts import AlertEngine, load_rules
    from opscope.profiler.alerts.watch import HostDevice, LiveRun, SimChip

    if not args.interval > 0:
        raise UsageError(f"--interval must be > 0 seconds (got {args.interval})")
    if args.duration is not None and not args.duration >= 0:
        raise UsageError(f"--duration must be >= 0 seconds (got {args.duration})")
    if not 0 <= args.sim_load <= 1:
        raise UsageError(f"--sim-load must be between 0 and 1 (got {args.sim_load})")
    if args.exec_cmd is not None and not shlex.split(args.exec_cmd):
        raise UsageError("--exec needs a command")
    engine = AlertEngine(load_rules(args.rules))
    sources = [HostDevice()] + [SimChip(spec, args.sim_load) for spec in args.device]
    store = live = None
    if args.run:
        from opscope.profiler.store import RunStore
        store = RunStore()
        live = LiveRun(store, args.run)
        sources.append(live)
    start = time.monotonic()
    samples, last = 0, {}
    try:
        while True:
            t = time.monotonic() - start
            for src in sources:
                for subject, sample, device, extra in src.poll(args.interval):
                    samples += 1
                    last[subject] = sample
                    for alert in engine.observe(t, subject, sample, device, extra):
                        _hand_on(alert, args, store, live)
            if (args.duration is not None and t >= args.duration) or (live is not None and live.finished):
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    doc = {"run_id": live.run_id if live else None, "samples": samples, "rules": [r.id for r in engine.rules],
           "last": last, "alerts": engine.alerts}
    if args.json:
        emit_json(doc)
    elif not engine.alerts:
        console.print(f"no alerts ({samples} samples, {len(engine.rules)} rules)")
    return 0


def _hand_on(alert: dict, args, store, live) -> None:
    if not args.json:
        color = {"critical": "red", "warning": "yellow"}.get(alert["severity"], "cyan")
        console.print(say(f"[{color}]{{}}[/] {{}}: {{}}", alert["severity"], alert["rule"], alert["message"]))
    if store is not None:
        # NOTE: alerts live in the run's config until the store has an alerts table (see the report)
        run = store.get_run(live.run_id)
        kept = (run.get("config") or {}).get("alerts", [])
        store.update_run(live.run_id, config={"alerts": kept + [alert]})
    if args.exec_cmd:
        env = {**os.environ, **{f"OPSCOPE_ALERT_{k.upper()}": str(v) for k, v in alert.items()}}
        try:
            subprocess.run(shlex.split(args.exec_cmd), input=json.dumps(alert), text=True, env=env, timeout=30,
                           stdout=sys.stderr if args.json else None)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"opscope: --exec {args.exec_cmd!r} failed: {e}", file=sys.stderr)
