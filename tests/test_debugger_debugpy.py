"""`--debugpy`: a real DAP client (what VS Code's "attach" speaks) against the model process.

The debuggee listens on 127.0.0.1, the client attaches, and a breakpoint on an op must stop the
process in debugpy *before* that op runs, on the stepping controller's worker thread, with a stack
the client can read; `continue` lets the model finish.
"""
import json
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("debugpy")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

TIMEOUT = 120

DEBUGGEE = """
import sys
from opscope.debugger import debugpy as dbg
from opscope.debugger.controller import Controller, Stop
from opscope.runtime import open_session

host, port = dbg.listen(0)
print("PORT", port, flush=True)
import debugpy
debugpy.wait_for_client()
session = open_session("demo:mlp", "numpy")
ctl = Controller(session, breakpoints=["linear"], use_debugpy=True)
ctl.cont()
ev = ctl.wait()
print("STOP", type(ev).__name__, getattr(ev, "op", None) or getattr(ev.node, "op", None), ev.seq, flush=True)
ctl.quit()
"""


class Dap:
    """Just enough of the Debug Adapter Protocol: Content-Length framed JSON over a socket."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.buf = b""
        self.seq = 0
        self.seen = []

    def send(self, command, **arguments):
        self.seq += 1
        body = json.dumps({"seq": self.seq, "type": "request", "command": command, "arguments": arguments}).encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return self.seq

    def _read(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        n = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
        while len(self.buf) < n:
            self._fill()
        msg, self.buf = json.loads(self.buf[:n]), self.buf[n:]
        self.seen.append(msg)
        return msg

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError(f"the adapter closed the connection; seen: {self.seen[-5:]}")
        self.buf += chunk

    def wait(self, kind, name, seq=None):
        """The next message of that kind (response/event) and command/event name."""
        t0 = time.time()
        while time.time() - t0 < TIMEOUT:
            m = self._read()
            if m.get("type") == kind and m.get("command" if kind == "response" else "event") == name \
                    and (seq is None or m.get("request_seq") == seq):
                return m
        raise AssertionError(f"no {kind} {name}; seen: {self.seen[-5:]}")

    def request(self, command, **arguments):
        r = self.wait("response", command, self.send(command, **arguments))
        assert r["success"], r
        return r.get("body") or {}


def test_a_dap_client_stops_before_the_op_and_reads_the_stack(tmp_path):
    script = tmp_path / "debuggee.py"
    script.write_text(DEBUGGEE)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT"), (line, proc.stderr.read() if proc.poll() is not None else "")
        dap = Dap(int(line.split()[1]))
        caps = dap.request("initialize", clientID="pytest", adapterID="debugpy", pathFormat="path",
                           linesStartAt1=True, columnsStartAt1=True)
        assert caps.get("supportsConfigurationDoneRequest")
        attach = dap.send("attach", justMyCode=False)
        dap.wait("event", "initialized")
        dap.request("configurationDone")
        dap.wait("response", "attach", attach)
        stopped = dap.wait("event", "stopped")["body"]
        frames = dap.request("stackTrace", threadId=stopped["threadId"], levels=20)["stackFrames"]
        where = [(f["name"], (f.get("source") or {}).get("path", "")) for f in frames]
        # stopped in the controller's before_op hook, called by the executor before the op's kernel
        assert any(name == "before_op" and path.endswith("controller.py") for name, path in where), where
        assert any(path.endswith("executor.py") for _, path in where), where
        threads = dap.request("threads")["threads"]
        assert any(t["id"] == stopped["threadId"] and t["name"] != "MainThread" for t in threads), threads
        dap.request("continue", threadId=stopped["threadId"])
        dap.wait("event", "terminated")                      # the model finished and the process ended
        dap.sock.close()      # the adapter (debugpy's child, holding our pipes) exits once the client leaves
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    stop = next(x for x in out.splitlines() if x.startswith("STOP"))
    assert stop.split()[1:3] == ["Stop", "linear"], stop         # and the TUI's own stop is the same op
