"""`opscope monitor`: watch the host, described chips and (with --run) a live run against alert rules."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

from opscope.runtime.errors import UsageError, terminal_text

from .common import add_json, console, emit_json, number_arg, port_arg, say
from .serve import add_token_options


def register(sub) -> None:
    p = sub.add_parser("monitor", help="watch devices (and a live run) against alert rules")
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="alert rules (TOML, [[alert]] tables) added to the bundled ones; repeatable")
    p.add_argument("--run", metavar="RUN", help="also watch this run (multi-rank step times, temperatures, "
                                               "dropped events) and store the alerts with it")
    p.add_argument("--device", action="append", default=[], metavar="SPEC",
                   help="a sim chip (sim:NAME or a .toml) to watch through its thermal model; repeatable")
    p.add_argument("--sim-load", type=number_arg("--sim-load", minimum=0, maximum=1), default=1.0, metavar="F",
                   help="busy fraction the sim chips run at (default 1.0)")
    # at most a day: time.sleep refuses what overflows time_t (1e10 s ended in an OverflowError, exit 1)
    p.add_argument("--interval", type=number_arg("--interval", above=0, maximum=86400, unit="seconds"), default=1.0,
                   metavar="S", help="seconds between samples (default 1, at most 86400)")
    p.add_argument("--duration", type=number_arg("--duration", minimum=0, unit="seconds"), default=None, metavar="S",
                   help="stop after S seconds (default: until Ctrl-C, or until the --run finishes)")
    p.add_argument("--exec", dest="exec_cmd", metavar="CMD",
                   help="run CMD for every alert (the alert as JSON on stdin, OPSCOPE_ALERT_* in its environment)")
    p.add_argument("--webhook", metavar="URL",
                   help="POST every alert, and its end, to URL in Alertmanager's webhook JSON (version 4); a "
                        "redirect is not followed (a failed delivery naming where it pointed)")
    p.add_argument("--metrics-port", type=port_arg("--metrics-port"), default=None, metavar="PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics while watching (devices, ranks, the "
                        "run's progress, alert states); it needs the token like `opscope serve` does")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 in a container or pod)")
    add_token_options(p)
    p.add_argument("--export-rules", choices=["prometheus"], default=None,
                   help="print the alert rules (bundled and --rules) as a Prometheus rule file and exit")
    add_json(p)
    p.set_defaults(func=main, precheck=precheck)


def precheck(args) -> None:
    """Before the alert engine (and torch, DuckDB) is imported; the numbers are checked while parsing."""
    if args.exec_cmd is not None and not shlex.split(args.exec_cmd):
        raise UsageError("--exec needs a command")


def main(args) -> int:
    from opscope.profiler.alerts import AlertEngine, load_rules
    from opscope.profiler.alerts.watch import HostDevice, LiveRun, SimChip, check_webhook

    if args.webhook is not None:
        check_webhook(args.webhook)
    rules = load_rules(args.rules)
    if args.export_rules:
        from opscope.profiler.metrics import prometheus_rules
        sys.stdout.write(prometheus_rules(rules))
        return 0
    engine = AlertEngine(rules)
    sources = [HostDevice()] + [SimChip(spec, args.sim_load) for spec in args.device]
    store = live = None
    if args.run:
        from opscope.profiler.store import RunStore
        store = RunStore()
        live = LiveRun(store, args.run)
        sources.append(live)
    metrics, server = _metrics_server(args)      # last: every other input is checked before it listens
    start = time.monotonic()
    samples, last, fired = 0, {}, {}
    try:
        while True:
            t = time.monotonic() - start
            for src in sources:
                for subject, sample, device, extra in src.poll(args.interval):
                    samples += 1
                    last[subject] = sample
                    metrics.sample(subject, sample, device)
                    for alert in engine.observe(t, subject, sample, device, extra):
                        fired[(alert["rule"], subject)] = alert
                        _hand_on(alert, args, store, live)
            if live is not None:
                _run_metrics(metrics, store, live)
            for key in metrics.alerts(engine):        # alerts whose condition stopped holding
                if args.webhook and key in fired:
                    _webhook(args.webhook, fired.pop(key), "resolved")
            if (args.duration is not None and t >= args.duration) or (live is not None and live.finished):
                break
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.shutdown()
    if args.webhook:
        # The monitor stops watching: an alert it leaves firing would stay open in Alertmanager (and page
        # someone) with nobody left to resolve it, so every one still firing is resolved as the monitor ends.
        try:
            for alert in fired.values():
                _webhook(args.webhook, alert, "resolved")
        except KeyboardInterrupt:       # a second Ctrl-C: stop now
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
    if args.webhook:
        _webhook(args.webhook, alert, "firing")
    if args.exec_cmd:
        env = {**os.environ, **{f"OPSCOPE_ALERT_{k.upper()}": str(v) for k, v in alert.items()}}
        try:
            subprocess.run(shlex.split(args.exec_cmd), input=json.dumps(alert), text=True, env=env, timeout=30,
                           stdout=sys.stderr if args.json else None)
        except (OSError, subprocess.TimeoutExpired) as e:
            print(terminal_text(f"opscope: --exec {args.exec_cmd!r} failed: {e}"), file=sys.stderr)


def _webhook(url: str, alert: dict, status: str) -> None:
    from opscope.profiler.alerts.watch import alertmanager_payload, post_webhook
    failed = post_webhook(url, alertmanager_payload([alert], status))
    if failed:
        print(terminal_text(f"opscope: {failed}"), file=sys.stderr)


def _run_metrics(metrics, store, live) -> None:
    from opscope.profiler.metrics import run_progress
    progress = run_progress(store, live.run)
    metrics.run(live.run, progress)
    if "host" in progress:
        metrics.sample(f"run {live.run_id}", progress["host"], {"kind": "host"})


def _metrics_server(args):
    """The Metrics every sample goes to, and with --metrics-port their /metrics server (a thread), checked
    (port free, token rules as for `opscope serve`) before any watching starts."""
    from opscope.profiler.metrics import Metrics
    metrics = Metrics()
    if args.metrics_port is None:
        return metrics, None
    from urllib.parse import quote

    from opscope.app.web.metrics_server import metrics_app

    from .profile import check_port
    from .serve import token_from
    args.host = args.metrics_host                 # token_from and the gate read the bound address from args.host
    check_port(args.metrics_host, args.metrics_port)
    token = token_from(args)
    import logging
    import threading

    from opscope.app.web.http_server import make_server     # the web analyzer's: header deadline, per-client bound
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    try:
        server = make_server(args.metrics_host, args.metrics_port,
                             metrics_app(metrics, args.metrics_host, token, args.allow_host))
    except OSError as e:
        raise UsageError(f"--metrics-port {args.metrics_port}: cannot listen on {args.metrics_host}: "
                         f"{e.strerror or e}; pick another port")
    threading.Thread(target=server.serve_forever, name="opscope-metrics", daemon=True).start()
    host = f"[{args.metrics_host}]" if ":" in args.metrics_host else args.metrics_host
    shown = f"?token={quote(token, safe='')}" if token and not (args.token_file or os.environ.get("OPSCOPE_TOKEN")) \
        else ""
    print(f"opscope monitor: metrics at http://{host}:{server.server_port}/metrics{shown}", file=sys.stderr,
          flush=True)
    return metrics, server
