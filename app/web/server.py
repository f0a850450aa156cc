"""The Dash app: a header (pages, the run, its live status) over one page module per view.

    app = create_app()                 # every run in $OPSCOPE_HOME/runs.duckdb
    serve(host="127.0.0.1", port=8050) # `opscope serve`

Pages are Dash pages registered from opscope.app.pages; their callbacks are bound to the app
(not to dash's global list) so that several apps can live in one process (tests, `profile --web`).
serve() requires a token by default, on loopback too (Jupyter's model: every local user can reach 127.0.0.1);
gate.py checks the Host, the token and the shape of callback requests (who may ask what).
"""
from __future__ import annotations

import importlib
import json
import signal
import sys
import threading
import webbrowser
from pathlib import Path
from urllib.parse import parse_qs, quote, urlencode

import dash
from dash import Input, Output, State, dcc, html

from . import components as ui
from . import errors, gate, ids, inputs
from .data import WebData

# assets/ sits at the repository root (Dash's convention); a wheel ships it as opscope/assets.
ASSETS = next((p for p in (Path(__file__).resolve().parents[2] / "assets",
                           Path(__file__).resolve().parents[1] / "assets") if p.is_dir()),
              Path(__file__).resolve().parents[2] / "assets")
PAGES = ["runs", "timeline", "operators", "memory", "ranks", "compare", "tensors", "hardware", "advisor", "optimize",
         "flame", "sql"]
LIVE_POLL_MS = 1000


LIVE_ENDPOINT = "/_opscope/live"   # GET ?run=: {run, status, events, dropped} now (the header's poll)
METRICS_ENDPOINT = "/metrics"      # GET: Prometheus' text format (profiler/metrics.py), behind the same gate


def create_app(store=None, token: str | None = None, live=None, host: str = "127.0.0.1",
               allow_hosts=()) -> dash.Dash:
    """The web analyzer over `store` (default: the run store in OPSCOPE_HOME).

    token: when set, every request needs it (?token= once, then a cookie; or the X-Opscope-Token header);
    None: no gate, for an app a test or a caller serves itself (serve() sets one unless told no_token).
    live: the run that is streaming in (`profile --web`), as its id or the profiler's LiveRun (whose collector's
    counters then answer the page's poll without a store query); pages show it when no run is picked.
    host, allow_hosts: the address the server is bound to and other names it may be reached by; a request
    whose Host header names anything else is refused (gate.py: DNS rebinding).
    """
    data = WebData(store, live=live)
    # NOTE: eager_loading=True (plotly.js as a blocking script) measured slower: the layout request then
    # waits for plotly to parse. _index_with_early_loads starts it async instead (no blocking, no waiting).
    # include_pages_meta=False: Dash's social-card meta tags echo the request URL, ?token= included.
    app = dash.Dash(__name__, use_pages=True, pages_folder="", assets_folder=str(ASSETS), include_pages_meta=False,
                    suppress_callback_exceptions=True, title="opscope", update_title=None,
                    assets_ignore=r"^plotly-gl2d")   # vendor/: _index_with_early_loads loads it, not a blocking script
    modules = [importlib.import_module(f"opscope.app.pages.{name}") for name in PAGES]
    for order, m in enumerate(modules):
        dash.register_page(m.__name__, path=m.PATH, name=m.NAME, title=f"opscope · {m.NAME}", order=order,
                           layout=m.layout)
    app.index_string = _index_with_early_loads(app, modules)
    app.layout = _shell(modules)
    _register_shell(app, data, modules)
    for m in modules:
        m.register(app, data)
    _register_metrics(app, data)
    gate.install(app, host=host, token=token, allow_hosts=allow_hosts)
    errors.install(app)
    app.opscope_data = data
    app.server.opscope_data = data     # page layouts find it through flask.current_app
    return app


# The partial plotly.js bundle (assets/vendor/README.md): every trace type the pages draw, a third the size.
PLOTLY_JS = "vendor/plotly-gl2d-3.7.0.min.js"

