"""Prometheus metrics: what `opscope monitor` samples and what `opscope serve` knows, in Prometheus' text format.

    m = Metrics()                                   # its own registry: two servers in one process stay apart
    m.sample(subject, sample, device)               # a device / rank sample -> its gauges
    m.alerts(engine)                                # which (rule, subject) alerts are firing now
    m.run(run, progress)                            # a run's progress: events, dropped, the step reached
    body, content_type = m.exposition()             # GET /metrics
    # monitor's GET /metrics server, behind the analyzer's gate, is app/web/metrics_server.py (the app's layer)

Names follow Prometheus' conventions (a unit suffix, ratios 0..1, `_total` for counters); labels hold
names a user would filter by (device, rank, run, rule).
"""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

DEVICE = ("device", "kind")
# the alert rules' metric name -> this module's gauge (rules.METRICS lists the same names)
SAMPLE_GAUGES = {
    "utilization": ("opscope_device_utilization_ratio", "busy fraction of the device, 0..1"),
    "temperature": ("opscope_device_temperature_celsius", "device temperature (sensor or thermal model)"),
    "power": ("opscope_device_power_watts", "device power draw (NVML or thermal model)"),
    "memory": ("opscope_device_memory_used_ratio", "used fraction of the device's memory, 0..1"),
}


DESCRIBED_GAUGES = {
    "tdp": ("opscope_device_tdp_watts", "the device's thermal design power from its description (0: unknown)"),
    "throttle_temperature": ("opscope_device_throttle_temperature_celsius",
                             "where the device starts to throttle, from its description (0: unknown)"),
}


class Metrics:
    """One registry of opscope's gauges; the methods are safe to call from the sampling loop while a
    scrape reads (prometheus-client's metrics are thread-safe; `_lock` guards the firing set)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.device = {m: Gauge(name, doc, DEVICE, registry=r) for m, (name, doc) in SAMPLE_GAUGES.items()}
        # the description's numbers a rule compares with, as series: Prometheus evaluates the exported rules alone
        self.described = {key: Gauge(name, doc, DEVICE, registry=r) for key, (name, doc) in DESCRIBED_GAUGES.items()}
        self.rank_step = Gauge("opscope_rank_step_seconds", "a rank's last step time in a multi-rank run",
                               ("run", "rank", "backend"), registry=r)
        self.events = Gauge("opscope_run_events_received", "events the run has stored so far", ("run", "model"),
                            registry=r)
        self.dropped = Gauge("opscope_run_events_dropped", "events the run lost on the way", ("run", "model"),
                             registry=r)
        self.step = Gauge("opscope_run_step", "the last step the run has stored (0-based)", ("run", "model"),
                          registry=r)
        self.steps = Gauge("opscope_run_steps_planned", "steps the run was asked for", ("run", "model"), registry=r)
        self.progress = Gauge("opscope_run_progress_ratio", "steps stored over steps planned, 0..1",
                              ("run", "model"), registry=r)
        self.running = Gauge("opscope_run_running", "1 while the run is running, 0 once it ended", ("run", "model"),
                             registry=r)
        self.firing = Gauge("opscope_alert_firing", "1 while the alert's condition holds past its duration",
                            ("rule", "subject", "severity"), registry=r)
        self.fired = Counter("opscope_alerts_fired", "alerts fired (once per episode)", ("rule", "severity"),
                             registry=r)
        self.samples = Counter("opscope_monitor_samples", "samples taken by opscope monitor", registry=r)
        self._lock = threading.Lock()
        self._firing: dict[tuple, str] = {}

    def sample(self, subject: str, sample: dict, device: dict | None = None) -> None:
        device = device or {}
        self.samples.inc()
        if device.get("kind") == "rank":
            if sample.get("rank_step_seconds") is not None:
                self.rank_step.labels(device.get("run", ""), str(device.get("rank", "")),
                                      device.get("backend", "")).set(sample["rank_step_seconds"])
        for metric, gauge in self.device.items():
            value = sample.get(metric)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                gauge.labels(subject, device.get("kind", "")).set(value)
        if device.get("kind") not in (None, "rank"):
            for key, gauge in self.described.items():
                value = device.get(key)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    gauge.labels(subject, device.get("kind", "")).set(value)

    def alerts(self, engine) -> list[tuple[str, str]]:
        """Set opscope_alert_firing from the engine's episodes; returns the (rule, subject) alerts that stopped
        firing since the last call (resolved: the condition no longer holds)."""
        severity = {r.id: r.severity for r in engine.rules}
        now = {key: severity.get(key[0], "warning") for key, ep in engine.episodes.items() if ep.fired}
        with self._lock:
            resolved = [key for key in self._firing if key not in now]
            for (rule, subject), sev in now.items():
                if (rule, subject) not in self._firing:
                    self.fired.labels(rule, sev).inc()
                self.firing.labels(rule, subject, sev).set(1)
            for rule, subject in resolved:
                self.firing.labels(rule, subject, self._firing[(rule, subject)]).set(0)
            self._firing = now
        return resolved

    def run(self, run: dict, progress: dict) -> None:
        labels = (run["run_id"], str(run.get("model") or ""))
        self.events.labels(*labels).set(progress.get("events", 0))
        self.dropped.labels(*labels).set(progress.get("dropped", 0))
        if progress.get("step") is not None:
            self.step.labels(*labels).set(progress["step"])
        if run.get("steps") is not None:
            self.steps.labels(*labels).set(run["steps"])
            if run["steps"] and progress.get("step") is not None:
                self.progress.labels(*labels).set(min(1.0, (progress["step"] + 1) / run["steps"]))
        self.running.labels(*labels).set(1 if run.get("status") == "running" else 0)

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def run_progress(store, run: dict) -> dict:
    """How far a run has got, from what it has stored: events and the last step (a live run's runs row says
    `events` only once it ends), dropped events, and its last host sample (the hardware table)."""
    rid = run["run_id"]
    count, step = store.query("SELECT count(*), max(step) FROM events WHERE run_id = ?", [rid])[0]
    hw = store.query("SELECT cpu_percent, temperature_c, power_w FROM hardware WHERE run_id = ? "
                     "ORDER BY t_ns DESC LIMIT 1", [rid])
    progress = {"events": max(int(count), int(run.get("events") or 0)), "step": step,
                "dropped": int(run.get("dropped") or 0)}
    if hw:
        cpu, temp, power = hw[0]
        progress["host"] = {k: v for k, v in (("utilization", None if cpu is None else cpu / 100.0),
                                              ("temperature", temp), ("power", power)) if v is not None}
    return progress


def rank_step_seconds(store, run_id: str) -> list[tuple[int, str, float]]:
    """Each rank's last finished step of a run, as (rank, backend, seconds from its first op's start to its last
    op's end, wall clock). A rank's newest step may still be running, so it is the one before, where there is one."""
    rows = store.query(
        "WITH s AS (SELECT rank, step, any_value(backend) AS backend, max(end_ns) - min(start_ns) AS ns, "
        "row_number() OVER (PARTITION BY rank ORDER BY step DESC) AS newest "
        "FROM events WHERE run_id = ? GROUP BY rank, step) "
        "SELECT rank, backend, ns, newest FROM s WHERE newest <= 2 ORDER BY rank, newest", [run_id])
    out = {}
    for rank, backend, ns, newest in rows:
        if newest == 2 or rank not in out:          # the step before the newest wins when there is one
            out[rank] = (int(rank), str(backend or ""), max(0, int(ns)) / 1e9)
    return list(out.values())


def from_store(metrics: Metrics, store, live=None) -> None:
    """`opscope serve`'s view, refreshed on each scrape: every running run's progress and last host sample,
    each stored alert of those runs, and the live run (`profile --web`) from its collector's counters.
    A run that has ended drops out (its series end), as a finished job's do in Prometheus."""
    for gauge in (metrics.events, metrics.dropped, metrics.step, metrics.steps, metrics.progress, metrics.running,
                  metrics.firing, metrics.rank_step):
        gauge.clear()
    for run in store.list_runs():
        if run.get("status") != "running" and run["run_id"] != getattr(live, "run_id", live):
            continue
        progress = run_progress(store, run)
        if live is not None and getattr(live, "run_id", None) == run["run_id"]:
            progress["events"] = max(progress["events"], int(live.events_received))
            progress["dropped"] = max(progress["dropped"], int(live.dropped))
        metrics.run(run, progress)
        for rank, backend, seconds in rank_step_seconds(store, run["run_id"]):
            metrics.rank_step.labels(run["run_id"], str(rank), backend).set(seconds)
        if "host" in progress:
            metrics.sample(f"run {run['run_id']}", progress["host"], {"kind": "host"})
        for alert in (run.get("config") or {}).get("alerts") or []:
            if isinstance(alert, dict) and {"rule", "subject", "severity"} <= alert.keys():
                metrics.firing.labels(str(alert["rule"]), str(alert["subject"]), str(alert["severity"])).set(1)


