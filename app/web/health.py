"""`python -m opscope.app.web.health [URL]`: the container's HEALTHCHECK (and a Kubernetes exec probe).

Exit 0 when the analyzer answers GET /metrics with 200, given the token the server was started with
(OPSCOPE_TOKEN, or the file OPSCOPE_TOKEN_FILE names, both of which the server's process sees too); where no
token is known to the probe (the server generated its own), GET /healthz (open, it carries no data) must answer
200. Anything else -- a refused request (403) included -- is exit 1 with one line.
"""
from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_BASE = "http://127.0.0.1:8050"


def probe(url: str | None = None, token: str | None = None, timeout: float = 4.0) -> tuple[bool, str]:
    """url: what to GET (default: /metrics with a token, /healthz without one, on DEFAULT_BASE)."""
    url = url or f"{DEFAULT_BASE}{'/metrics' if token else '/healthz'}"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status == 200, f"{url}: {r.status}"
    except urllib.error.HTTPError as e:
        return False, f"{url}: {e.code}"
    except (OSError, ValueError) as e:
        return False, f"{url}: {getattr(e, 'reason', None) or e}"


def _token() -> str | None:
    path = os.environ.get("OPSCOPE_TOKEN_FILE")
    if path:
        from .gate import read_token_file
        return read_token_file(path)
    return os.environ.get("OPSCOPE_TOKEN") or None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        ok, line = probe(argv[0] if argv else None, _token())
    except Exception as e:          # a probe says one line, whatever went wrong
        ok, line = False, str(e)
    print(("healthy: " if ok else "unhealthy: ") + line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
