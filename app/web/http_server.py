"""The web analyzer's HTTP server: werkzeug's threaded server with the two bounds a slowloris needs.

    srv = make_server(host, port, app.server)   # start_in_thread (server.py) serves it
    srv.serve_forever()

- A request's line and headers must arrive within HEADER_SECONDS (an idle keep-alive connection waits the
  same): a connection that sends nothing, or a byte now and then, is closed (one watcher thread for all of
  them) instead of holding its thread for ever. A body or a response stalls at most IO_SECONDS a read or write.
- At most PER_CLIENT connections at a time from one address; more are closed at once, unanswered. One
  thread per connection stays the model (werkzeug), so 1,000 idle sockets cost PER_CLIENT threads, not 1,000.
"""
from __future__ import annotations

import socket
import threading
import time

from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

HEADER_SECONDS = 5.0       # a browser sends a request's headers in one packet
IO_SECONDS = 30.0          # a stalled upload or a reader that stopped reading
PER_CLIENT = 64            # a browser opens ~6 per host; a proxy in front (deploy/) carries several users


class BoundedRequestHandler(WSGIRequestHandler):
    timeout = IO_SECONDS         # StreamRequestHandler.setup puts it on the socket: a stalled body or reader
    late = False                 # the deadline watcher closed this connection: nothing to log

    def handle_one_request(self) -> None:
        # a per-read timeout alone lets a byte every few seconds hold the thread for ever: the deadline is
        # for the whole request line and headers, and the server's one watcher thread enforces it
        self.server.watch(self, time.monotonic() + HEADER_SECONDS)
        try:
            super().handle_one_request()
        finally:
            self.server.unwatch(self)

    def parse_request(self) -> bool:
        ok = super().parse_request()       # the headers are in: from here on IO_SECONDS a read or write
        self.server.unwatch(self)
        return ok

    def log_error(self, format: str, *args) -> None:
        if not self.late and "timed out" not in format % args:   # a connection closed for idling: the bound working
            super().log_error(format, *args)


class BoundedServer(ThreadedWSGIServer):
    """ThreadedWSGIServer that counts connections per client address and refuses those past PER_CLIENT."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._deadlines: dict[BoundedRequestHandler, float] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._watch_deadlines, name="opscope-web-deadlines", daemon=True).start()

    def watch(self, handler: BoundedRequestHandler, deadline: float) -> None:
        with self._lock:
            self._deadlines[handler] = deadline

    def unwatch(self, handler: BoundedRequestHandler) -> None:
        with self._lock:
            self._deadlines.pop(handler, None)

    def _watch_deadlines(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self._lock:
                late = [h for h, d in self._deadlines.items() if d <= now]
                for h in late:
                    del self._deadlines[h]
            for h in late:                 # its blocked read returns at once; its thread ends
                h.late = True
                try:
                    h.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def shutdown(self) -> None:
        self._stop.set()
        super().shutdown()

    def server_close(self) -> None:
        self._stop.set()
        super().server_close()

    def verify_request(self, request, client_address) -> bool:
        who = client_address[0] if isinstance(client_address, tuple) else str(client_address)
        with self._lock:
            if self._open.get(who, 0) >= PER_CLIENT:
                return False               # socketserver closes it unanswered
            self._open[who] = self._open.get(who, 0) + 1
        return True

    def process_request(self, request, client_address) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:              # no thread started: the slot is free again
            self._release(client_address)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(client_address)

    def _release(self, client_address) -> None:
        who = client_address[0] if isinstance(client_address, tuple) else str(client_address)
        with self._lock:
            n = self._open.get(who, 0) - 1
            if n > 0:
                self._open[who] = n
            else:
                self._open.pop(who, None)

    def connections(self) -> dict[str, int]:
        with self._lock:
            return dict(self._open)


def make_server(host: str, port: int, wsgi_app) -> BoundedServer:
    return BoundedServer(host, port, wsgi_app, BoundedRequestHandler)
