"""The web server against a local attacker (issue 11): Host checks (DNS rebinding), where the token comes from,
that it never shows in a page, port-scoped cookies, and callbacks that answer forged inputs with a 400."""
import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from opscope.app.web import gate, ids
from opscope.app.web.server import create_app, start_in_thread
from opscope.profiler.store import RunStore
from opscope.runtime.errors import UsageError

TOKEN = "Tk-3f9a-never-in-a-page"


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch):
    monkeypatch.delenv(gate.TOKEN_ENV, raising=False)


def one_line(r) -> str:
    text = r.get_data(as_text=True)
    assert text.endswith("\n") and text.count("\n") == 1, text[:300]
    return text


def a_run(store, n=6):
    rid = store.create_run(model="demo:mlp", backend="torch:cpu", device="cpu")
    store.add_events(rid, [(0, i, "linear" if i % 2 else "relu", f"n{i}", "fc", "m.py:3", "torch:cpu", "cpu", 1, 0,
                            i * 1000, i * 1000 + 800, "[[8,16]]", '["float32"]', "[[8,16]]", '["float32"]', 4096, 8192,
                            False, 1000 + i) for i in range(n)])
    store.finish_run(rid, status="ok")
    return rid


# --- Host (DNS rebinding) ------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["localhost", "localhost:8050", "127.0.0.1", "127.0.0.1:8050", "[::1]:8050",
                                  "[::1]", "LOCALHOST.", "localhost:9000"])   # any port: ssh -L 9000:localhost:8050
def test_loopback_server_answers_loopback_names(host):
    c = create_app().server.test_client()
    assert c.get("/_dash-layout", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:8050", "127.0.0.1.evil.example.com",
                                  "localhost.evil.example.com:8050", "192.168.1.4:8050", "[::2]:8050"])
def test_loopback_server_refuses_other_hosts(host):
    store = RunStore()
    a_run(store)
    c = create_app(store=store).server.test_client()
    for path in ("/", "/_dash-layout", "/_opscope/timeline?px=500", "/timeline"):
        r = c.get(path, headers={"Host": host})
        assert r.status_code == 403, (path, host)
        assert "not a name this server answers to" in one_line(r)
        assert "demo:mlp" not in r.get_data(as_text=True)
    r = c.post("/_dash-update-component", headers={"Host": host}, json={"output": "runs-table.rowData"})
    assert r.status_code == 403


def test_a_server_bound_to_an_address_answers_that_address_and_allowed_names():
    c = create_app(host="192.168.7.7", allow_hosts=["box.lan"]).server.test_client()
    for ok in ("192.168.7.7:8050", "192.168.7.7", "box.lan:8050", "BOX.LAN", "localhost"):
        assert c.get("/", headers={"Host": ok}).status_code == 200, ok
    for bad in ("10.0.0.1:8050", "evil.example.com", "box.lan.evil.example.com"):
        assert c.get("/", headers={"Host": bad}).status_code == 403, bad


def test_a_server_on_every_interface_answers_addresses_and_this_machines_names():
    """0.0.0.0 has no one address; a rebinding page always comes with a domain name, so IP literals pass."""
    c = create_app(host="0.0.0.0", token=TOKEN).server.test_client()
    for ok in ("10.1.2.3:8050", "[fe80::1]:8050", socket.gethostname(), "localhost:8050"):
        assert c.get(f"/?token={TOKEN}", headers={"Host": ok}).status_code == 200, ok
    assert c.get(f"/?token={TOKEN}", headers={"Host": "evil.example.com"}).status_code == 403


