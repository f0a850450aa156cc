"""Monitoring and alerts: rules as data (TOML), evaluated on device samples and live runs.

    rules = load_rules(["my.toml"])              # bundled default.toml, then yours
    engine = AlertEngine(rules)
    for t, device, sample in watch(devices):     # profiler/alerts/watch.py: psutil, sim thermal models
        for alert in engine.observe(t, device["name"], sample, device): ...

`opscope monitor` (app/cli/monitor.py) drives the loop, stores alerts with a run (`--run`) and
hands them to a command (`--exec`).
"""
from .rules import METRICS, AlertEngine, AlertRule, load_rules

__all__ = ["METRICS", "AlertEngine", "AlertRule", "load_rules"]
