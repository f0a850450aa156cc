"""A token on loopback too (issue 24, Jupyter's model): every local user can reach 127.0.0.1, so `serve` and
`profile --web` generate a token by default and print the URL with it; `--no-token` is the explicit opt-out, on
loopback only, and only 127.0.0.1, ::1 and localhost are loopback (127.0.0.2 is not)."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

import pytest

from opscope.app.web import gate
from opscope.app.web.server import serve
from opscope.profiler.store import RunStore
from opscope.runtime.errors import UsageError

from test_web_security import a_run

URL_LINE = re.compile(r"opscope web analyzer: (http://\S+)")


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch):
    monkeypatch.delenv(gate.TOKEN_ENV, raising=False)


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _status(url: str, data: bytes | None = None) -> int:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


# A callback the runs page makes (its table), as the browser sends it.
RUNS_CALLBACK = json.dumps({"output": "runs-table.rowData", "outputs": {"id": "runs-table", "property": "rowData"},
                            "inputs": [{"id": "run-status", "property": "data", "value": None}],
                            "changedPropIds": ["run-status.data"], "state": []}).encode()


def test_only_the_loopback_names_are_loopback():
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "LOCALHOST.", "0:0:0:0:0:0:0:1"):
        assert gate.is_loopback(host), host
    for host in ("127.0.0.2", "127.1.2.3", "0.0.0.0", "::", "192.168.1.4", "example.org", "localhost.example.org"):
        assert not gate.is_loopback(host), host


def test_the_server_token_policy():
    assert len(gate.server_token("127.0.0.1")) >= 40                 # generated: secrets.token_urlsafe()
    assert gate.server_token("127.0.0.1") != gate.server_token("127.0.0.1")
    assert gate.server_token("127.0.0.1", "mine") == "mine"
    assert gate.server_token("127.0.0.1", no_token=True) is None
    with pytest.raises(UsageError, match="127.0.0.2 is not loopback"):
        gate.server_token("127.0.0.2", no_token=True)
    with pytest.raises(UsageError, match="give one or the other"):
        gate.server_token("127.0.0.1", "mine", no_token=True)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"])
def test_serve_generates_a_token_on_loopback_and_off_it_and_refuses_requests_without_it(host, opscope_home,
                                                                                       capsys):
    rid = a_run(RunStore())
    srv, url = serve(host=host, port=0, block=False)
    try:
        out, err = capsys.readouterr()
        token = re.search(r"\?token=([\w-]+)$", URL_LINE.search(out).group(1)).group(1)
        assert err == ""                                        # nothing to warn about: the URL says it all
        base = f"http://{host}:{srv.server_port}"
        for path in ("/", "/_dash-layout", f"/_opscope/timeline?px=500&run={rid}", f"/_opscope/live?run={rid}"):
            assert _status(base + path) == 403, path
        assert _status(f"{base}/_dash-update-component", RUNS_CALLBACK) == 403
        assert _status(f"{base}/?token={token}") == 200
        assert _status(f"{base}/_dash-layout?token={token}") == 200
    finally:
        srv.shutdown()


def test_serve_with_no_token_warns_in_one_line_and_is_open(opscope_home, capsys):
    srv, url = serve(port=0, block=False, no_token=True)
    try:
        out, err = capsys.readouterr()
        assert "token=" not in out and url == f"http://127.0.0.1:{srv.server_port}/"
        assert err.count("\n") == 1 and err.startswith("opscope: warning: --no-token: every user of this machine")
        assert _status(url) == 200
    finally:
        srv.shutdown()


@pytest.mark.parametrize("argv, message", [
    (["serve", "--no-token", "--host", "127.0.0.2"], "127.0.0.2 is not loopback"),
    (["serve", "--no-token", "--host", "0.0.0.0"], "0.0.0.0 is not loopback"),
    (["serve", "--no-token", "--token", "abc"], "give one or the other"),
    (["profile", "demo:mlp", "--web", "--no-token", "--host", "127.0.0.2"], "127.0.0.2 is not loopback"),
])
def test_no_token_off_loopback_or_beside_a_token_is_refused_in_one_line(cli, argv, message, opscope_home):
    r = cli(*argv, "--port", str(_free_port()), timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert RunStore().list_runs() == []                      # refused before a runner started


def _start_serve(home, port: int, *extra: str) -> tuple[subprocess.Popen, str]:
    """A real `opscope serve` (default options plus `extra`); returns it and the URL it printed."""
    proc = subprocess.Popen([sys.executable, "-m", "opscope.app", "serve", "--port", str(port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**{k: v for k, v in os.environ.items() if k != gate.TOKEN_ENV},
                                 "OPSCOPE_HOME": str(home)})
    line = proc.stdout.readline()
    m = URL_LINE.search(line)
    if m is None:
        proc.kill()
        pytest.fail(f"no URL from serve: {line!r} {proc.communicate(timeout=60)[1][-2000:]}")
    return proc, m.group(1)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_another_local_user_gets_403_from_a_default_serve(opscope_home, tmp_path):
    """The attack of issue 24 for real: a throwaway unprivileged user, made here, asks a default `opscope serve`
    for the page and for a callback with plain urllib; the owner, with the URL's token, gets in."""
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("needs root (to make a throwaway user), useradd and runuser")
    python = "/usr/bin/python3"              # the other user cannot read root's own interpreter's folder
    if not os.access(python, os.X_OK):
        pytest.skip(f"needs {python}")
    rid = a_run(RunStore())
    user = f"opscope-t{os.getpid()}"
    subprocess.run(["useradd", "-M", "-N", "-s", "/bin/sh", user], check=True, capture_output=True, timeout=60)
    proc = None
    try:
        port = _free_port()
        proc, url = _start_serve(opscope_home, port)
        token = url.split("?token=", 1)[1]
        base = f"http://127.0.0.1:{port}"
        probe = textwrap.dedent("""
            import sys, urllib.request, urllib.error
            base, rid, body = sys.argv[1:]
            for url, data in ((base + "/", None), (base + "/_opscope/live?run=" + rid, None),
                              (base + "/_dash-update-component", body.encode())):
                req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=60) as r:
                        print(r.status, r.read().decode()[:2000].strip())
                except urllib.error.HTTPError as e:
                    print(e.code, e.read().decode()[:2000].strip())
        """)
        r = subprocess.run(["runuser", "-u", user, "--", python, "-c", probe, base, rid, RUNS_CALLBACK.decode()],
                           capture_output=True, text=True, timeout=120, cwd="/")
        answers = r.stdout.splitlines()
        assert r.returncode == 0 and len(answers) == 3, (r.stdout, r.stderr)
        assert subprocess.run(["runuser", "-u", user, "--", "id", "-u"], capture_output=True, text=True,
                              timeout=60).stdout.strip() != "0"                # the probe really was someone else
        for answer in answers:
            assert answer.split()[0] in ("401", "403") and "needs its token" in answer, answers
            assert rid not in answer and "demo:mlp" not in answer
        assert _status(f"{base}/?token={token}") == 200                        # the owner, with the printed URL
        assert _status(f"{base}/_dash-update-component?token={token}", RUNS_CALLBACK) == 200
    finally:
        if proc is not None:
            proc.terminate()
            proc.communicate(timeout=60)
        subprocess.run(["userdel", user], capture_output=True, timeout=60)