def test_host_header_parsing():
    assert gate.host_name("[::1]:8050") == "::1" and gate.host_name("Example.COM.:80") == "example.com"
    assert gate.host_name("127.0.0.1") == "127.0.0.1" and gate.host_name("::1") == "::1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _raw_get(port: int, path: str, host: str, cookie: str | None = None) -> tuple[int, dict, str]:
    """A hand-written HTTP request: nothing fills in the Host header for us."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Connection: close"] + ([f"Cookie: {cookie}"] if cookie else [])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.decode("utf-8", "replace").partition("\r\n\r\n")
    status = int(head.split()[1])
    headers = {}
    for line in head.split("\r\n")[1:]:
        k, _, v = line.partition(":")
        headers.setdefault(k.strip().lower(), []).append(v.strip())
    return status, headers, body


@pytest.mark.multiprocess
def test_cli_serve_refuses_a_rebinding_host_and_takes_its_token_from_the_environment(opscope_home):
    """A real `opscope serve` on loopback; the token in OPSCOPE_TOKEN, so it is not on the command line."""
    store = RunStore()
    rid = a_run(store)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "opscope.app", "serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OPSCOPE_HOME=str(opscope_home), OPSCOPE_TOKEN=TOKEN))
    try:
        line = proc.stdout.readline()
        # a token the deployment gave stays out of the output (a container's log): the URL comes without it
        assert f"http://127.0.0.1:{port}/ " in line and TOKEN not in line and "--show-token" in line, \
            (line, proc.stderr.read() if proc.poll() else "")
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert TOKEN.encode() not in f.read()                     # what `ps` shows
        status, _, body = _raw_get(port, f"/?token={TOKEN}", "evil.example.com")
        assert status == 403 and "not a name this server answers to" in body and body.count("\n") == 1
        status, _, body = _raw_get(port, f"/_opscope/timeline?px=500&token={TOKEN}", "evil.example.com:%d" % port)
        assert status == 403 and rid not in body
        assert _raw_get(port, "/", f"127.0.0.1:{port}")[0] == 403     # the right host, no token
        status, headers, body = _raw_get(port, f"/?token={TOKEN}", f"127.0.0.1:{port}")
        assert status == 200 and TOKEN not in body
        cookie = headers["set-cookie"][0]
        assert cookie.startswith(f"opscope_token_{port}=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
        status, _, body = _raw_get(port, "/_opscope/timeline?px=500", f"localhost:{port}", cookie.split(";")[0])
        assert status == 200 and json.loads(body)["run"] == rid          # the cookie alone lets the page in
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


# --- where the token comes from ----------------------------------------------------------------

def test_token_from_flag_file_or_environment(tmp_path, monkeypatch):
    assert gate.resolve_token() is None
    monkeypatch.setenv(gate.TOKEN_ENV, "from-env")
    assert gate.resolve_token() == "from-env"
    assert gate.resolve_token("from-flag") == "from-flag"                # the flag wins over the environment
    f = tmp_path / "token"
    f.write_text("from-file\n")
    f.chmod(0o600)
    assert gate.resolve_token(token_file=f) == "from-file"
    with pytest.raises(UsageError, match="one way"):
        gate.resolve_token("x", f)


@pytest.mark.parametrize("mode, text, message", [(0o644, "secret", "other users can read it"),
                                                 (0o640, "secret", "chmod 600"),
                                                 (0o600, "  \n", "is empty"),
                                                 (0o600, "two words", "spaces")])
def test_token_file_refusals(tmp_path, mode, text, message):
    f = tmp_path / "token"
    f.write_text(text)
    f.chmod(mode)
    with pytest.raises(UsageError, match=message):
        gate.resolve_token(token_file=f)
    with pytest.raises(UsageError, match="No such file"):
        gate.resolve_token(token_file=tmp_path / "missing")


def test_cli_serve_refuses_a_token_file_others_can_read(cli, tmp_path):
    f = tmp_path / "token"
    f.write_text("secret\n")
    f.chmod(0o644)
    r = cli("serve", "--port", str(_free_port()), "--token-file", f)
    assert r.returncode == 2
    assert "chmod 600" in r.stderr and "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_cli_help_prefers_the_environment_and_the_file(cli):
    out = cli("serve", "--help").stdout
    assert "--token-file" in out and "OPSCOPE_TOKEN" in out and "ps" in out


# --- the token never appears in a page ---------------------------------------------------------

def _callback_body(cb_key: str, cb: dict, values: list) -> dict:
    """A /_dash-update-component request as the Dash renderer sends it, with these input and state values."""
    single = not isinstance(cb["output"], list)
    outs = [{"id": o.component_id, "property": o.component_property} for o in ([cb["output"]] if single else
                                                                                 cb["output"])]
    slots = [{"id": d["id"], "property": d["property"]} for d in cb["inputs"] + cb["state"]]
    filled = [{**s, "value": v} for s, v in zip(slots, values)]
    n = len(cb["inputs"])
    return {"output": cb_key, "outputs": outs[0] if single else outs, "inputs": filled[:n], "state": filled[n:],
            "changedPropIds": [f"{s['id']}.{s['property']}" for s in slots[:n]]}


def _server_callbacks(app) -> dict:
    app.server.test_client().get("/")            # Dash registers its page-routing callback on the first request
    return {k: cb for k, cb in app.callback_map.items() if "callback" in cb}     # clientside ones run in the browser


def _valid_inputs(rid: str) -> dict:
    """For each (component, property) a callback takes, a value the pages themselves send."""
    return {("url", "pathname"): "/timeline", ("url", "search"): f"?run={rid}&token={TOKEN}",
            ("_pages_location", "pathname"): "/timeline", ("_pages_location", "search"): f"?run={rid}&token={TOKEN}",
            ("live-tick", "n_intervals"): 3,
            ("run-status", "data"): {"run": rid, "status": "ok", "events": 6, "dropped": 0},
            ("runs-table", "cellClicked"): {"rowId": rid, "colId": "run_id", "value": rid},
            ("runs-table", "selectedRows"): [{"id": rid}],
            ("timeline-step", "value"): "all", ("timeline-find", "value"): "lin",
            ("timeline-view", "data"): None, ("timeline-picked", "data"): [0, 1, 0.8],
            ("ops-group", "value"): "op", ("ops-table", "cellClicked"): {"rowId": "linear"},
            ("compare-a", "value"): rid, ("compare-b", "value"): rid,
            ("tensors-table", "cellClicked"): {"rowId": "n1/out0"}}


def test_the_token_appears_in_no_page_and_no_dash_resource(opscope_home):
    store = RunStore()
    rid = a_run(store)
    app = create_app(store=store, token=TOKEN)
    c = app.server.test_client()
    pages = ["/", "/timeline", "/operators", "/memory", "/compare", "/tensors", "/hardware", "/advisor"]
    plain = [str(rule) for rule in app.server.url_map.iter_rules()
             if "<" not in str(rule) and "GET" in rule.methods and str(rule) not in pages]
    assert "/_dash-layout" in plain and "/_dash-dependencies" in plain
    for path in pages + plain:
        r = c.get(f"{path}?run={rid}&token={TOKEN}")
        assert r.status_code in (200, 204, 301, 302, 400, 404), (path, r.status_code)
        assert TOKEN.encode() not in r.get_data(), path             # bytes: the favicon is not text
        assert TOKEN not in json.dumps(dict(r.headers)), path       # nor a Location or any other header
    index = c.get(f"/timeline?run={rid}&token={TOKEN}").get_data(as_text=True)
    assert 'property="twitter:url"' not in index and "_dash-config" in index
    # What callbacks answer: the page layouts (built from the URL's query) and the header's links.
    valid = _valid_inputs(rid)
    for key, cb in _server_callbacks(app).items():
        values = [valid.get((d["id"], d["property"])) for d in cb["inputs"] + cb["state"]]
        r = c.post("/_dash-update-component", json=_callback_body(key, cb, values))
        assert r.status_code in (200, 204), (key, r.get_data(as_text=True)[:300])
        assert TOKEN not in r.get_data(as_text=True), key


# --- the cookie belongs to one port ------------------------------------------------------------

def _get(url: str, cookie: str | None = None):
    req = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get_all("Set-Cookie") or []
    except urllib.error.HTTPError as e:
        return e.code, []


def test_a_cookie_from_one_server_does_not_open_another_on_another_port(opscope_home):
    """Browsers send every cookie of a host to all its ports: the name and the value are the port's own."""
    a, url_a = start_in_thread(create_app(token=TOKEN))
    b, url_b = start_in_thread(create_app(token=TOKEN))               # the same token (one OPSCOPE_TOKEN for both)
    try:
        status, cookies = _get(f"{url_a}/?token={TOKEN}")
        assert status == 200 and len(cookies) == 1
        name, value = cookies[0].split(";")[0].split("=", 1)
        assert name == f"opscope_token_{a.server_port}" and TOKEN not in value
        assert _get(f"{url_a}/_dash-layout", f"{name}={value}")[0] == 200
        assert _get(f"{url_b}/_dash-layout", f"{name}={value}")[0] == 403
        assert _get(f"{url_b}/_dash-layout", f"opscope_token_{b.server_port}={value}")[0] == 403    # renamed: no
        assert _get(f"{url_a}/_dash-layout?token={value}")[0] == 403     # the cookie's value is not the token
    finally:
        a.shutdown()
        b.shutdown()


