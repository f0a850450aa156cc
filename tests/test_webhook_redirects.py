"""`monitor --webhook URL` never follows a redirect (issue 33, point 6).

Before this fix the POST followed 301/302/303 to any host and port (turned into a GET on the way) and even to
ftp://: whoever answers the webhook URL could point opscope's alerts at any address the host reaches. Now a 3xx
is a failed delivery naming where it pointed, and the server it pointed at receives nothing. Real servers on
127.0.0.1: one answers every POST with a redirect, the other counts whatever reaches it.
"""
import json
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from opscope.profiler.alerts.watch import alertmanager_payload, post_webhook

ALERT = {"rule": "busy", "severity": "warning", "subject": "host", "metric": "utilization", "message": "busy",
         "value": 1.0, "started_at": 0.0}


class _Anything(BaseHTTPRequestHandler):
    """The place a redirect points at: every request of any method is noted."""

    def _note(self):
        self.server.got.put((self.command, self.path))
        self.send_response(200)
        self.end_headers()

    do_GET = do_POST = do_PUT = do_HEAD = _note

    def log_message(self, *a):
        pass


class _Redirecting(BaseHTTPRequestHandler):
    """Answers a POST to /CODE with that code and Location: the server's `to`."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(int(self.path.strip("/")))
        self.send_header("Location", self.server.to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def _serve(handler):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.got = queue.Queue()
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv


@pytest.fixture
def servers():
    target, redirecting = _serve(_Anything), _serve(_Redirecting)
    yield redirecting, target
    for srv in (redirecting, target):
        srv.shutdown()
        srv.server_close()


def _payload():
    return alertmanager_payload([ALERT], "firing")


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("where", ["other port", "ftp"])
def test_a_redirect_is_a_failed_delivery_naming_where_it_pointed(servers, code, where):
    redirecting, target = servers
    redirecting.to = (f"http://127.0.0.1:{target.server_port}/stolen" if where == "other port"
                      else f"ftp://127.0.0.1:{target.server_port}/stolen")
    url = f"http://127.0.0.1:{redirecting.server_port}/{code}"
    failed = post_webhook(url, _payload(), timeout=10)
    assert failed is not None, "a redirect passed for a delivery"
    assert str(code) in failed and redirecting.to in failed and "not followed" in failed, failed
    assert "\n" not in failed
    assert target.got.empty(), f"the redirect was followed: {target.got.get()}"


def test_a_receiver_that_takes_the_post_is_still_a_delivery(servers):
    _, target = servers
    assert post_webhook(f"http://127.0.0.1:{target.server_port}/hook", _payload(), timeout=10) is None
    method, path = target.got.get(timeout=5)
    assert (method, path) == ("POST", "/hook")


def test_a_hostile_location_is_cut_and_prints_as_one_line(servers):
    redirecting, target = servers
    redirecting.to = "http://127.0.0.1:1/" + "\x1b[2J" + "x" * 5000
    failed = post_webhook(f"http://127.0.0.1:{redirecting.server_port}/302", _payload(), timeout=10)
    assert failed is not None and len(failed) < 600, failed
    assert json.dumps(failed)          # text, one value
    assert target.got.empty()