# Started from <head>, before Dash's own scripts have even loaded (after dropping ?token= from the address bar):
# - the timeline page's first window (app/pages/timeline.py), so the server builds the run's spans while
#   the browser compiles the scripts; assets/timeline.js takes the answer from window.opscopeTimelineFirst.
# - plotly.js, as an async script, on the pages that draw with it (a page module's PLOTS). dcc.Graph loads
#   plotly only once it renders, after the Dash renderer, the layout and the page callback: a download and
#   parse at the end of the critical path. dcc.Graph takes `window.Plotly` as a promise
#   (Promise.resolve(window.Plotly || load())), so it waits for this one instead of loading a second copy;
#   plotly.js replaces the promise with itself when it runs. On the other pages `window.Plotly` is a thenable
#   that starts the load only when a graph asks for it (after a move to a page that draws one): plotly's
#   parse is one long task (0.4-0.7 s idle, 2-2.7 s beside two busy loops) that held Compare's and the
#   Advisor's first layout request behind it. The timeline loads it once it has drawn, ready for the next page.
_EARLY = """<script>(function () {
  // ?token= has set the cookie with this page: take it out of the address bar, the history and every URL
  // copied from there, before Dash reads the location.
  var here = new URL(location.href);
  if (here.searchParams.has("token")) {
    here.searchParams.delete("token");
    history.replaceState(history.state, "", here.pathname + here.search + here.hash);
  }
  var prefix = %(prefix)s, timeline = /\\/timeline\\/?$/.test(location.pathname), loading = null;
  var page = location.pathname.slice(prefix.length - 1).replace(/\\/+$/, "") || "/";
  function plotly() {
    return loading || (loading = new Promise(function (ok, fail) {
      var s = document.createElement("script"); s.src = %(plotly)s; s.async = true;
      s.onload = function () { ok(); }; s.onerror = function (e) { fail(e); };
      document.head.appendChild(s);
    }));
  }
  window.Plotly = %(plotly_pages)s.indexOf(page) >= 0 ? plotly()
    : {then: function (ok, fail) { return plotly().then(ok, fail); }};
  if (timeline) document.addEventListener("opscope:timeline-drawn", plotly, {once: true});
  // A callback the server failed (errors.py: a 500 of one line): that line goes where the callback would have
  // drawn, so no page says "loading…" for ever; outputs that cannot hold text are emptied, and the line
  // then shows above the page.
  var realFetch = window.fetch;
  window.fetch = function (input, init) {
    var p = realFetch.apply(this, arguments), url = typeof input === "string" ? input : (input && input.url) || "";
    if (url.indexOf("_dash-update-component") < 0) return p;
    return p.then(function (r) {
      if (r.status >= 500) r.clone().text().then(function (t) { window.opscopeCallbackFailed(t, init && init.body); });
      return r;
    });
  };
  window.opscopeCallbackFailed = function (text, body) {
    var set = window.dash_clientside && window.dash_clientside.set_props;
    if (!set) return;
    var line = (text || "server error").trim().split("\\n")[0], outs = [], shown = false;
    try { outs = [].concat(JSON.parse(body).outputs || []); } catch (e) { outs = []; }
    var note = {type: "Div", namespace: "dash_html_components", props: {className: "note note-error", children: line}};
    outs.forEach(function (o) {
      if (!o || typeof o.id !== "string") return;
      if (o.property === "children") { set(o.id, {children: note}); shown = true; }
      else if (o.property === "figure") {
        set(o.id, {figure: {data: [], layout: {xaxis: {visible: false}, yaxis: {visible: false}, height: 220,
          annotations: [{text: line, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
                         font: {color: "#b91c1c", size: 13}}]}}});
        shown = true;
      } else if (o.property === "rowData") set(o.id, {rowData: []});
    });
    if (!shown) set(%(page_error)s, {children: note});
  };
  // A JSON answer (the endpoint's {error} included), else the server's one line (the token gate's 403) as the error.
  window.opscopeJson = function (r) {
    if ((r.headers.get("content-type") || "").indexOf("json") >= 0) return r.json();
    return r.text().then(function (t) { throw new Error(r.status + " " + ((t || r.statusText).trim().split("\\n")[0])); });
  };
  if (timeline) {
    var q = new URLSearchParams(location.search), run = q.get("run"), step = q.get("step") || "all";
    var px = Math.max(200, Math.min(window.innerWidth, 1680) - 40 - 34 - 170 - 12);
    var url = prefix + "_opscope/timeline?px=" + Math.round(px) + (run ? "&run=" + encodeURIComponent(run) : "") +
              (step !== "all" ? "&step=" + encodeURIComponent(step) : "");
    window.opscopeTimelineFirst = {run: run, step: step, px: px, promise: fetch(url, {credentials: "same-origin"})
      .then(window.opscopeJson)};
  }
})();</script>"""