# --- callbacks answer forged inputs with a 400, never a 500 -----------------------------------

BAD_VALUES = [None, [], [None, None, None], ["a", "b", "c"], [1e308, -1e308, 1e308], [2**70, 1, 1.0], {},
              {"run": 5}, {"run": ["x"]}, {"run": "no-such-run", "status": "ok", "events": 1, "dropped": 0},
              {"run": "x" * 200_000}, {"rowId": ["x"]}, {"rowId": 7}, [{"id": 3}], [{"no": "id"}], [7],
              "x" * 200_000, "no-such-run", "", 12345, -1.5, 1e308, True, "?run=a&run=b", "?run=" + "x" * 50_000,
              # issue 24: what reached DuckDB or the encoder (500), and shapes the callbacks read keys of
              {"rowId": "ok", "value": "\ud800"}, {"run": "x", "stamp": [1], "step": {"a": 1}, "find": [1]},
              {"run": "x", "status": "ok"}, [0, 1, "\ud800"], [1, 2, 3, 4], {"id": "\ud800"}]

# Invalid wherever they go: every callback input refuses them with a 400 (a lone surrogate no store or encoder
# takes, nested; a list where text or an object goes; an object where text or a list goes; 1 MB of text).
ALWAYS_INVALID = ["\ud800", "run-\udfff", "?run=\ud800", {"run": "\ud800", "status": "ok", "events": 1, "dropped": 0},
                  {"rowId": "\ud800"}, [{"id": "\ud800"}], [1], {"rowId": ["x"]}, "x" * 1_000_000,
                  {"rowId": "x" * 1_000_000}, json.loads("[" * 40 + '"deep"' + "]" * 40)]