def prometheus_rules(rules, group: str = "opscope") -> str:
    """The alert rules as a Prometheus rule file (YAML), for `opscope monitor --export-rules prometheus`.

    Each rule's condition becomes PromQL over the exported series (alerts/promql.py), with its duration as `for:`,
    so Prometheus evaluates it from what any exporter of those series wrote -- the monitor need not run. The ranks'
    median is a recording rule. A condition PromQL cannot say (`held`, `over_median`, ...) fires on
    opscope_alert_firing{rule=ID}, which the monitor sets, and the rule says why in an annotation."""
    import json

    from opscope.profiler.alerts.promql import RECORDING_RULES, promql, subject
    q = json.dumps          # a JSON string is a YAML double-quoted scalar: no YAML library needed
    lines = ["# Prometheus rules from opscope's alert rules (opscope monitor --export-rules prometheus).",
             "# Each condition is PromQL over the series opscope exports (monitor's and serve's /metrics);",
             "# a condition with no PromQL form fires on opscope_alert_firing, set by `opscope monitor`.",
             "groups:", f"  - name: {q(group + ':recording')}", "    rules:"]
    for name, expr in RECORDING_RULES.items():
        lines += [f"      - record: {q(name)}", f"        expr: {q(expr)}"]
    lines += [f"  - name: {q(group)}", "    rules:"]
    for r in rules:
        expr, why = promql(r.condition.tree, r.metric)
        lines += [f"      - alert: {q(r.id)}",
                  f"        expr: {q(expr or f'opscope_alert_firing{{rule={q(r.id)}}} == 1')}"]
        if expr and r.duration > 0:
            lines.append(f"        for: {q(f'{r.duration:g}s')}")
        lines += ["        labels:", f"          severity: {q(r.severity)}", f"          metric: {q(r.metric)}",
                  "        annotations:",
                  f"          summary: {q(f'opscope alert {r.id} on ' + (subject(r.metric) if expr else '{{ $labels.subject }}'))}",
                  f"          description: {q(f'{r.metric}: {r.condition.text} for {r.duration:g} s')}"]
        if not expr:
            lines.append(f"          evaluated_by: {q(f'opscope monitor ({why})')}")
    return "\n".join(lines) + "\n"
