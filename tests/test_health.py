"""The container's HEALTHCHECK and the Kubernetes probes (app/web/health.py) against a real server: healthy only
when the analyzer answers, never because it refused the probe (a 403 once counted as healthy)."""
import urllib.request

import pytest

from opscope.app.web import gate, health
from opscope.app.web.server import create_app, start_in_thread

TOKEN = "Tk-health-7c1e"


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch):
    monkeypatch.delenv(gate.TOKEN_ENV, raising=False)


@pytest.fixture
def server(opscope_home):
    srv, url = start_in_thread(create_app(token=TOKEN))
    yield url
    srv.shutdown()


def test_with_the_token_the_probe_reads_metrics(server):
    ok, line = health.probe(f"{server}/metrics", TOKEN)
    assert ok and line.endswith(": 200")


def test_a_refused_request_is_unhealthy(server):
    ok, line = health.probe(f"{server}/metrics", None)          # no token: the gate answers 403
    assert not ok and line.endswith(": 403")
    ok, line = health.probe(f"{server}/metrics", "not-the-token")
    assert not ok and line.endswith(": 403")


def test_without_a_token_the_probe_asks_healthz_which_carries_no_data(server, monkeypatch):
    monkeypatch.setattr(health, "DEFAULT_BASE", server)
    ok, line = health.probe(None, None)
    assert ok and "/healthz: 200" in line
    with urllib.request.urlopen(f"{server}/healthz", timeout=30) as r:
        assert r.read() == b"ok\n"


def test_a_dead_server_is_unhealthy_in_one_line(server):
    ok, line = health.probe("http://127.0.0.1:9/healthz", None, timeout=2)
    assert not ok and "\n" not in line


def test_main_exits_1_on_a_refusal(server, capsys):
    assert health.main([f"{server}/metrics"]) == 1
    assert capsys.readouterr().out.startswith("unhealthy: ")


@pytest.mark.multiprocess
@pytest.mark.parametrize("show", [False, True])
def test_a_token_from_the_environment_stays_out_of_the_log_unless_asked(opscope_home, tmp_path, show):
    """`opscope serve` in a container: OPSCOPE_TOKEN from a secret; the log must not carry it (issue 39)."""
    import os
    import socket
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "opscope.app", "serve", "--port", str(port),
                             *(["--show-token"] if show else [])], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, OPSCOPE_TOKEN=TOKEN))
    try:
        line = proc.stdout.readline()
        assert "web analyzer: http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
        assert (TOKEN in line) == show, line
    finally:
        proc.terminate()
        proc.wait(timeout=60)