@pytest.mark.slow       # every callback x every forged input: ~96 s under load 15: not in the quick set (issue 34)
def test_every_callback_answers_forged_inputs_with_400_or_a_page_never_500(opscope_home):
    store = RunStore()
    rid = a_run(store)
    app = create_app(store=store, token=TOKEN)
    c = app.server.test_client()
    c.get(f"/?token={TOKEN}")                        # the attacker holds the token
    callbacks = _server_callbacks(app)
    assert len(callbacks) >= 15
    valid = _valid_inputs(rid)
    refused = 0
    for key, cb in callbacks.items():
        slots = cb["inputs"] + cb["state"]
        baseline = [valid.get((d["id"], d["property"])) for d in slots]
        for i, slot in enumerate(slots):
            for bad in BAD_VALUES:
                values = baseline[:i] + [bad] + baseline[i + 1:]
                r = c.post("/_dash-update-component", json=_callback_body(key, cb, values))
                where = f"{key} {slot['id']}.{slot['property']} = {json.dumps(bad)[:60]}"
                assert r.status_code in (200, 204, 400), (where, r.status_code, r.get_data(as_text=True)[-500:])
                if r.status_code == 400:
                    refused += 1
                    assert one_line(r).startswith("400 bad request: "), where
    assert refused > 100                              # the checks ran (a broken gate would let all through)


