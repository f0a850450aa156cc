"""`opscope monitor --export-rules prometheus`: Prometheus evaluates the exported rules itself, from the series
opscope exports, and agrees with opscope's own alert engine (issue 39: each rule was only
`opscope_alert_firing{rule=...} == 1`, so nothing fired unless the monitor ran).

promtool (Debian's `prometheus` package, installed by .ci/run) checks the file and runs its rule unit tests:
the same samples go through `promtool test rules` and through AlertEngine, and the firing alerts must match."""
import re
import shutil
import subprocess

import pytest
import yaml

from opscope.profiler.alerts.promql import METRIC_SERIES, RECORDING_RULES, promql
from opscope.profiler.alerts.rules import AlertEngine, load_rules
from opscope.profiler.metrics import Metrics, prometheus_rules

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt-get install prometheus)")

HOT = {"name": "sim:hot", "kind": "npu", "tdp": 300.0, "throttle_temperature": 95.0}
SECONDS = 60

# scenario -> (metric, [(subject, device labels for the engine, {t: value}), ...])
SCENARIOS = {
    "temperature ramp": ("temperature", [("sim:hot", HOT, {t: 80.0 + t * 0.5 for t in range(SECONDS + 1)})]),
    "power over tdp": ("power", [("sim:hot", HOT, {t: 250.0 + 2.0 * t for t in range(SECONDS + 1)})]),
    "memory high": ("memory", [("sim:hot", HOT, {t: 0.5 if t < 20 else 0.95 for t in range(SECONDS + 1)})]),
    "a slow rank": ("rank_step_seconds", [
        (f"rank {r}", {"name": f"rank {r}", "kind": "rank", "run": "r1", "rank": r, "backend": "torch:cpu"},
         {t: (1.6 if r == 2 and t >= 30 else 1.0) for t in range(SECONDS + 1)}) for r in range(3)]),
    "dropped events": ("dropped_events", [("run r1", {"name": "run r1", "kind": "run", "run": "r1"},
                                           {t: 0 if t < 25 else 7 for t in range(SECONDS + 1)})]),
}
EVAL_TIMES = (5, 17, 28, 45, 59)        # away from the scenarios' edges: both evaluators sample each second


def _series_labels(metric, device) -> dict:
    labels = METRIC_SERIES[metric][1]
    if metric == "rank_step_seconds":
        return {"run": device["run"], "rank": str(device["rank"]), "backend": device["backend"]}
    if metric == "dropped_events":
        return {"run": device["run"], "model": "demo:gpt"}
    return {k: (device["name"] if k == "device" else device[k]) for k in labels}


def _engine_alerts(rules, metric, subjects, until: int) -> set:
    """(rule id, subject) that opscope's own engine has firing at `until`, fed one sample per second."""
    engine = AlertEngine([r for r in rules if r.metric == metric])
    firing = set()
    for t in range(until + 1):
        values = [v[t] for _, _, v in subjects]
        median = sorted(values)[len(values) // 2]
        for subject, device, series in subjects:
            extra = {"median": median} if metric == "rank_step_seconds" else {}
            for a in engine.observe(float(t), subject, {metric: series[t]}, device, extra):
                firing.add((a["rule"], subject))
        live = {key for key, ep in engine.episodes.items() if ep.fired}
        firing &= live
    return firing


def _promtool_case(rules, metric, subjects, rule_file) -> dict:
    series = []
    for _, device, values in subjects:
        labels = _series_labels(metric, device)
        name = METRIC_SERIES[metric][0]
        sel = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        series.append({"series": f"{name}{{{sel}}}", "values": " ".join(f"{values[t]:g}" for t in range(SECONDS + 1))})
        if device.get("kind") not in ("rank", "run"):
            for key, sname in (("tdp", "opscope_device_tdp_watts"),
                               ("throttle_temperature", "opscope_device_throttle_temperature_celsius")):
                series.append({"series": f"{sname}{{{sel}}}", "values": f"{device[key]:g}x{SECONDS}"})
    exported = {r["alert"]: r for g in yaml.safe_load(rule_file.read_text())["groups"] for r in g["rules"]
                if "alert" in r}
    tests = []
    for at in EVAL_TIMES:
        want = _engine_alerts(rules, metric, subjects, at)
        for rule in (r for r in rules if r.metric == metric):
            exp = []
            for subject, device, _ in subjects:
                if (rule.id, subject) in want:
                    labels = {**_series_labels(metric, device), "severity": rule.severity, "metric": rule.metric}
                    ann = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), v)
                           for k, v in exported[rule.id]["annotations"].items()}
                    exp.append({"exp_labels": labels, "exp_annotations": ann})
            tests.append({"eval_time": f"{at}s", "alertname": rule.id, "exp_alerts": exp})
    return {"interval": "1s", "input_series": series, "alert_rule_test": tests}


