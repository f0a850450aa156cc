"""`backend check STACK --opinfo` runs each OpInfo in a worker process (runtime/opinfo_worker.py): a stack that dies
inside its own C++ is that OpInfo's crash, named by the signal, and the check goes on in a fresh worker.

Before, one process ran them all: ONNX Runtime died with SIGFPE on nn.functional.unfold and
nn.functional.pixel_unshuffle (empty inputs, which it no longer claims), OpenVINO with SIGSEGV on expand_as and
linspace.tensor_overload -- exit 136 / 139, no report for any OpInfo.
The worker answers in JSON lines the parent parses bounded; a broken or hostile one ends as a crash of the
OpInfo it was on, never as an exception in the parent."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ctrl_c_able
from opscope.runtime.errors import ModelError
from opscope.runtime.opinfo import STATUSES, OpInfoResult
from opscope.runtime.opinfo_worker import FD_ENV, MAX_LINE, LineRefused, check_in_workers, parse_line

pytestmark = pytest.mark.multiprocess

ORT_SIGFPE = ["nn.functional.unfold", "nn.functional.pixel_unshuffle"]
OV_SIGSEGV = "linspace.tensor_overload"


def _no_traceback(r):
    assert "Traceback" not in r.stderr and "Floating point exception" not in r.stderr, r.stderr[-2000:]


def test_onnxruntime_no_longer_dies_on_the_opinfos_that_killed_it(cli):
    """Their SIGFPE came from empty inputs (an empty batch's im2col); ONNX Runtime no longer claims a node with an
    empty input, so the samples run on the fallback and the worker lives."""
    pytest.importorskip("onnxruntime")
    names = [ORT_SIGFPE[0], "add", ORT_SIGFPE[1]]
    r = cli("backend", "check", "onnxruntime", "--opinfo", "--opinfos", ",".join(names), "--json",
            env={"OMP_NUM_THREADS": "1"})
    _no_traceback(r)
    doc = json.loads(r.stdout)
    got = {x["opinfo"]: x for x in doc["results"]}
    assert list(got) == names and doc["summary"]["crash"] == 0 and doc["summary"]["pass"] == 1, doc["summary"]
    for name in ORT_SIGFPE:
        assert got[name]["status"] == "fallback", got[name]
    assert r.returncode == 0 and doc["ok"] is True


def test_openvino_sigsegv_opinfo_is_a_crash_and_a_fresh_worker_takes_the_rest(cli):
    pytest.importorskip("openvino")
    # the crash first: after it a fresh worker must take the OpInfo that follows
    r = cli("backend", "check", "openvino", "--opinfo", "--opinfos", f"{OV_SIGSEGV},add", "--json",
            env={"OMP_NUM_THREADS": "1"})
    _no_traceback(r)
    doc = json.loads(r.stdout)
    got = {x["opinfo"]: x for x in doc["results"]}
    assert list(got) == [OV_SIGSEGV, "add"] and got["add"]["status"] == "pass" and got["add"]["samples"] == 3
    assert got[OV_SIGSEGV]["status"] == "crash"
    assert got[OV_SIGSEGV]["message"].startswith("SIGSEGV inside the stack (openvino)"), got[OV_SIGSEGV]["message"]
    assert r.returncode == 1 and doc["ok"] is False         # crashes fail the check, as they always did


def test_openvino_sigsegv_opinfo_is_a_crash_in_the_table(cli):
    pytest.importorskip("openvino")
    r = cli("backend", "check", "openvino", "--opinfo", "--opinfos", f"add,{OV_SIGSEGV}", env={"OMP_NUM_THREADS": "1"})
    _no_traceback(r)
    assert r.returncode == 1, r.stderr[-2000:]
    assert f"CRASH {OV_SIGSEGV}: SIGSEGV inside the stack (openvino)" in " ".join(r.stdout.split()), r.stdout
    assert "1 pass" in r.stdout and "1 crashed" in r.stdout, r.stdout


# --- a broken or hostile worker: real processes speaking the protocol wrong ----------------------------------
_SAY = ("import json, os, signal, sys, time\nnames = json.loads(sys.stdin.readline())\n"
        f"fd = int(os.environ[{FD_ENV!r}])\nsay = lambda b: os.write(fd, b)\n")
_RUNNING = "say(json.dumps({'running': names[0]}).encode() + b'\\n')\n"
BROKEN = {   # what the worker does after announcing its first OpInfo -> what that OpInfo's crash says
    "garbage": ("say(b'{not json\\n'); time.sleep(60)", "a line that is not JSON"),
    "oversized": ("say(b'x' * (3 * 65536)); time.sleep(60)", f"a line of over {MAX_LINE} bytes"),
    "deep": ("say(b'[' * 60000 + b'\\n'); time.sleep(60)", "a line that is not JSON"),
    "out of turn": ("say(json.dumps({'running': 'other'}).encode() + b'\\n'); time.sleep(60)", "out of turn"),
    "silent": ("time.sleep(60)", "no answer in 1 s"),
    "sigsegv": ("os.kill(os.getpid(), signal.SIGSEGV)", "SIGSEGV inside the stack (fake)"),
    "exits": ("sys.exit(3)", "the worker ended (exit code 3)"),
    # a real-time signal has no name in Python's table: the message must still be made, not raise
    "unnamed signal": ("os.kill(os.getpid(), signal.SIGRTMIN + 6)", "signal 40 inside the stack (fake)"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_worker_is_a_crash_of_its_opinfo_never_an_exception(case):
    script, says = BROKEN[case]
    report = check_in_workers("fake", ["add", "abs"], backend_name="fake", timeout=1,
                              argv=[sys.executable, "-c", _SAY + _RUNNING + script])
    assert [r.name for r in report.results] == ["add", "abs"]          # a fresh worker for each
    for r in report.results:
        assert r.status == "crash" and says in r.message, r.message


def test_a_worker_that_dies_before_its_first_opinfo_is_one_clean_error():
    with pytest.raises(ModelError, match=r"worker for fake failed before checking add: the worker died \(SIGKILL\)"):
        check_in_workers("fake", ["add"], backend_name="fake",
                         argv=[sys.executable, "-c", _SAY + "os.kill(os.getpid(), signal.SIGKILL)"])


def test_a_line_over_the_limit_is_refused_unread():
    with pytest.raises(LineRefused, match="a line of"):
        parse_line(json.dumps({"error": "x" * MAX_LINE}).encode())


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=5),
                     max_leaves=10)
_FIELDS = st.fixed_dictionaries({}, optional={"opinfo": _JSON | st.text(), "status": _JSON | st.sampled_from(STATUSES),
                                              "ops": _JSON | st.lists(st.text(max_size=8)), "samples": _JSON,
                                              "message": _JSON | st.text(), "seconds": _JSON})
_LINES = (st.binary(max_size=200)
          | st.builds(lambda k, v: json.dumps({k: v}).encode(), st.sampled_from(["running", "result", "error", "x"]),
                      _JSON | _FIELDS)
          | _JSON.map(lambda v: json.dumps(v).encode()))


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(_LINES)
def test_the_line_parser_answers_a_message_or_refuses(raw):
    try:
        kind, value = parse_line(raw)
    except LineRefused:
        return
    assert kind in ("running", "result", "error")
    if kind == "result":
        assert isinstance(value, OpInfoResult) and value.status in STATUSES and value.seconds >= 0
        json.dumps(value.as_dict())                              # what --json prints
    else:
        assert isinstance(value, str)


# --- Ctrl-C while a worker runs ----------------------------------------------------------------------------
def _workers_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and b"opscope.runtime.opinfo_worker" in cmd:
            found.append(int(entry))
    return found


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_during_the_check_exits_130_with_one_line_and_ends_the_worker(tmp_path):
    pytest.importorskip("onnxruntime")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "opscope.app", "backend", "check", "onnxruntime", "--opinfo"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
                         start_new_session=True, preexec_fn=ctrl_c_able)
    try:
        deadline, workers = time.monotonic() + 120, []
        while not workers and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.5)
            workers = _workers_of(p.pid)
        assert workers, "no OpInfo worker started"
        time.sleep(2)                                  # let it import and take its first OpInfos
        os.killpg(p.pid, signal.SIGINT)                # the terminal's Ctrl-C: the command's group
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    lines = [line for line in err.splitlines() if line.strip()]
    assert p.returncode == 130 and lines == ["opscope: interrupted"], (p.returncode, err[-2000:])
    for _ in range(40):                                # the worker is in its own group: the command ended it
        alive = [w for w in workers if _state(w) not in ("", "Z")]       # a zombie has ended
        if not alive:
            break
        time.sleep(0.25)
    assert not alive, f"worker {alive} outlived the command"


@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf", "1e300"])
def test_a_timeout_no_worker_can_wait_is_one_line_exit_2(cli, seconds):
    """inf and 1e300 passed the old check (> 0) and ended in select()'s OverflowError."""
    r = cli("backend", "check", "numpy", "--opinfo", "--opinfos", "add", "--timeout", seconds)
    _no_traceback(r)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "--timeout" in r.stderr and "at most 604800" in r.stderr, r.stderr
