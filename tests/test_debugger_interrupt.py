"""The debugger answers the keys a pdb/gdb user presses, at any terminal size (issue 27, item 11):
Ctrl-C pauses a running continue and a second Ctrl-C quits with 130, errors show at 80x24, `q`
with --report exits 0, the dtype shown is the one computed, and `debug` without a terminal is one line."""
import csv
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from opscope.debugger.app import DebuggerApp
from opscope.debugger.controller import Controller, Finished, Stop
from opscope.runtime import open_session

from debugger_models import LOW_SOFTMAX_TOML, SOFTMAX, until, write

# every op sleeps: a continue runs for seconds, long enough to be interrupted wherever it is
SLOW = '''
import time

import torch
from torch import nn

from opscope.runtime import operator


def _slow(x):
    time.sleep(0.02)
    return x + 1


@operator(reference=_slow)
def dbg_test_slow(x):
    time.sleep(0.02)
    return x + 1


class Slow(nn.Module):
    def forward(self, x):
        for _ in range(150):
            x = dbg_test_slow(x)
        return x


def factory():
    return Slow().eval(), (torch.zeros(4),)
'''


def _app(session, **kw):
    return DebuggerApp(Controller(session), model=session.spec, **kw)


async def test_ctrl_c_pauses_a_running_continue_and_a_second_quits_130(tmp_path):
    s = open_session(write(tmp_path, "slow.py", SLOW) + ":factory", "numpy")
    app = _app(s)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq == 0)
        await pilot.press("c")
        while app.ctl.state != "running":
            await pilot.pause(0.01)
        await pilot.press("ctrl+c")
        ev = await until(pilot, app, lambda e: isinstance(e, (Stop, Finished)) and getattr(e, "seq", 0) != 0)
        assert isinstance(ev, Stop) and "interrupted" in ev.reason, ev     # paused mid-run, not finished
        assert 0 < ev.seq < len(app.ctl.steps) - 1
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 130


async def test_a_bad_pattern_is_visible_at_80x24(tmp_path):
    """At 80x24 the log is hidden: the error goes to the notice line, which shows at every size."""
    app = _app(open_session("demo:mlp", "numpy"))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, app, lambda e: isinstance(e, Stop))
        assert not app.query_one("#log").display or app.query_one("#log").region.height == 0
        for pattern, needle in (("[/]", "matches no op"), ("max_abs >> 3", "neither a place nor a condition")):
            await pilot.press("a")
            for ch in pattern:
                await pilot.press({" ": "space", ">": "greater_than_sign", "[": "left_square_bracket",
                                   "]": "right_square_bracket", "/": "slash"}.get(ch, ch))
            await pilot.press("enter")
            await pilot.pause()
            notice = app.query_one("#notice")
            shown = str(notice.render())
            assert notice.display and notice.region.height >= 1, pattern
            assert needle in shown and (pattern in shown or pattern == "max_abs >> 3"), shown
            assert notice.region.y + notice.region.height <= 24 and notice.region.y >= 0


async def test_q_with_report_exits_0_and_writes_the_ops_run_so_far(tmp_path):
    out = tmp_path / "r.csv"
    s = open_session("demo:mlp", "numpy")
    app = DebuggerApp(Controller(s, reference="numpy"), model=s.spec, report_path=str(out))
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq == 0)
        await pilot.press("n")
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq == 1)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["seq"] for r in rows] == ["1", "2"]          # the TUI's numbering: #1, #2


async def test_the_dtype_shown_is_the_dtype_computed(tmp_path):
    """A softmax the chip runs in float16: the op panel says so, and its #N is the report's seq."""
    s = open_session(write(tmp_path, "soft.py", SOFTMAX) + ":factory", write(tmp_path, "lows.toml", LOW_SOFTMAX_TOML))
    app = DebuggerApp(Controller(s, reference="numpy", breakpoints=["softmax"]), model=s.spec)
    async with app.run_test(size=(150, 45)) as pilot:
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq == 0)
        await pilot.press("c")
        ev = await until(pilot, app, lambda e: isinstance(e, Stop) and e.node.op == "softmax")
        op = str(app.query_one("#op").render())
        assert "computed in float16" in op and "stored as float32" in op
        row = next(r for r in app.ctl.report.as_dict()["ops"] if r["op"] == "softmax")
        assert f"#{row['seq']}/" in op and row["seq"] == ev.seq + 1


def test_debug_without_a_terminal_is_one_line_exit_2(cli):
    r = cli("debug", "demo:mlp", "--backend", "numpy", input="")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "needs a terminal" in r.stderr
    assert r.stdout == ""


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_sigint_exits_130_in_a_real_terminal(opscope_home, tmp_path):
    sock = f"opscope-test-{uuid.uuid4().hex[:8]}"          # our own tmux server: nothing else is touched
    tmux = ["tmux", "-L", sock]
    rc_file, pid_file = tmp_path / "rc", tmp_path / "pid"
    cmd = (f"env -u COLUMNS -u LINES OPSCOPE_HOME={opscope_home} sh -c 'echo $$ > {pid_file}; exec "
           f"{sys.executable} -m opscope.app debug demo:mlp --backend numpy'; echo $? > {rc_file}; sleep 30")
    subprocess.run([*tmux, "new-session", "-d", "-x", "120", "-y", "40", "-s", "dbg", cmd], check=True)

    def pane() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", "dbg"], capture_output=True, text=True).stdout

    try:
        end = time.time() + 120
        while time.time() < end and "#1/5" not in pane():
            time.sleep(0.3)
        assert "#1/5" in pane(), pane()
        os.kill(int(pid_file.read_text()), signal.SIGINT)        # what `kill -INT` or a supervisor sends
        end = time.time() + 30
        while time.time() < end and not rc_file.exists():
            time.sleep(0.2)
        assert rc_file.read_text().strip() == "130"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
