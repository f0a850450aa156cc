"""The web server against a slow or idle client (issue 33, item 5), over real sockets to a real server on
127.0.0.1: an asset path it does not serve is a 404 with nothing in the log, idle and trickling connections are
closed once their headers are late, and one address holds at most PER_CLIENT connections while others are served."""
import logging
import socket
import threading
import time

import pytest

from opscope.app.web import gate, http_server
from opscope.app.web.server import create_app, start_in_thread

TOKEN = "Tk-33-connections"
DEADLINE = 120          # seconds: every loop below ends by itself, whatever the server does


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch):
    monkeypatch.delenv(gate.TOKEN_ENV, raising=False)


@pytest.fixture
def server(opscope_home):
    srv, url = start_in_thread(create_app(token=TOKEN))
    yield srv
    srv.shutdown()


def _request(port: int, path: str, source: str = "127.0.0.1") -> tuple[int, str]:
    """An authenticated GET written by hand: the path goes out as it is (no client normalizes `..`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0)) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Opscope-Token: {TOKEN}\r\n"
                  "Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.decode("utf-8", "replace").partition("\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize("path", ["/_dash-component-suites/../../../etc/passwd",
                                  "/_dash-component-suites/dash/deps/polyfill@7.js",
                                  "/_dash-component-suites/nope/x.js", "/_dash-component-suites/dash/../../x",
                                  "/assets/../../../etc/passwd", "/assets/no-such.css"])
def test_an_asset_path_it_does_not_serve_is_a_404_and_leaves_no_traceback(server, path, caplog):
    """Was: 500 and Dash's DependencyException with its traceback in the log."""
    with caplog.at_level(logging.DEBUG):
        status, body = _request(server.server_port, path)
    assert status == 404 and "root:" not in body, body[:300]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text[-2000:]
    assert _request(server.server_port, "/_dash-layout")[0] == 200     # and what it serves, it serves


def _closed_by_server(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:               # reset: closed as well
        return True


def _wait(what, condition) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < end, f"still {what} after {DEADLINE} s"
        time.sleep(0.2)


def test_200_idle_connections_are_closed_while_another_client_is_served(server):
    """1,000 idle connections held 1,003 threads for ever. Now one address holds at most PER_CLIENT, each until
    its headers are late, and the server answers others meanwhile (127.0.0.2 is loopback too: another client)."""
    base = threading.active_count()
    idle = []
    for _ in range(200):
        s = socket.create_connection(("127.0.0.1", server.server_port), timeout=60, source_address=("127.0.0.2", 0))
        s.setblocking(False)
        idle.append(s)
    try:
        # 200 connected; the server takes at most PER_CLIENT of them and closes the rest at once
        _wait("accepting", lambda: sum(map(_closed_by_server, idle)) >= 200 - http_server.PER_CLIENT)
        assert server.connections().get("127.0.0.2", 0) <= http_server.PER_CLIENT
        assert threading.active_count() <= base + http_server.PER_CLIENT + 2
        assert _request(server.server_port, "/_dash-layout")[0] == 200        # another client: served
        _wait("holding idle connections", lambda: all(_closed_by_server(s) for s in idle))
        _wait("holding threads", lambda: threading.active_count() <= base + 1)
        # a handler closes its socket, then gives back its place: the count may trail the close by a moment
        _wait("counting connections", lambda: server.connections() == {})
        assert _request(server.server_port, "/_dash-layout", source="127.0.0.2")[0] == 200   # and served again
    finally:
        for s in idle:
            s.close()


def test_a_request_that_trickles_its_headers_is_closed_at_the_header_deadline(server):
    """A byte at a time keeps a per-read timeout alive for ever; the deadline covers the whole header."""
    s = socket.create_connection(("127.0.0.1", server.server_port), timeout=60)
    try:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sent, end = 0, time.monotonic() + DEADLINE
        while True:
            assert time.monotonic() < end, f"a trickling request still open after {DEADLINE} s"
            try:
                s.sendall(b"X")
            except OSError:
                break
            sent += 1
            s.setblocking(False)
            if _closed_by_server(s):
                break
            s.setblocking(True)
            time.sleep(0.5)
        assert sent >= 1
    finally:
        s.close()
