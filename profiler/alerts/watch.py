"""What `opscope monitor` samples: the host (psutil), described sim chips (their thermal model
under a set load), and a live multi-rank run in the store (rank step times, temperatures, drops);
and where a fired alert goes besides the terminal: an Alertmanager-style webhook.

    for subject, sample, device, extra in host.poll(dt) / chip.poll(dt) / run.poll(): ...
    post_webhook(url, alertmanager_payload([alert], "firing"))
"""
from __future__ import annotations

import hashlib
import json
import socket
import statistics
import time
import urllib.error
import urllib.parse
import urllib.request

import psutil

from opscope.runtime.errors import UsageError


class HostDevice:
    name = "host"

    def __init__(self):
        psutil.cpu_percent(None)          # the first call only starts the measurement
        self.device = {"name": "host", "kind": "cpu", "tdp": 0, "throttle_temperature": 0}

    def poll(self, dt: float):
        sample = {"utilization": psutil.cpu_percent(None) / 100.0, "memory": psutil.virtual_memory().percent / 100.0}
        temps = getattr(psutil, "sensors_temperatures", lambda: {})() or {}
        readings = [t.current for group in temps.values() for t in group if t.current]
        if readings:
            sample["temperature"] = max(readings)
        yield self.name, sample, self.device, {}


class SimChip:
    """A described chip at a fixed load: each poll advances its thermal model by the time since the last poll.

    The time passed, not the poll's nominal interval: alert rules hold a condition for seconds of the monitor's
    clock, so a chip that heated by `--interval` per poll while a loaded host polled every 0.3 s was cooler than
    the seconds said and a rule's duration could end before the chip reached its threshold."""

    def __init__(self, spec: str, load: float = 1.0):
        from opscope.runtime import backends
        from opscope.runtime.dist.thermal import ThermalModel
        self.backend = backends.resolve(spec)
        self.name = self.backend.name
        self.thermal = ThermalModel.of(self.backend)
        self.load = load
        th = self.thermal
        self._polled = None                   # time.monotonic() of the last poll
        self.device = {"name": self.name, "kind": self.backend.description.kind,
                       "tdp": th.tdp if th else 0, "throttle_temperature": th.throttle_temperature if th else 0}

    def poll(self, dt: float):
        now = time.monotonic()
        if self._polled is not None:
            dt = now - self._polled           # (the first poll: one interval)
        self._polled = now
        sample = {"utilization": self.load}
        if self.thermal:
            self.thermal.advance(dt * self.load, dt * (1 - self.load))
            sample.update(temperature=self.thermal.temperature, power=self.thermal.power)
        yield self.name, sample, self.device, {}


class LiveRun:
    """A run's multi-rank steps as they arrive (runtime/dist keeps them in the run's config)."""

    def __init__(self, store, run_id: str):
        self.store, self.run = store, store.get_run(run_id)
        self.run_id = self.run["run_id"]
        self.seen_steps = -1
        self.finished = False

    def poll(self, dt: float = 0.0):
        run = self.run = self.store.get_run(self.run_id)
        self.finished = run.get("status") not in ("running", None)
        dist = (run.get("config") or {}).get("dist") or {}
        for s in dist.get("steps", []):
            if s["step"] <= self.seen_steps:
                continue
            self.seen_steps = s["step"]
            times = s.get("device_seconds", [])
            median = statistics.median(times) if times else 0.0
            for rank, t in enumerate(times):
                sample = {"rank_step_seconds": t}
                th = (s.get("thermal") or {}).get(str(rank)) or (s.get("thermal") or {}).get(rank)
                if th:
                    sample.update(temperature=th["temperature"], power=th["power"])
                backend = dist.get('backends', ['?'] * (rank + 1))[rank]
                name = f"rank {rank} ({backend})"
                # run, rank, backend: the labels /metrics gives a rank's step time (profiler/metrics.py)
                yield name, sample, {"name": name, "kind": "rank", "tdp": 0, "throttle_temperature": 0,
                                     "run": self.run_id, "rank": rank, "backend": backend}, {"median": median}
        if run.get("dropped"):
            yield "run", {"dropped_events": int(run["dropped"])}, {"name": f"run {self.run_id}"}, {}


# --- Alertmanager's webhook format -------------------------------------------------------------

def check_webhook(url: str) -> str:
    """A --webhook URL: http(s) with a host, checked before the monitor starts."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--webhook {url!r}: expected an http:// or https:// URL, e.g. "
                         "http://alertmanager-receiver:9095/hook")
    return url


def alertmanager_payload(alerts: list[dict], status: str = "firing", receiver: str = "opscope") -> dict:
    """The JSON Alertmanager sends its webhook receivers (version 4), so a receiver written for Alertmanager
    (chat bridges, paging adapters) takes opscope's alerts as they are. Labels: alertname (the rule),
    severity, subject (the device, rank or run), metric; the message is the summary annotation."""
    now = _rfc3339(time.time())
    items = []
    for a in alerts:
        labels = {"alertname": str(a["rule"]), "severity": str(a["severity"]), "subject": str(a["subject"]),
                  "metric": str(a.get("metric", "")), "job": "opscope-monitor", "instance": socket.gethostname()}
        fingerprint = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
        items.append({"status": status, "labels": labels,
                      "annotations": {"summary": str(a.get("message", "")), "value": str(a.get("value", ""))},
                      "startsAt": a.get("starts_at") or now,
                      "endsAt": now if status == "resolved" else "0001-01-01T00:00:00Z",
                      "generatorURL": "", "fingerprint": fingerprint})
    common = {k: v for k, v in items[0]["labels"].items()
              if all(i["labels"].get(k) == v for i in items)} if items else {}
    return {"version": "4", "groupKey": "{}:" + json.dumps({"alertname": common.get("alertname", "")}),
            "truncatedAlerts": 0, "status": status, "receiver": receiver,
            "groupLabels": {"alertname": common["alertname"]} if "alertname" in common else {},
            "commonLabels": common, "commonAnnotations": {}, "externalURL": "", "alerts": items}


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A 3xx stays the answer: following it would let whoever answers the URL send the alerts (as a GET, or to
    ftp://) to any host and port this machine reaches."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_WEBHOOK = urllib.request.build_opener(_NoRedirect)
MAX_LOCATION = 200       # characters of a redirect's Location quoted in the message


def post_webhook(url: str, payload: dict, timeout: float = 10.0) -> str | None:
    """POST the payload as JSON; None when the receiver took it (2xx), else one line saying why not
    (the monitor goes on: a receiver that is down must not stop the watching). A redirect is never followed:
    it is a failed delivery naming where it pointed (give that URL to --webhook if it is the receiver)."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "opscope-monitor"})
    try:
        with _WEBHOOK.open(req, timeout=timeout) as r:
            return None if 200 <= r.status < 300 else f"--webhook {url}: {r.status}"
    except urllib.error.HTTPError as e:
        if 300 <= e.code < 400:
            where = str(e.headers.get("Location") or "nowhere")
            where = where if len(where) <= MAX_LOCATION else where[:MAX_LOCATION] + "..."
            return (f"--webhook {url}: the receiver answered {e.code}, a redirect to {where} (not followed: "
                    "give --webhook the receiver's own URL)")
        return f"--webhook {url}: the receiver answered {e.code}"
    except (OSError, ValueError) as e:
        return f"--webhook {url}: {getattr(e, 'reason', None) or e}"


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"
