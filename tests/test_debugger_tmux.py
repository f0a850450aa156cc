"""`opscope debug` in a real terminal: tmux runs it, send-keys drives it, capture-pane reads it."""
import shutil
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


def test_debug_in_tmux_shows_ops_and_tensor_stats(opscope_home):
    sock = f"opscope-test-{uuid.uuid4().hex[:8]}"          # our own tmux server: nothing else is touched
    tmux = ["tmux", "-L", sock]
    # NOTE: COLUMNS/LINES inherited from the test runner would override the pane size in Textual
    cmd = (f"env -u COLUMNS -u LINES OPSCOPE_HOME={opscope_home} {sys.executable} -m opscope.app "
           "debug demo:mlp --backend numpy")
    subprocess.run([*tmux, "new-session", "-d", "-x", "160", "-y", "50", "-s", "dbg", cmd], check=True)
    # NOTE: a detached session may still start at tmux's default size (80x24); fix it to 160x50
    subprocess.run([*tmux, "resize-window", "-t", "dbg", "-x", "160", "-y", "50"], capture_output=True)

    def pane() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", "dbg"], capture_output=True, text=True).stdout

    def wait_for(*needles, timeout=120):
        end = time.time() + timeout
        text = ""
        while time.time() < end:
            text = pane()
            if all(n in text for n in needles):
                return text
            time.sleep(0.3)
        raise AssertionError(f"never saw {needles} in the pane:\n{text}")

    try:
        text = wait_for("#1/5", "32x512", "float32", "mean", "histogram")   # linear ran: its output stats
        assert "linear_1" in text and "relu_1" in text              # the graph tree
        assert "mean" in text and "std" in text
        subprocess.run([*tmux, "send-keys", "-t", "dbg", "n"], check=True)
        text = wait_for("#2/5")
        assert "ReLU" in text
        subprocess.run([*tmux, "send-keys", "-t", "dbg", "c"], check=True)
        wait_for("run finished")
        subprocess.run([*tmux, "send-keys", "-t", "dbg", "q"], check=True)
        end = time.time() + 30
        while time.time() < end:
            alive = subprocess.run([*tmux, "has-session", "-t", "dbg"], capture_output=True).returncode == 0
            if not alive:
                break
            time.sleep(0.3)
        assert not alive, "q did not quit the debugger"
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def test_debug_in_tmux_refuses_a_dead_breakpoint_with_exit_2(opscope_home):
    """The TUI opens at once (loading line), finds that `lienar` names no op, and exits 2 with one line."""
    sock = f"opscope-test-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", sock]
    # NOTE: Textual draws on stderr, so the message is read from the pane once the TUI has gone
    cmd = (f"env -u COLUMNS -u LINES OPSCOPE_HOME={opscope_home} {sys.executable} -m opscope.app "
           f"debug demo:mlp --backend numpy --break lienar; echo EXIT=$?; sleep 60")
    subprocess.run([*tmux, "new-session", "-d", "-x", "120", "-y", "35", "-s", "dbg", "sh", "-c", cmd], check=True)
    try:
        end = time.time() + 120
        text = ""
        while time.time() < end and "EXIT=" not in text:
            time.sleep(0.3)
            text = subprocess.run([*tmux, "capture-pane", "-p", "-t", "dbg"], capture_output=True, text=True).stdout
        assert "EXIT=2" in text, text
        errors = [line for line in text.splitlines() if line.startswith("opscope: error:")]
        assert len(errors) == 1 and "matches no op" in errors[0] and "did you mean linear" in errors[0], text
        assert "Traceback" not in text
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def test_debug_train_in_tmux_stops_at_the_backward_op_that_made_the_inf(opscope_home, tmp_path):
    """`debug --train --break-on-nan` on a model whose custom backward divides by zero: c runs the
    forward and the backward and stops at that div, naming the forward op it differentiates."""
    from test_debug_train import GRAD_NAN
    model = tmp_path / "grad_nan.py"
    model.write_text(GRAD_NAN)
    sock = f"opscope-test-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", sock]
    cmd = (f"env -u COLUMNS -u LINES OPSCOPE_HOME={opscope_home} {sys.executable} -m opscope.app "
           f"debug {model}:factory --backend numpy --train --break-on-nan")
    subprocess.run([*tmux, "new-session", "-d", "-x", "160", "-y", "50", "-s", "dbg", cmd], check=True)
    subprocess.run([*tmux, "resize-window", "-t", "dbg", "-x", "160", "-y", "50"], capture_output=True)

    def wait_for(*needles, timeout=120):
        end = time.time() + timeout
        text = ""
        while time.time() < end:
            text = subprocess.run([*tmux, "capture-pane", "-p", "-t", "dbg"], capture_output=True, text=True).stdout
            if all(n in text for n in needles):
                return text
            time.sleep(0.3)
        raise AssertionError(f"never saw {needles} in the pane:\n{text}")

    try:
        wait_for("#1/", "forward", "backward", "optimizer")        # the tree's three phases
        subprocess.run([*tmux, "send-keys", "-t", "dbg", "c"], check=True)
        text = wait_for("stopped: breakpoint", "backward of mul")
        assert "div" in text and "introduced here" in text
        subprocess.run([*tmux, "send-keys", "-t", "dbg", "q"], check=True)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
