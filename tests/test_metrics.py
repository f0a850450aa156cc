"""Prometheus /metrics (profiler/metrics.py): scraped from a live `profile --web` run and from `opscope monitor`
watching a sim chip heat up, parsed with prometheus-client's own parser; the alert that chip fires reaches a
webhook receiver (started here) in Alertmanager's JSON; bad input is one line, exit 2."""
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from opscope.profiler.alerts import AlertEngine, load_rules
from opscope.profiler.alerts.watch import LiveRun
from opscope.profiler.metrics import Metrics
from opscope.profiler.store import RunStore
from test_alerts import HOT_RULE, WARM

TOKEN = "metrics-test-token"
WAIT = 120          # seconds any one wait may take on a loaded machine: a bound, not a threshold


def _scrape(url: str, token: str | None = TOKEN) -> dict:
    """GET url -> {(name, labels as a sorted tuple): value}, through prometheus-client's text parser."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=")
        text = r.read().decode()
    return _parse(text)


def _parse(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _status(url: str, token: str | None = None, host: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if host:
        headers["Host"] = host
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _series(found: dict, name: str, **labels) -> list[float]:
    return [v for (n, ls), v in found.items() if n == name and labels.items() <= dict(ls).items()]


def _start(args, tmp_path, name):
    """An `opscope` child whose stdout and stderr go to files (read while it runs), own session for signals."""
    out, err = open(tmp_path / f"{name}.out", "w"), open(tmp_path / f"{name}.err", "w")
    proc = subprocess.Popen([sys.executable, "-m", "opscope.app", *map(str, args)], stdout=out, stderr=err,
                            env={**os.environ, "OPSCOPE_TOKEN": TOKEN}, start_new_session=True)
    return proc, tmp_path / f"{name}.out", tmp_path / f"{name}.err"


def _wait_for(predicate, what: str, proc=None):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the process ended (exit {proc.returncode}) before {what}")
        time.sleep(0.2)
    pytest.fail(f"no {what} within {WAIT} s")


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)        # Ctrl-C: the way these commands end
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class _Receiver(BaseHTTPRequestHandler):
    """An Alertmanager-style webhook receiver: each POSTed JSON body goes on the server's queue."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.got.put((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def receiver():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    srv.got = queue.Queue()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_metrics_during_a_live_run_show_its_progress_and_the_host(tmp_path):
    proc, out, _ = _start(["profile", "demo:mlp", "-b", "numpy", "--steps", "100000", "--web", "--port", "0"],
                          tmp_path, "profile")
    try:
        line = _wait_for(lambda: re.search(r"(http://\S+?)/timeline\?run=(\w+)", out.read_text()), "URL", proc)
        base, run = line.group(1), line.group(2)
        url = f"{base}/metrics"
        assert _status(url) == 403 and _status(url, "wrong") == 403          # the analyzer's gate, Bearer included

        def progressed():
            found = _scrape(url)
            return found if (_series(found, "opscope_run_events_received", run=run) or [0])[0] > 0 else None
        found = _wait_for(progressed, "events counted for the live run", proc)
        assert _series(found, "opscope_run_running", run=run, model="demo:mlp") == [1.0]
        assert _series(found, "opscope_run_steps_planned", run=run) == [100000.0]
        [busy] = _series(found, "opscope_device_utilization_ratio", device="host")
        assert 0.0 <= busy <= 1.0
        later = _wait_for(lambda: (f := _scrape(url)) and _series(f, "opscope_run_events_received", run=run)[0] >
                          _series(found, "opscope_run_events_received", run=run)[0] and f, "more events", proc)
        assert later
    finally:
        _stop(proc)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_a_sim_chips_heat_fires_an_alert_seen_in_metrics_and_posted_as_alertmanager_json(tmp_path, receiver):
    chip, rules = tmp_path / "warm.toml", tmp_path / "hot.toml"
    chip.write_text(WARM)
    rules.write_text(HOT_RULE)
    hook = f"http://127.0.0.1:{receiver.server_port}/hook"
    proc, _, err = _start(["monitor", "--device", chip, "--rules", rules, "--interval", "0.1", "--duration", "600",
                           "--metrics-port", "0", "--webhook", hook], tmp_path, "monitor")
    try:
        url = _wait_for(lambda: (m := re.search(r"metrics at (http://\S+/metrics)", err.read_text())) and m.group(1),
                        "metrics URL", proc)
        assert _status(url) == 403 and _status(url, TOKEN, host="evil.example") == 403
        firing = _wait_for(lambda: _series(_scrape(url), "opscope_alert_firing", rule="hot-test", subject="sim:warm",
                                           severity="critical") == [1.0], "hot-test firing in /metrics", proc)
        assert firing
        found = _scrape(url)
        [temp] = _series(found, "opscope_device_temperature_celsius", device="sim:warm", kind="npu")
        assert temp > 60
        assert _series(found, "opscope_device_power_watts", device="sim:warm")
        assert _series(found, "opscope_alerts_fired_total", rule="hot-test", severity="critical") == [1.0]
        posts = []
        while not any(a["labels"]["alertname"] == "hot-test" for _, _, p in posts for a in p["alerts"]):
            posts.append(receiver.got.get(timeout=WAIT))
        path, ctype, doc = next(p for p in posts if p[2]["alerts"][0]["labels"]["alertname"] == "hot-test")
        assert path == "/hook" and ctype == "application/json"
        assert doc["version"] == "4" and doc["status"] == "firing" and doc["receiver"] == "opscope"
        assert doc["groupLabels"] == {"alertname": "hot-test"}
        [alert] = doc["alerts"]
        assert alert["status"] == "firing" and alert["endsAt"] == "0001-01-01T00:00:00Z"
        assert {"alertname": "hot-test", "severity": "critical", "subject": "sim:warm",
                "metric": "temperature"}.items() <= alert["labels"].items()
        assert alert["annotations"]["summary"].startswith("sim:warm at ")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", alert["startsAt"])
    finally:
        _stop(proc)


