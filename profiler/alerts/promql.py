"""An alert rule's condition as PromQL over the series opscope exports, so Prometheus can evaluate the rule itself.

    expr = promql(rule)          # "opscope_device_temperature_celsius >= opscope_device_throttle_... - 5", or None
    RECORDING_RULES              # the series a condition needs that no exporter writes (the ranks' median)

A condition reads `value` (the rule's metric), `sample.METRIC`, `device.tdp` / `device.throttle_temperature` and
`median`; each has a series (metrics.py exports the device's description beside its samples). What has no series
(`held`, which `for:` already is; `over_median`; names, functions, `if`) makes promql() return None with the
reason, and the exported rule then falls back to opscope's own evaluation (opscope_alert_firing).

Vector matching: device series share the labels (device, kind); rank series carry (run, rank, backend) and the
median only (run), so a comparison between them matches `on(run) group_left`. A rule's `and` keeps the side that
reads `value` on the left, so the alert's labels and value are the watched series', as opscope's own alert.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

# the rule's metric -> (series, the label set its elements carry)
DEVICE, RANK, RUN = frozenset({"device", "kind"}), frozenset({"run", "rank", "backend"}), frozenset({"run", "model"})
METRIC_SERIES = {
    "utilization": ("opscope_device_utilization_ratio", DEVICE),
    "temperature": ("opscope_device_temperature_celsius", DEVICE),
    "power": ("opscope_device_power_watts", DEVICE),
    "memory": ("opscope_device_memory_used_ratio", DEVICE),
    "rank_step_seconds": ("opscope_rank_step_seconds", RANK),
    "dropped_events": ("opscope_run_events_dropped", RUN),
}
DEVICE_SERIES = {"tdp": "opscope_device_tdp_watts", "throttle_temperature": "opscope_device_throttle_temperature_celsius"}
MEDIAN = "opscope:rank_step_seconds:median"
RECORDING_RULES = {MEDIAN: "quantile by (run) (0.5, opscope_rank_step_seconds)"}
_MEDIAN_LABELS = frozenset({"run"})
# how an alert names what it is about, per label set (Prometheus fills the template in)
SUBJECT = {DEVICE: "{{ $labels.device }}", RANK: "run {{ $labels.run }} rank {{ $labels.rank }}",
           RUN: "run {{ $labels.run }}"}

_ARITH = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Mod: "%", ast.Pow: "^"}
_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


class NoPromQL(Exception):
    """The condition reads something Prometheus has no series for; the message says what."""


@dataclass(frozen=True)
class _Q:
    text: str
    labels: frozenset | None        # None: a scalar
    reads_value: bool = False


def subject(metric: str) -> str:
    """The summary's template for what an alert on `metric` is about."""
    return SUBJECT[METRIC_SERIES[metric][1]] if metric in METRIC_SERIES else "{{ $labels.subject }}"


def promql(condition_tree: ast.AST, metric: str) -> tuple[str | None, str]:
    """(PromQL, '') for a checked condition's tree (Expr.tree) watching `metric`, or (None, why not)."""
    if metric not in METRIC_SERIES:
        return None, f"no exported series for metric {metric!r}"
    try:
        q = _Translate(metric).node(condition_tree.body if isinstance(condition_tree, ast.Expression)
                                    else condition_tree)
    except NoPromQL as e:
        return None, str(e)
    if q.labels is None:
        return None, "the condition reads no series"
    return q.text, ""


class _Translate:
    def __init__(self, metric: str):
        self.metric = metric

    def node(self, n) -> _Q:
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
            return _Q(repr(float(n.value)) if isinstance(n.value, float) else str(n.value), None)
        if isinstance(n, ast.Name):
            if n.id == "value":
                series, labels = METRIC_SERIES[self.metric]
                return _Q(series, labels, True)
            if n.id == "median" and self.metric == "rank_step_seconds":
                return _Q(MEDIAN, _MEDIAN_LABELS)
            raise NoPromQL(f"`{n.id}` has no series")
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            root, key = n.value.id, n.attr
            if root == "device" and key in DEVICE_SERIES and METRIC_SERIES[self.metric][1] == DEVICE:
                return _Q(DEVICE_SERIES[key], DEVICE)
            if root == "sample" and key in METRIC_SERIES and METRIC_SERIES[key][1] == METRIC_SERIES[self.metric][1]:
                return _Q(METRIC_SERIES[key][0], METRIC_SERIES[key][1])
            raise NoPromQL(f"`{root}.{key}` has no series")
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            inner = self.node(n.operand)
            return _Q(f"-({inner.text})", inner.labels, inner.reads_value)
        if isinstance(n, ast.BinOp) and type(n.op) in _ARITH:
            return self.binary(self.node(n.left), _ARITH[type(n.op)], self.node(n.right))
        if isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in _CMP:
            left, right = self.node(n.left), self.node(n.comparators[0])
            if left.labels is None and right.labels is None:
                raise NoPromQL("a comparison of two constants")
            return self.binary(left, _CMP[type(n.ops[0])], right)
        if isinstance(n, ast.BoolOp):
            parts = [self.node(v) for v in n.values]
            if any(p.labels is None for p in parts):
                raise NoPromQL("`and`/`or` of a constant")
            if isinstance(n.op, ast.And):
                # the side that reads `value` first: its labels and value become the alert's
                parts.sort(key=lambda p: (not p.reads_value, -len(p.labels)))
            out = parts[0]
            for p in parts[1:]:
                out = self.binary(out, "and" if isinstance(n.op, ast.And) else "or", p)
            return out
        raise NoPromQL(f"`{ast.unparse(n)[:60]}` has no PromQL form")

    @staticmethod
    def binary(a: _Q, op: str, b: _Q) -> _Q:
        if a.labels is None or b.labels is None or a.labels == b.labels:
            matching = ""
        elif b.labels < a.labels:
            shared = ", ".join(sorted(b.labels))
            matching = f" on({shared})" if op in ("and", "or") else f" on({shared}) group_left()"
        elif a.labels < b.labels:
            shared = ", ".join(sorted(a.labels))
            matching = f" on({shared})" if op in ("and", "or") else f" on({shared}) group_right()"
        else:
            raise NoPromQL("series with unrelated labels")
        labels = a.labels if a.labels is not None and (b.labels is None or len(a.labels) >= len(b.labels)) \
            else b.labels
        if op in ("and", "or"):
            labels = a.labels
        return _Q(f"({a.text}) {op}{matching} ({b.text})", labels, a.reads_value or b.reads_value)