def _index_with_early_loads(app, modules) -> str:
    """Dash's index page with _EARLY in <head>."""
    early = _EARLY % {"prefix": json.dumps(app.config.requests_pathname_prefix),
                      "plotly": json.dumps(app.get_asset_url(PLOTLY_JS)), "page_error": json.dumps(ids.PAGE_ERROR),
                      "plotly_pages": json.dumps([m.PATH for m in modules if getattr(m, "PLOTS", False)])}
    return app.index_string.replace("{%css%}", "{%css%}\n        " + early, 1)


def _shell(modules):
    return html.Div(className="shell", children=[
        dcc.Location(id=ids.URL),
        dcc.Interval(id=ids.LIVE_TICK, interval=LIVE_POLL_MS, disabled=True),
        dcc.Store(id=ids.RUN_STATUS),
        html.Header(className="topbar", children=[
            html.A([html.Span("◆", className="brand-mark"), "opscope"], href="/", className="brand"),
            html.Nav(id=ids.NAV, className="nav", children=_nav(modules, "/", "")),
            html.Div(id=ids.RUN_BADGE, className="run-badge"),
        ]),
        html.Div(id=ids.ALERT_BANNER, className="alert-banner"),
        html.Main(className="page", children=[html.Div(id=ids.PAGE_ERROR, className="page-error"),
                                              dash.page_container]),
    ])


def _nav(modules, pathname, search):
    q = parse_qs((search or "").lstrip("?"))
    keep = urlencode({k: q[k][0] for k in ("run", "b") if q.get(k)})     # never ?token=: it stays in the cookie
    return [dcc.Link(m.NAME, href=m.PATH + (f"?{keep}" if keep else ""),
                     className="nav-link active" if pathname == m.PATH else "nav-link") for m in modules]