def test_export_rules_prometheus_is_a_rule_file_of_every_rule(cli, tmp_path):
    rules = tmp_path / "hot.toml"
    rules.write_text(HOT_RULE)
    r = cli("monitor", "--rules", rules, "--export-rules", "prometheus")
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    by_id = {rule["alert"]: rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule}
    assert {"hot-test", "chip-hot", "chip-throttled", "rank-slow", "events-dropped"} <= by_id.keys()
    hot = by_id["hot-test"]
    assert hot["expr"] == "(opscope_device_temperature_celsius) > (60)"     # PromQL: Prometheus evaluates it
    assert hot["labels"] == {"severity": "critical", "metric": "temperature"}
    assert "value > 60" in hot["annotations"]["description"]


def test_bad_input_is_one_line_exit_2(cli, tmp_path):
    open_file = tmp_path / "token"
    open_file.write_text("secret-token\n")
    open_file.chmod(0o644)
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        cases = [(["--metrics-port", port], f"cannot listen on 127.0.0.1:{port}"),
                 (["--metrics-port", "70000"], "give a whole number 0 to 65535"),
                 (["--metrics-port", "0", "--token-file", open_file], "other users can read it"),
                 (["--webhook", "ftp://x/hook"], "expected an http:// or https:// URL"),
                 (["--export-rules", "nagios"], "invalid choice")]
        for args, why in cases:
            r = cli("monitor", "--duration", "0", *args)
            assert r.returncode == 2, (args, r.stderr)
            assert why in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
            assert "Traceback" not in r.stderr


def test_a_multi_rank_runs_step_times_and_slow_rank_alert_are_series():
    """What monitor --run feeds /metrics: each rank's step time under run/rank/backend labels, the alert state."""
    store = RunStore()
    run_id = store.create_run(model="demo:mlp", backend="hybrid:a=0.5,b=0.5", engine="dist")
    steps = [{"step": 0, "device_seconds": [0.010, 0.020]}]
    store.update_run(run_id, config={"dist": {"backends": ["sim:a", "sim:b"], "steps": steps}})
    metrics, engine = Metrics(), AlertEngine(load_rules())
    for subject, sample, device, extra in LiveRun(store, run_id).poll():
        metrics.sample(subject, sample, device)
        engine.observe(0.0, subject, sample, device, extra)
    assert metrics.alerts(engine) == []
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in
             text_string_to_metric_families(metrics.exposition()[0].decode()) for s in fam.samples}
    assert _series(found, "opscope_rank_step_seconds", run=run_id, rank="1", backend="sim:b") == [0.020]
    assert _series(found, "opscope_rank_step_seconds", run=run_id, rank="0", backend="sim:a") == [0.010]
    assert _series(found, "opscope_alert_firing", rule="rank-slow", subject="rank 1 (sim:b)") == [1.0]
    engine.observe(1.0, "rank 1 (sim:b)", {"rank_step_seconds": 0.010}, {"name": "rank 1 (sim:b)"}, {"median": 0.010})
    assert metrics.alerts(engine) == [("rank-slow", "rank 1 (sim:b)")]     # it ended: resolved, the gauge 0
    assert metrics.registry.get_sample_value("opscope_alert_firing", {"rule": "rank-slow", "subject": "rank 1 (sim:b)",
                                                                     "severity": "warning"}) == 0


