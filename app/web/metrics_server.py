"""`opscope monitor --metrics-port`: GET /metrics as a WSGI app, behind the analyzer's gate (gate.py). It lives
with the web app, not beside the metrics in the profiler: the profiler imports nothing of the app (layers,
tests/test_layers.py)."""
from __future__ import annotations

from opscope.profiler.metrics import Metrics


def metrics_app(metrics: Metrics, host: str, token: str | None, allow_hosts=()):
    """A WSGI app answering GET /metrics, with the analyzer's Host check and token (gate.py): `?token=`,
    `X-Opscope-Token` or `Authorization: Bearer` (what Prometheus' `authorization` scrape setting sends)."""
    from werkzeug.wrappers import Request, Response

    from . import gate

    hosts = gate.allowed_hosts(host, allow_hosts)
    any_ip = host.strip("[]").lower() in gate.WILDCARDS

    def app(environ, start_response):
        req = Request(environ)
        given = environ.get("HTTP_HOST")
        if given is not None and not gate.host_allowed(given, hosts, any_ip):
            resp = Response(f"403 forbidden: Host {given[:100]!r} is not a name this server answers to\n", 403)
        elif token and not gate._has_token(req, token, environ.get("SERVER_PORT", "")):     # one token rule
            resp = Response("403 forbidden: /metrics needs the token: send `Authorization: Bearer TOKEN`\n", 403)
        elif req.path != "/metrics":
            resp = Response("404 not found: only /metrics is served here\n", 404)
        else:
            body, ctype = metrics.exposition()
            resp = Response(body, 200, content_type=ctype)
        if resp.status_code != 200:
            resp.content_type = "text/plain; charset=utf-8"
        return resp(environ, start_response)

    return app