def _register_shell(app, data: WebData, modules):
    @app.callback(Output(ids.NAV, "children"), Input(ids.URL, "pathname"), Input(ids.URL, "search"))
    def nav(pathname, search):
        return _nav(modules, inputs.text(pathname, "pathname"), inputs.text(search, "search"))

    # The run a page shows, looked up once per address; while it runs, the poll below keeps RUN_STATUS current.
    @app.callback(Output(ids.RUN_STATUS, "data"), Input(ids.URL, "search"))
    def status(search):
        q = parse_qs((inputs.text(search, "search") or "").lstrip("?"))
        run = data.run((q.get("run") or [None])[0])
        if run is None:
            return None
        now = {"run": run["run_id"], "status": run.get("status"), "events": data.arrived(run),
               "dropped": int(run.get("dropped") or 0)}
        data.looked_up(now, run)
        return now

    @app.callback(Output(ids.RUN_BADGE, "children"), Output(ids.LIVE_TICK, "disabled"),
                  Input(ids.RUN_STATUS, "data"))
    def badge(status):
        status = inputs.run_status(status)
        if status is None:
            return html.Span("no runs yet: `opscope profile MODEL`", className="muted"), True
        run = data.run_info(status["run"], status.get("status"))
        if run is None:
            return html.Span(f"no run {status['run']!r}", className="muted"), True
        run = {**run, "status": status.get("status"), "dropped": status.get("dropped", 0)}
        return ui.run_badge(run, int(status.get("events") or 0)), status.get("status") != "running"

    # Alerts live in the run's config (`opscope monitor --run`): read afresh on every status change (the row the
    # status's own lookup just read, data.status_run), since the monitor writes them while the run's own row (what
    # run_info memoizes) stays the same.
    @app.callback(Output(ids.ALERT_BANNER, "children"), Input(ids.RUN_STATUS, "data"))
    def alerts(status):
        run = inputs.status_run(data, status)
        shown = ui.alert_banner(_alerts(run)) if run else None
        if shown is None and data.live and (run is None or run["run_id"] != data.live):
            live = data.run(data.live)          # the live run's alerts show on every page, whichever run is open
            if live is not None:
                shown = ui.alert_banner(_alerts(live), where=f"(live run {live['run_id'][:12]})")
        return shown

    # The poll: a cheap endpoint (the live run's counters live in memory), and RUN_STATUS changes only when
    # the run did, so pages redraw when there is something new, not on every tick.
    app.clientside_callback(_POLL_JS % {"endpoint": json.dumps(LIVE_ENDPOINT.lstrip("/")),
                                        "status": json.dumps(ids.RUN_STATUS)},
                            Output(ids.LIVE_TICK, "max_intervals"), Input(ids.LIVE_TICK, "n_intervals"),
                            State(ids.RUN_STATUS, "data"), prevent_initial_call=True)
    # a page's error line belongs to that page
    app.clientside_callback("function (_p) { return null; }", Output(ids.PAGE_ERROR, "children"),
                            Input(ids.URL, "pathname"))

    from flask import Response, request

    def live_endpoint():
        rid = inputs.text(request.args.get("run"), "run") or ""
        body = data.live_status(rid) if rid else None
        return Response(json.dumps(body if body else {"error": f"no run {rid!r}"}), status=200 if body else 404,
                        mimetype="application/json", headers={"Cache-Control": "no-store"})

    app.server.add_url_rule(LIVE_ENDPOINT, "opscope_live", live_endpoint)


def _register_metrics(app, data: WebData) -> None:
    """/metrics for Prometheus: the host now, and each running run's progress, host samples and stored alerts.
    Like every page it needs the token (gate.py), which Prometheus sends as `Authorization: Bearer`."""
    from flask import Response

    from opscope.profiler.alerts.watch import HostDevice
    from opscope.profiler.metrics import Metrics, from_store
    metrics, host = Metrics(), HostDevice()

    def endpoint():
        for subject, sample, device, _ in host.poll(0):
            metrics.sample(subject, sample, device)
        from_store(metrics, data.store, live=data.live_run or data.live)
        body, content_type = metrics.exposition()
        return Response(body, status=200, content_type=content_type, headers={"Cache-Control": "no-store"})

    app.server.add_url_rule(METRICS_ENDPOINT, "opscope_metrics", endpoint)


def _alerts(run: dict) -> list[dict]:
    found = (run.get("config") or {}).get("alerts")
    return found if isinstance(found, list) else []


_POLL_JS = """function (_n, status) {
  if (!status || status.status !== "running") return window.dash_clientside.no_update;
  var prefix = JSON.parse(document.getElementById("_dash-config").textContent).requests_pathname_prefix || "/";
  fetch(prefix + %(endpoint)s + "?run=" + encodeURIComponent(status.run), {credentials: "same-origin"})
    .then(function (r) { return r.ok ? r.json() : null; })
    .then(function (s) {
      if (!s || s.run !== status.run) return;
      if (s.events !== status.events || s.status !== status.status || s.dropped !== status.dropped) {
        window.dash_clientside.set_props(%(status)s, {data: s});
      }
    }).catch(function () {});
  return window.dash_clientside.no_update;
}"""