def test_every_callback_input_has_a_schema_and_refuses_what_no_page_sends_with_400(opscope_home):
    """Issue 24: a forged body with a lone surrogate as a run id, or a wrong structure for a store, answered 500."""
    from opscope.app.web import inputs
    store = RunStore()
    rid = a_run(store)
    app = create_app(store=store)
    c = app.server.test_client()
    callbacks = _server_callbacks(app)
    slots = {(d["id"], d["property"]) for cb in callbacks.values() for d in cb["inputs"] + cb["state"]}
    assert slots <= set(inputs.SCHEMA), slots - set(inputs.SCHEMA)
    valid = _valid_inputs(rid)
    shown = 0
    for key, cb in callbacks.items():
        every = cb["inputs"] + cb["state"]
        baseline = [valid.get((d["id"], d["property"])) for d in every]
        for i, slot in enumerate(every):
            for bad in ALWAYS_INVALID:
                r = c.post("/_dash-update-component",
                           json=_callback_body(key, cb, baseline[:i] + [bad] + baseline[i + 1:]))
                where = f"{key} {slot['id']}.{slot['property']} = {json.dumps(bad)[:60]}"
                assert r.status_code == 400, (where, r.status_code, r.get_data(as_text=True)[-300:])
                assert one_line(r).startswith("400 bad request: "), where
                shown += 1
    assert shown >= 20 * len(ALWAYS_INVALID)


def test_a_callback_added_without_its_schema_line_is_a_500_that_says_so(opscope_home):
    """A bug of ours, not bad input: no value reaches a callback unchecked, and the log says what to add."""
    from dash import Input, Output
    app = create_app()

    @app.callback(Output(ids.NAV, "title"), Input("new-widget", "value"))
    def unchecked(value):
        return value
    r = app.server.test_client().post("/_dash-update-component", json=_callback_body(
        "nav.title", app.callback_map["nav.title"], ["anything"]))
    assert r.status_code == 500 and "new-widget.value has no schema" in one_line(r)


@pytest.mark.parametrize("slot, value, message", [
    (("run-status", "data"), {"run": "R", "stamp": [1], "step": {"a": 1}}, "exactly the keys run, status"),
    (("run-status", "data"), {"run": "R", "status": "ok", "events": "x", "dropped": 0}, "events must be a number"),
    (("timeline-view", "data"), {"run": "R", "stamp": [1], "step": "all", "find": ""}, "stamp must be a string"),
    (("timeline-view", "data"), {"run": "R", "stamp": "s", "step": {"a": 1}, "find": ""}, "step must be a number"),
    (("timeline-view", "data"), {"run": "R"}, "exactly the keys"),
    (("timeline-picked", "data"), [0, 1], "[step, seq, microseconds]"),
    (("timeline-picked", "data"), [0, 1, "\ud800"], "lone surrogate"),
    (("timeline-step", "value"), "drop table", "'all' or a step number"),
    (("runs-table", "selectedRows"), [{"id": "x"}] * 100_001, "at most 100,000"),
    (("ops-group", "value"), "\ud800", "lone surrogate"),
])
def test_a_wrong_structure_is_a_400_that_names_what_was_wrong(opscope_home, slot, value, message):
    store = RunStore()
    rid = a_run(store)
    app = create_app(store=store)
    c = app.server.test_client()
    value = json.loads(json.dumps(value).replace('"R"', json.dumps(rid)))
    valid = _valid_inputs(rid)
    tried = 0
    for key, cb in _server_callbacks(app).items():
        every = [(d["id"], d["property"]) for d in cb["inputs"] + cb["state"]]
        if slot in every:
            values = [value if s == slot else valid.get(s) for s in every]
            r = c.post("/_dash-update-component", json=_callback_body(key, cb, values))
            assert r.status_code == 400 and message in one_line(r), (key, r.get_data(as_text=True)[:300])
            tried += 1
    assert tried


