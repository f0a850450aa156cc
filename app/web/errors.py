"""A server-side failure is shown where it happened, as one line; its traceback goes to the log.

    install(app)            # create_app does this

A callback that raises (a bug, a store that cannot be read, an analysis that fails on a run) answers
500 with one line of text, `500 server error: TypeError: ...`, instead of Flask's HTML page. The page's
fetch wrapper (server.py's <head> script, `opscopeCallbackFailed`) puts that line in place of what the
callback would have drawn (the "loading…" note, an empty chart) so no page waits for ever. BadInput
keeps its 400 (gate.py); HTTP errors (404, 405) keep theirs. A script path Dash does not serve
(`/_dash-component-suites/../../etc/passwd`, a version it does not have) is a 404, never a 500.
"""
from __future__ import annotations


def one_line(e: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message`, at most `limit` characters."""
    text = " ".join((str(e).strip().splitlines() or [""])[0].split())
    line = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return line if len(line) <= limit else line[:limit - 1] + "…"


def install(app) -> None:
    from flask import request
    from werkzeug.exceptions import HTTPException

    server = app.server
    _assets_not_served_are_404(server)

    @server.errorhandler(Exception)
    def _failed(e):
        if isinstance(e, HTTPException):
            return e
        server.logger.error("%s %s failed", request.method, request.path, exc_info=e)
        return f"500 server error: {one_line(e)}\n", 500, {"Content-Type": "text/plain; charset=utf-8"}


def _assets_not_served_are_404(server) -> None:
    """Dash answers a component-suites path it does not know by raising (DependencyException, or an OSError from
    the package's data): a 500 with a traceback in the log for what is only a missing file."""
    from werkzeug.exceptions import HTTPException, NotFound
    for rule in server.url_map.iter_rules():
        if "/_dash-component-suites/" not in rule.rule:
            continue
        view = server.view_functions[rule.endpoint]

        def served(*args, _view=view, **kwargs):
            try:
                return _view(*args, **kwargs)
            except HTTPException:
                raise
            except Exception:
                raise NotFound() from None
        server.view_functions[rule.endpoint] = served