@pytest.mark.multiprocess
@pytest.mark.slow
def test_an_alert_still_firing_when_the_monitor_stops_is_posted_resolved(tmp_path, receiver):
    """Alertmanager keeps an alert open until told otherwise: a monitor that ends (--duration, Ctrl-C, the run
    finished) resolves what it leaves firing, or the page stays up with nobody watching."""
    chip, rules = tmp_path / "warm.toml", tmp_path / "hot.toml"
    chip.write_text(WARM)
    rules.write_text(HOT_RULE)
    hook = f"http://127.0.0.1:{receiver.server_port}/hook"
    proc, _, err = _start(["monitor", "--device", chip, "--rules", rules, "--interval", "0.1", "--duration", "4",
                           "--webhook", hook], tmp_path, "monitor")
    assert proc.wait(timeout=WAIT) == 0, err.read_text()
    posts = []
    while not receiver.got.empty():
        posts.append(receiver.got.get_nowait()[2])
    hot = [(p["status"], a["status"]) for p in posts for a in p["alerts"] if a["labels"]["alertname"] == "hot-test"]
    assert hot == [("firing", "firing"), ("resolved", "resolved")], hot
    resolved = [a for p in posts for a in p["alerts"] if a["status"] == "resolved"]
    assert resolved[0]["endsAt"] != "0001-01-01T00:00:00Z"


def test_serves_metrics_show_each_ranks_step_time_and_the_runs_progress(opscope_home):
    """`opscope serve`'s /metrics for a running multi-rank run: each rank's last finished step (wall seconds) and
    how far the run is (issue 39: /metrics had neither, so Prometheus could not see a slow rank)."""
    import numpy as np

    from opscope.profiler.metrics import from_store
    from opscope.profiler.store import RunStore
    store = RunStore()
    rid = store.create_run(model="demo:mlp", backend="hybrid", steps=10)
    step_ns = {0: 10_000_000, 1: 25_000_000}                 # rank 1 is the slow one
    for rank, ns in step_ns.items():
        n = 3 * 4                                            # 3 steps of 4 ops; step 2 still running (2 ops)
        step = np.repeat(np.arange(3), 4)[:n - 2]
        seq = np.arange(len(step))
        start = step * 100_000_000 + (seq % 4) * (ns // 4)
        k = len(step)
        cols = {c: [""] * k for c in ("node", "module", "source", "device", "input_shapes", "input_dtypes",
                                       "output_shapes", "output_dtypes", "phase", "fwd_node", "parent", "clock")}
        cols.update({"step": step, "seq": seq, "op": ["linear"] * k, "backend": [f"sim:{rank}"] * k,
                     "thread": np.zeros(k, int), "depth": np.zeros(k, int), "start_ns": start,
                     "end_ns": start + ns // 4, "bytes": np.zeros(k, int), "flops": np.zeros(k, int),
                     "fallback": np.zeros(k, bool), "live_bytes": np.zeros(k, int), "rank": np.full(k, rank),
                     "world_size": np.full(k, 2)})
        store.add_event_columns(rid, cols)
    m = Metrics()
    from_store(m, store)
    found = _parse(m.exposition()[0].decode())
    assert _series(found, "opscope_rank_step_seconds", run=rid, rank="0", backend="sim:0") == [0.010]
    assert _series(found, "opscope_rank_step_seconds", run=rid, rank="1", backend="sim:1") == [0.025]
    assert _series(found, "opscope_run_progress_ratio", run=rid) == [0.3]
    assert _series(found, "opscope_run_step", run=rid) == [2.0]
    store.finish_run(rid)
    m2 = Metrics()
    from_store(m2, store)                                    # an ended run's series end
    assert not _series(_parse(m2.exposition()[0].decode()), "opscope_rank_step_seconds", run=rid)