def start_in_thread(app: dash.Dash, host: str = "127.0.0.1", port: int = 0):
    """Serve `app` from a background thread; returns (server, url). server.shutdown() stops it."""
    import logging
    from .http_server import make_server     # werkzeug's threaded server, with header timeouts and a per-client bound
    logging.getLogger("werkzeug").setLevel(logging.WARNING)   # no line per request: the page polls
    srv = make_server(host, port, app.server)
    threading.Thread(target=srv.serve_forever, name="opscope-web", daemon=True).start()
    return srv, f"http://{f'[{host}]' if ':' in host else host}:{srv.server_port}"     # [::1]: IPv6 in a URL


def serve(run_id: str | None = None, live=None, host: str = "127.0.0.1", port: int = 8050,
          token: str | None = None, open_browser: bool = False, store=None, block: bool = True,
          token_file=None, allow_hosts=(), no_token: bool = False, token_in_url: bool = True):
    """Run the web analyzer. Every request needs a token (loopback too: every local user can reach 127.0.0.1):
    `token`, else `token_file`, else $OPSCOPE_TOKEN, else a new one (gate.server_token); the URL printed carries it.
    no_token: no token at all, on loopback only (a single-user machine); a warning says so.

    live: the run streaming in, as a run id or the profiler's LiveRun (`profile --web`); with a LiveRun
    the server says on stdout when the run ends, and keeps serving until Ctrl-C.
    allow_hosts: names besides `host` (and loopback) that browsers may use to reach it (a DNS name, a proxy).
    token_in_url: False leaves the token out of the URL printed (a token the deployment gave, kept out of logs).
    With block=False, returns (server, url) with the server running in a thread."""
    live_id = getattr(live, "run_id", live)
    token = gate.server_token(host, token, token_file, no_token)
    if no_token:
        print(f"opscope: warning: --no-token: every user of this machine can open {host}:{port} and read every "
              "run it serves", file=sys.stderr)
    app = create_app(store=store if store is not None else getattr(live, "store", None), token=token, live=live,
                     host=host, allow_hosts=allow_hosts)
    srv, base = start_in_thread(app, host, port)
    stopping = threading.Event()
    try:                            # from here on, Ctrl-C (even this early) stops the server quietly
        focus = run_id or live_id
        query = "&".join(x for x in (f"run={quote(focus)}" if focus else "",
                                     f"token={quote(token, safe='')}" if token and token_in_url else "") if x)
        url = f"{base}/{'timeline' if focus else ''}{'?' + query if query else ''}"
        hidden = (" (add ?token= with the token from OPSCOPE_TOKEN or the token file; --show-token prints it)"
                  if token and not token_in_url else "")
        print(f"opscope web analyzer: {url}{hidden}", flush=True)
        if hasattr(live, "wait"):
            threading.Thread(target=_say_when_done, args=(live, stopping), name="opscope-live-end",
                             daemon=True).start()
        if open_browser:
            webbrowser.open(url)
        if not block:
            return srv, url
        if threading.current_thread() is threading.main_thread():
            # `kill PID` ends it like Ctrl-C does, so `profile --web` still stops its runner and closes the run.
            signal.signal(signal.SIGTERM, _interrupt)
        threading.Event().wait()
    except KeyboardInterrupt:       # Ctrl-C is how this ends: no traceback
        pass
    finally:
        if block:
            stopping.set()
            srv.shutdown()
    return srv, url


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _say_when_done(live, stopping: threading.Event) -> None:
    status = live.wait()
    if stopping.is_set():           # stopped by Ctrl-C: the CLI says what happened to the run
        return
    dropped = f", {live.dropped:,} dropped" if live.dropped else ""
    error = f": {live.error}" if status != "ok" and live.error else ""
    print(f"run {live.run_id} {status}{error} ({live.events_received:,} events{dropped}); "
          "still serving it, Ctrl-C to stop", flush=True)
