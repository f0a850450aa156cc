"""Ctrl-C at any moment exits 130 with one line and keeps what was recorded; `| head` exits 0 (issue 17).

SIGINT goes to the command's whole process group, as a terminal sends it, at random moments:
while Python imports torch, while the model is captured, while it runs, while events stream in.
Before the fix, 3 tries in 5 of `opscope profile` aborted with exit 134 ("terminate called after
throwing an instance of ''"): daemon threads inside C++ at interpreter shutdown.
"""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ctrl_c_able, popen_in_a_terminal

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

CASES = {   # command -> (argv, tries, latest moment of the Ctrl-C in seconds)
    # profile: 10 tries miss a bug that struck 3 tries in 5 (the docstring's) once in ten thousand runs
    "profile": (["profile", "demo:gpt", "--backend", "torch:cpu", "--steps", "400"], 10, 8.0),
    "run": (["run", "demo:gpt", "--backend", "torch:cpu", "--repeat", "2000"], 5, 8.0),
    "train": (["train", "demo:mlp", "--backend", "numpy", "--steps", "100000"], 4, 6.0),
    "serve": (["serve", "--port", "0"], 4, 5.0),
    "debug": (["debug", "demo:mlp", "--backend", "numpy"], 3, 6.0),
}


def _start(args, home):
    env = dict(os.environ, OPSCOPE_HOME=str(home), PYTHONUNBUFFERED="1")
    env.pop("OPSCOPE_DEBUG", None)
    if args[0] == "debug":                   # it needs a terminal
        return popen_in_a_terminal(args, env=env, start_new_session=True, preexec_fn=ctrl_c_able)
    return subprocess.Popen([sys.executable, "-m", "opscope.app", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
                            start_new_session=True, preexec_fn=ctrl_c_able)


def _ctrl_c(p, delay: float):
    time.sleep(delay)
    try:
        os.killpg(p.pid, signal.SIGINT)      # the whole group, as a terminal's Ctrl-C
    except ProcessLookupError:
        pass
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"did not end within 120 s of Ctrl-C at {delay:.1f} s; stderr: {err[-2000:]}")
    return p.returncode, out, err


def _before_opscope_started(err: str) -> bool:
    """Did the Ctrl-C land before opscope's first line ran? Python's start-up (importing site and the .pth files
    of site-packages; `Fatal Python error: init_import_site`) prints its own traceback, and no frame of it is
    under app/. From app/entry.py on, every Ctrl-C is opscope's: one line, exit 130 (CI saw one land in the
    CLI's imports at 0.2 s on a loaded machine)."""
    frames = re.findall(r'File "([^"]+)"', err)
    return "Traceback (most recent call last)" in err and not any(f"{os.sep}app{os.sep}" in f for f in frames)


def _check_store(home):
    """No run is left 'running', and each run's event count is what the store holds."""
    from opscope.profiler.store import RunStore
    store = RunStore(home / "runs.duckdb") if (home / "runs.duckdb").exists() else None
    if store is None:
        return []
    runs = store.list_runs()
    for r in runs:
        assert r["status"] != "running", r
        held = len(store.events_frame(r["run_id"], columns=["seq"])["seq"])
        assert held == r["events"], (r["run_id"], held, r["events"])
    return runs


@pytest.mark.parametrize("command", sorted(CASES))
def test_ctrl_c_at_any_moment_exits_130_with_one_line(command, tmp_path):
    args, tries, latest = CASES[command]
    rng = random.Random(f"{command}-{os.getpid()}")
    home = tmp_path / "home"
    home.mkdir()
    interrupted = 0
    for i in range(tries):
        delay = rng.uniform(0.2, latest) if i else 0.2        # the first one lands during start-up
        code, out, err = _ctrl_c(_start(args, home), delay)
        lines = [line for line in err.splitlines() if line.strip()]
        where = f"{command}, Ctrl-C at {delay:.1f} s: exit {code}, stderr {err[-1500:]!r}"
        if _before_opscope_started(err):
            continue                           # Python's own start-up (site, .pth files): not opscope's to answer
        assert "Traceback (most recent call last)" not in err and "terminate called" not in err, where
        if code == 0 and command != "serve":
            continue                           # it finished first: nothing to interrupt
        interrupted += 1
        assert code == 130, where
        if command == "debug":                 # Textual draws on stderr: our line can follow its escape codes
            lines = [line[line.find("opscope:"):] if "opscope:" in line else line
                     for line in re.sub(r"\x1b\[[0-9;?<>=]*[A-Za-z~]", "\n", err).splitlines() if line.strip()]
        ours = [line for line in lines if line.startswith("opscope:")]
        assert len(ours) == 1 and ours[0].startswith("opscope: interrupted"), where
        if command != "debug":                 # the TUI may leave its escape codes; the rest print nothing else
            assert len(lines) == 1, where
    assert interrupted >= tries // 2, f"only {interrupted} of {tries} tries were interrupted"
    runs = _check_store(home)
    if command == "profile":                   # (a run with events is the next test's: it waits for them)
        assert runs, f"no run was recorded in {tries} tries"


