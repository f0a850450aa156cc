"""`--debugpy`: a real DAP client (what VS Code's "attach" speaks) against the model process.

The debuggee listens on 127.0.0.1, the client attaches, and a breakpoint on an op must stop the
process in debugpy *before* that op runs, on the stepping controller's worker thread, in a frame at
the op's own line of the user's model file with the op's inputs as variables; the time paused in
the IDE is not the op's time; `continue` lets the model finish.
"""
import json
import socket
import subprocess
import sys
import time

import pytest

from debugger_models import PLANTED_NAN, write

pytest.importorskip("debugpy")
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

TIMEOUT = 120

DEBUGGEE = """
import sys
from opscope.debugger import debugpy as dbg
from opscope.debugger.controller import Controller, Stop
from opscope.debugger.pystack import open_debug_session

host, port = dbg.listen(0)
print("PORT", port, flush=True)
import debugpy
debugpy.wait_for_client()
session = open_debug_session(sys.argv[1] + ":factory", "numpy")
ctl = Controller(session, breakpoints=["linear"], use_debugpy=True)
ctl.cont()
ev = ctl.wait()
print("STOP", type(ev).__name__, ev.node.op, ev.seq, ev.node.source, ev.seconds, flush=True)
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


def test_a_dap_client_stops_in_the_users_frame_before_the_op_and_the_pause_is_not_op_time(tmp_path):
    script = tmp_path / "debuggee.py"
    script.write_text(DEBUGGEE)
    model = write(tmp_path, "planted.py", PLANTED_NAN)
    proc = subprocess.Popen([sys.executable, str(script), model], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
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
        top = frames[0]
        # the IDE opens the user's model at the op's own line: `h = torch.relu(self.a(x))`
        assert (top.get("source") or {}).get("path") == model and top["line"] == 13, frames[:3]
        scopes = dap.request("scopes", frameId=top["id"])["scopes"]
        names = set()
        for sc in scopes:
            names |= {v["name"] for v in dap.request("variables", variablesReference=sc["variablesReference"])["variables"]}
        assert {"in0", "in1", "in2"} <= names, names          # the op's inputs (x, a.weight, a.bias)
        threads = dap.request("threads")["threads"]
        assert any(t["id"] == stopped["threadId"] and t["name"] != "MainThread" for t in threads), threads
        time.sleep(2.0)                                      # the user reads the frame for a while
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
    kind, op, seq, source, seconds = stop.split()[1:6]
    assert (kind, op, source) == ("Stop", "linear", f"{model}:13"), stop   # the TUI's own stop is the same op
    assert float(seconds) < 1.0, stop          # the 2 s paused in the IDE are not the op's time