@pytest.mark.parametrize("body, message", [
    ([1, 2], "JSON object"), ({"output": "nope.children"}, "no callback"), ({"output": ["x"]}, "no callback"),
    ({"output": "timeline-view.id", "outputs": {"id": "timeline-view", "property": "id"}, "inputs": []},
     "clientside"),
    ({"output": "hardware-graph.children", "outputs": {"id": "hardware-graph", "property": "children"},
      "inputs": []}, "takes 1"),
    ({"output": "hardware-graph.children", "outputs": {"id": "hardware-graph", "property": "children"},
      "inputs": [{"id": "url", "property": "search", "value": ""}]}, "expected run-status.data"),
    ({"output": "hardware-graph.children", "outputs": [{"id": "nav", "property": "children"}],
      "inputs": [{"id": "run-status", "property": "data", "value": None}]}, "expected hardware-graph.children"),
    ({"output": "hardware-graph.children", "outputs": {"id": "hardware-graph", "property": "children"},
      "inputs": [{"id": "run-status", "property": "data", "value": None}], "changedPropIds": [1]}, "changedPropIds"),
    ({"output": "hardware-graph.children", "outputs": {"id": "hardware-graph", "property": "children"},
      "inputs": [{"id": "run-status", "property": "data", "value": None}], "changedPropIds": ["\ud800"]},
     "lone surrogate"),
])
def test_malformed_callback_requests_are_400(body, message):
    app = create_app()
    c = app.server.test_client()
    c.get("/")
    r = c.post("/_dash-update-component", json=body)
    assert r.status_code == 400 and message in one_line(r)
    assert c.post("/_dash-update-component", data=b"{not json", content_type="application/json").status_code == 400
    deep = b"[" * 100_000 + b"]" * 100_000               # Python's JSON parser recursed until RecursionError: 500
    r = c.post("/_dash-update-component", data=deep, content_type="application/json")
    assert r.status_code == 400 and "nested too deep" in one_line(r)


def test_a_callback_that_fails_on_valid_input_is_still_a_500_with_its_traceback_logged(opscope_home, caplog):
    """The 400s are for inputs the pages never send: a real bug must not be dressed up as one."""
    store = RunStore()
    rid = a_run(store)
    app = create_app(store=store)

    def broken():
        raise RuntimeError("a real bug in the runs query")
    app.opscope_data.runs = broken
    cb = app.callback_map["runs-table.rowData"]
    body = _callback_body("runs-table.rowData", cb, [_valid_inputs(rid)[("run-status", "data")]])
    r = app.server.test_client().post("/_dash-update-component", json=body)
    assert r.status_code == 500
    assert any("a real bug in the runs query" in (rec.exc_text or "") or
               (rec.exc_info and "a real bug" in str(rec.exc_info[1])) for rec in caplog.records)


def test_the_timeline_page_refuses_a_repeated_url_parameter(opscope_home):
    store = RunStore()
    rid = a_run(store)
    app = create_app(store=store)
    cb_key = next(k for k in _server_callbacks(app) if "_pages_content" in k)
    cb = app.callback_map[cb_key]
    r = app.server.test_client().post("/_dash-update-component", json=_callback_body(
        cb_key, cb, ["/timeline", f"?run={rid}&run={rid}"]))
    assert r.status_code == 400 and "?run= appears 2 times" in one_line(r)
    r = app.server.test_client().post("/_dash-update-component", json=_callback_body(
        cb_key, cb, ["/timeline", f"?run={rid}"]))
    assert r.status_code == 200 and re.search(rid, r.get_data(as_text=True))


# --- in a real browser -------------------------------------------------------------------------

@pytest.mark.browser
@pytest.mark.slow
def test_in_a_browser_the_token_leaves_the_address_bar_and_the_cookie_carries_on(opscope_home, tmp_path):
    import shutil
    if not shutil.which("chromium") or not shutil.which("chromedriver"):
        pytest.skip("needs chromium and chromedriver")
    from selenium.webdriver.support.ui import WebDriverWait

    from opscope.app.web.browser import headless_chromium
    store = RunStore()
    rid = a_run(store)
    srv, url = start_in_thread(create_app(store=store, token=TOKEN))
    driver = headless_chromium(str(tmp_path / "chrome"))
    badge = "var b = document.getElementById('run-badge'); return b && b.textContent.indexOf('demo:mlp') >= 0;"
    try:
        driver.get(f"{url}/timeline?run={rid}&token={TOKEN}")
        WebDriverWait(driver, 90).until(lambda d: d.execute_script(badge))
        assert driver.execute_script("return location.search") == f"?run={rid}"
        assert TOKEN not in driver.page_source and TOKEN not in driver.execute_script("return document.cookie")
        driver.refresh()                                  # no ?token= any more: the (HttpOnly) cookie lets it in
        WebDriverWait(driver, 90).until(lambda d: d.execute_script(badge))
        severe = [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
        assert not severe, severe
    finally:
        driver.quit()
        srv.shutdown()