@pytest.fixture(scope="module")
def rules():
    return load_rules()


@pytest.fixture
def rule_file(rules, tmp_path):
    path = tmp_path / "opscope-rules.yml"
    path.write_text(prometheus_rules(rules))
    return path


def test_every_bundled_rule_is_promql_not_the_monitors_firing_flag(rules, rule_file):
    doc = yaml.safe_load(rule_file.read_text())
    alerts = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}
    assert {r.id for r in rules} == alerts.keys()
    for r in rules:
        assert "opscope_alert_firing" not in alerts[r.id]["expr"], (r.id, alerts[r.id]["expr"])
        assert alerts[r.id].get("for", "0s") == ("0s" if not r.duration else f"{r.duration:g}s")


def test_each_rule_reads_only_series_that_opscope_exports(rules):
    """Every series name in a rule is on a real /metrics page (or is one of the recording rules)."""
    m = Metrics()
    m.sample("sim:hot", {"temperature": 90.0, "power": 200.0, "utilization": 0.5, "memory": 0.4}, HOT)
    m.sample("rank 0", {"rank_step_seconds": 1.0}, {"kind": "rank", "run": "r1", "rank": 0, "backend": "torch:cpu"})
    m.run({"run_id": "r1", "model": "demo:gpt", "steps": 3, "status": "running"}, {"events": 10, "dropped": 1, "step": 1})
    exported = set(re.findall(r"^(opscope_\w+)\{", m.exposition()[0].decode(), re.M))
    for r in rules:
        expr, why = promql(r.condition.tree, r.metric)
        names = set(re.findall(r"\b(opscope[:\w]+)\b", expr))
        assert names and names <= exported | RECORDING_RULES.keys(), (r.id, names - exported)


def test_a_condition_promql_cannot_say_falls_back_to_the_monitor_and_says_why(tmp_path):
    f = tmp_path / "mine.toml"
    f.write_text('[[alert]]\nid = "way-slower"\nmetric = "rank_step_seconds"\ncondition = "over_median > 0.5"\n'
                 'duration = 0\nseverity = "warning"\nmessage = "{value}"\n')
    [rule] = load_rules([f], bundled=False)
    doc = yaml.safe_load(prometheus_rules([rule]))
    [alert] = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert alert["expr"] == 'opscope_alert_firing{rule="way-slower"} == 1'
    assert "over_median" in alert["annotations"]["evaluated_by"]


@needs_promtool
@pytest.mark.multiprocess
def test_promtool_accepts_the_rule_file(rule_file):
    r = subprocess.run([PROMTOOL, "check", "rules", str(rule_file)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
@pytest.mark.multiprocess
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_prometheus_fires_what_opscopes_engine_fires(rules, rule_file, tmp_path, scenario):
    metric, subjects = SCENARIOS[scenario]
    case = _promtool_case(rules, metric, subjects, rule_file)
    assert any(t["exp_alerts"] for t in case["alert_rule_test"]), "the scenario fires nothing: it tests nothing"
    assert any(not t["exp_alerts"] for t in case["alert_rule_test"]), "the scenario never rests: it tests little"
    spec = tmp_path / "test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rule_file)], "evaluation_interval": "1s", "tests": [case]}))
    r = subprocess.run([PROMTOOL, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