def test_interrupted_profile_names_the_run_it_kept(tmp_path):
    """SIGINT to the command alone (kill -INT): its runner is stopped, the run closed with its events."""
    home = tmp_path / "home"
    home.mkdir()
    p = _start(["profile", "demo:gpt", "--backend", "torch:cpu", "--steps", "100000"], home)
    deadline = time.time() + 180
    from opscope.profiler.store import RunStore
    while time.time() < deadline:              # wait until events arrive
        time.sleep(1.0)
        if (home / "runs.duckdb").exists():
            runs = RunStore(home / "runs.duckdb").list_runs()
            if runs and runs[0]["events"] > 0:
                break
    os.kill(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    run_id = runs[0]["run_id"]
    assert err.strip() == f"opscope: interrupted; kept run {run_id} (`opscope show {run_id}`)"
    kept = _check_store(home)[0]
    # the user stopped it: interrupted (not "failed: killed by SIGKILL"), with the steps that arrived
    assert kept["status"] == "interrupted" and kept["events"] > 0 and "of 100000 steps kept" in kept["error"]
    held = RunStore(home / "runs.duckdb").query("SELECT count(DISTINCT step) FROM events WHERE run_id = ?", [run_id])
    assert 1 <= kept["steps"] == held[0][0] < 100000


@pytest.mark.parametrize("args", [["--help"], ["ops"], ["backends"], ["run", "--help"]])
def test_a_closed_pipe_is_success(args, tmp_path):
    """`opscope ops | head -1`: the reader is gone before the output is; that is not a failure, and says nothing.
    (Before: "Exception ignored ... BrokenPipeError" from the interpreter's last flush, exit 120.)"""
    env = dict(os.environ, OPSCOPE_HOME=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-m", "opscope.app", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    p.stdout.close()                           # the reader leaves before the first write: every write fails
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert err == ""


def test_ctrl_c_json_output_stays_parseable_or_empty(tmp_path):
    """--json consumers read stdout: an interrupted command must not leave half a document there."""
    home = tmp_path / "home"
    home.mkdir()
    code, out, err = _ctrl_c(_start(["run", "demo:gpt", "--repeat", "2000", "--json"], home), 6.0)
    assert code == 130, err
    if out.strip():
        json.loads(out)


def _ctrl_c_when(tmp_path, sitecustomize: str):
    """Run `opscope backends --json` with `sitecustomize` (which writes the file MARKER when the moment has
    come) and Ctrl-C it at that moment. -> (exit code, stdout, stderr)."""
    site = tmp_path / "site"
    site.mkdir()
    marker = tmp_path / "marker"
    (site / "sitecustomize.py").write_text(sitecustomize.replace("MARKER", repr(str(marker))))
    env = dict(os.environ, OPSCOPE_HOME=str(tmp_path / "home"),
               PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.Popen([sys.executable, "-m", "opscope.app", "backends", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
                         start_new_session=True, preexec_fn=ctrl_c_able)
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.02)
    assert marker.exists(), p.communicate()[1]
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    return p.returncode, out, err


def test_ctrl_c_after_the_command_finished_leaves_its_exit_code_and_no_traceback(tmp_path):
    """A Ctrl-C that lands once the command is done -- while the interpreter shuts down -- must neither
    change the exit code nor print "Exception ignored ... KeyboardInterrupt" (seen in CI with `opscope run`
    interrupted just as it finished). The shutdown is held open by an atexit handler (sitecustomize) that
    says when it starts, so the Ctrl-C always lands there."""
    code, out, err = _ctrl_c_when(tmp_path, "import atexit, pathlib, time\n"
                                            "atexit.register(lambda: (pathlib.Path(MARKER).write_text('x'), "
                                            "time.sleep(3)))\n")
    assert code == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert json.loads(out)


def test_ctrl_c_inside_a_finalizer_still_interrupts_with_one_line(tmp_path):
    """Python runs __del__ and weakref callbacks in between ordinary code; a Ctrl-C that lands in one is
    swallowed there ("Exception ignored ... KeyboardInterrupt") and the command used to run on to exit 0
    (CI: `opscope run` interrupted at 2.8 s of 35). Here the command's first act is a finalizer that takes
    3 s and says when it starts, so the Ctrl-C always lands inside it: it must still end the command,
    130 and one line."""
    code, out, err = _ctrl_c_when(tmp_path, (
        "import gc, pathlib, time\n"
        "import opscope.app.cli as cli\n"
        "class Slow:\n"
        "    def __del__(self):\n"
        "        pathlib.Path(MARKER).write_text('x')\n"
        "        time.sleep(3)\n"
        "real = cli._run\n"
        "def run(argv, debug):\n"
        "    s = Slow(); s.me = s; del s\n"       # a cycle: freed by the collector, in a finalizer
        "    gc.collect()\n"
        "    return real(argv, debug)\n"
        "cli._run = run\n"))
    assert code == 130, (code, err)
    assert "Traceback" not in err and err.strip().splitlines() == ["opscope: interrupted"], err


INTERRUPTED_IMPORT = """
import os, signal, sys
class Interrupting:      # a real SIGINT while the CLI's own modules load, where CI's cold start saw one land
    def find_spec(self, name, path=None, target=None):
        if name == "argparse":
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.modules.pop("argparse", None)
sys.meta_path.insert(0, Interrupting())
sys.argv = ["opscope", "--version"]
from opscope.app.entry import main
main()
"""


def test_ctrl_c_while_the_cli_is_still_imported_is_one_line_and_130():
    r = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT], capture_output=True, text=True, timeout=120,
                       preexec_fn=ctrl_c_able)
    assert (r.returncode, r.stderr) == (130, "opscope: interrupted\n"), r.stderr[-1500:]
