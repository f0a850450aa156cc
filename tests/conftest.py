import contextlib
import fcntl
import io
import logging
import multiprocessing.process
import os
import pty
import signal
import struct
import subprocess
import sys
import termios
import threading
import traceback

import pytest

# --- xdist workers that fill the cores run one math thread each ------------------------------------------------
# torch (OpenMP, MKL) and numpy's BLAS start a thread per core in every process, and their idle threads spin-wait:
# `-n 2` on 2 cores ran 4 busy threads on 2 cores. The same 94 tests (test_passes, test_train's quick ones) took
# 67 s of CPU with the default threads and 17 s with OMP/MKL/OPENBLAS_NUM_THREADS=1, two runs side by side on this
# machine (load ~23, where spinning costs most; a quiet machine was not measured). Set before anything
# imports torch (this file is imported first), inherited by the `opscope` processes tests start. A user who set any
# of them keeps all as they are: torch built with MKL and OpenMP takes MKL's count, so a user's OMP_NUM_THREADS=2
# beside our MKL_NUM_THREADS=1 ran one thread. Tests of thread handling set or remove these themselves.
MATH_THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def math_threads(environ, cores: int | None) -> dict[str, str]:
    """What this file adds to `environ`: under xdist, each worker's share of the cores in all three variables; nothing
    in a run without workers, or when the user set one (test_ci_threads checks the rule in any run)."""
    workers = environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not workers.isdigit() or any(var in environ for var in MATH_THREADS):
        return {}
    return dict.fromkeys(MATH_THREADS, str(max(1, (cores or 1) // max(1, int(workers)))))


MATH_THREADS_SET = math_threads(os.environ, os.cpu_count())
os.environ.update(MATH_THREADS_SET)
# The terminal pytest runs in is not the one a test's command meets: the CLI sizes its tables by $COLUMNS (a pipe
# without it gets 160 columns), so a CI runner's COLUMNS=80 wrapped a header the test reads ("measured ms (wall)").
# A test that wants a width sets COLUMNS itself.
for _var in ("COLUMNS", "LINES"):
    os.environ.pop(_var, None)
# Bytecode is cached for the test run even where the environment asks Python not to write it (these machines set
# PYTHONDONTWRITEBYTECODE=1): without the cache pytest rewrote every test module's asserts again in each xdist
# worker (17.7 s of a worker's collection, 10.4 s with it) and each command a test starts compiled opscope's
# modules from source. What is written is __pycache__ folders, which git ignores.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# --- Every test that starts a process is marked (pyproject: multiprocess, browser, container) ----------------
# The quick set (`-m "not slow and not browser and not multiprocess and not container"`) is quick only while
# nothing in it pays a process start (a torch import is 1.6-1.8 s of CPU). An audit hook sees every process
# this interpreter starts; while a test's body or one of its function-scoped fixtures runs, a start is noted
# and an unmarked test fails naming the marker. Session- and module-scoped fixtures may start processes: they
# are made once, not per test. The hook is per process, so every xdist worker checks its own tests.
SPAWN_MARKS = ("multiprocess", "browser", "container")
_SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.system",
                           "os.exec", "os.spawn"})
_watch = {"on": False, "seen": []}


def _note_spawn(what: str) -> None:
    if _watch["on"]:
        _watch["seen"].append(what)


def _spawn_audit(event, args):
    if event in _SPAWN_EVENTS and _watch["on"]:
        first = args[1] if event == "subprocess.Popen" else args[0] if args and event != "os.fork" else ""
        _note_spawn(f"{event} {first!r}"[:160])


sys.addaudithook(_spawn_audit)
_process_start = multiprocessing.process.BaseProcess.start


def _watched_process_start(self):
    # NOTE: the spawn and forkserver start methods raise no audit event (only fork does: os.fork)
    _note_spawn(f"multiprocessing {type(self).__name__}.start()")
    return _process_start(self)


multiprocessing.process.BaseProcess.start = _watched_process_start


def _decline_openvino_telemetry() -> None:
    """OpenVINO's converter (openvino.convert_model) sends usage analytics, one child process per event and a client
    id written under ~/intel, unless a consent file says no. Tests reach no network and start no process for it.
    Its Telemetry is a singleton: made here, declined (the library's own "in CI" rule), and kept declined (the
    converter and the PyTorch frontend each init it again under their own names), for every conversion here."""
    try:
        import openvino_telemetry
    except ImportError:
        return
    ci = os.environ.get("CI")
    os.environ["CI"] = "true"
    try:
        declined = openvino_telemetry.Telemetry(app_name="OVC", tid="opscope-tests", backend="ga4",
                                                enable_opt_in_dialog=False, disable_in_ci=True)
        declined.init = lambda *args, **kwargs: None
    except Exception:                   # a library version that works otherwise: the spawn check will say so
        pass
    finally:
        if ci is None:
            del os.environ["CI"]
        else:
            os.environ["CI"] = ci


_decline_openvino_telemetry()


@contextlib.contextmanager
def _watching(on: bool):
    before = _watch["on"]
    _watch["on"] = on
    try:
        yield
    finally:
        _watch["on"] = before


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    _watch["seen"] = []
    with _watching(False):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    with _watching(fixturedef.scope == "function"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _watching(True):
        result = yield
    seen = _watch["seen"]
    if seen and not any(item.get_closest_marker(m) for m in SPAWN_MARKS):
        pytest.fail(f"{item.nodeid} starts a process ({seen[0]}{f' and {len(seen) - 1} more' if len(seen) > 1 else ''}"
                    f") but is not marked: add @pytest.mark.multiprocess (browser / container for those), or "
                    f"use the in-process `cli` fixture instead of a subprocess", pytrace=False)
    return result


# --- What a run cost: CPU seconds beside wall time (README states the quick set's and the full suite's) -------
# This machine is shared: a run's wall time says more about the load than about the tests. The CPU time of the
# pytest processes and of every process they started and waited for (xdist workers, `opscope` subprocesses) is
# what a quiet machine has to spend; on 2 cores it needs at least half of it as wall time. Each xdist worker
# sends its own (workeroutput); the last line before pytest's own says it, with the load at the start and end.
_run = {"wall": None, "load": None, "workers": 0, "workers_cpu": 0.0}


def _cpu_seconds(children: bool = True) -> float:
    import resource
    who = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) if children else (resource.RUSAGE_SELF,)
    return sum(r.ru_utime + r.ru_stime for r in map(resource.getrusage, who))


def pytest_sessionstart(session):
    import time
    _run["wall"], _run["load"] = time.monotonic(), os.getloadavg()[0]


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:                # an xdist worker: what it and its children used, for the controller
        workeroutput["opscope_cpu_s"] = _cpu_seconds()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _run["workers"] += 1
    _run["workers_cpu"] += getattr(node, "workeroutput", {}).get("opscope_cpu_s", 0.0)


def pytest_terminal_summary(terminalreporter):
    import time
    if _run["wall"] is None or hasattr(terminalreporter.config, "workeroutput"):
        return
    # NOTE: a worker reaped by now is in RUSAGE_CHILDREN too, and its report already holds what it used
    wall, cpu = time.monotonic() - _run["wall"], _cpu_seconds(children=not _run["workers"]) + _run["workers_cpu"]
    terminalreporter.write_line(
        f"cost: {cpu:.0f} s of CPU (user+system, the pytest processes and the processes they started) in "
        f"{wall:.0f} s of wall time, load average {_run['load']:.1f} at the start and {os.getloadavg()[0]:.1f} at "
        f"the end; on {os.cpu_count()} idle cores at least {cpu / (os.cpu_count() or 1):.0f} s")


def skip_unless_installed(*modules: str) -> None:
    """At a test module's top: skip the module where a package is not installed, without importing it.
    pytest.importorskip imports it while collecting, which every run pays on every xdist worker, the quick set
    too (it collects everything, then deselects): PennyLane alone took longer to import than torch."""
    import importlib.util
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:                 # a dotted name whose parent package is missing
            found = False
        if not found:
            pytest.skip(f"{name} is not installed (pip install -e '.[test]')", allow_module_level=True)


@pytest.fixture(autouse=True)
def opscope_home(tmp_path, monkeypatch):
    """Every test gets its own run store and backend folder (DESIGN.md: OPSCOPE_HOME)."""
    home = tmp_path / "opscope-home"
    home.mkdir()
    monkeypatch.setenv("OPSCOPE_HOME", str(home))
    return home


def run_cli(*args, timeout=300, env=None, input=None, tty=False):
    """Run the installed `opscope` command in a subprocess: what a user types. tty: in a terminal (`opscope debug`
    needs one), stdout is then what it drew there."""
    e = dict(os.environ)
    if env:
        e.update(env)
    if tty:
        p = popen_in_a_terminal(args, env=e)
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, p.drawn(), err)
    return subprocess.run([sys.executable, "-m", "opscope.app", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, input=input)


def popen_in_a_terminal(args, **kwargs):
    """Start `opscope ARGS` with a pseudo-terminal (80x24) as stdin and stdout, stderr a pipe (text). A thread
    drains the terminal so the child never blocks writing to it; p.drawn() -> what it wrote there so far."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        p = subprocess.Popen([sys.executable, "-m", "opscope.app", *map(str, args)], stdin=slave, stdout=slave,
                             stderr=subprocess.PIPE, text=True, **kwargs)
    finally:
        os.close(slave)
    chunks = []

    def drain():
        try:
            while chunk := os.read(master, 65536):
                chunks.append(chunk)
        except OSError:                 # EIO: every holder of the terminal's other side has closed it
            pass
        finally:
            os.close(master)
    threading.Thread(target=drain, daemon=True).start()
    p.drawn = lambda: b"".join(chunks).decode(errors="replace")
    return p


def cli_in_process(*args, timeout=300, env=None, input=None, tty=False):
    """`opscope ARGS` through the CLI's own main(argv) in this process -> subprocess.CompletedProcess (returncode,
    stdout, stderr as text), the same answer run_cli gives without paying a process start and a torch import.

    What a command changes in the process is put back afterwards: environment, working directory, sys.argv,
    stdin/stdout/stderr, signal handlers, logging (handlers, levels, logging.disable), warning filters, sys hooks,
    torch's thread count and random state. A terminal (tty=True) or an environment variable that is read at start-up
    (anything but OPSCOPE_*, which are read when used: COLUMNS sizes the console at import, PYTHONPATH and
    OMP_NUM_THREADS act at start-up) needs a real process: those go to run_cli (so the test is multiprocess).
    timeout: for run_cli; in process pytest-timeout is the limit."""
    if tty or any(not k.startswith("OPSCOPE_") for k in env or {}):
        return run_cli(*args, timeout=timeout, env=env, input=input, tty=tty)
    from opscope.app.cli import main
    argv = [str(a) for a in args]
    out, err = io.BytesIO(), io.BytesIO()
    # NOTE: kept here and detached below: a wrapper that is dropped closes the bytes under it
    streams = [io.TextIOWrapper(b, encoding="utf-8", write_through=True) for b in (io.BytesIO(), out, err)]
    streams[0].write(input or "")
    streams[0].seek(0)
    from opscope.app.cli.common import console
    with _process_state_kept(), _console_as_started(console):
        os.environ.update(env or {})
        sys.argv = ["opscope", *argv]
        sys.stdin, sys.stdout, sys.stderr = streams
        try:
            main(argv)
            code = 0                        # main() exits; returning is a bug the test should see as odd
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:                   # OPSCOPE_DEBUG=1 lets it out: what the interpreter does with it
            traceback.print_exc()
            code = 1
    for s in streams:
        with contextlib.suppress(ValueError):      # a command closed it
            s.flush()
            s.detach()
    # as subprocess.run(text=True) reads a pipe: universal newlines
    text = [io.TextIOWrapper(io.BytesIO(b.getvalue()), encoding="utf-8", errors="replace").read() for b in (out, err)]
    return subprocess.CompletedProcess(["opscope", *argv], code, *text)


@contextlib.contextmanager
def _console_as_started(console):
    """The CLI's console is sized once, at import (app/cli/common.py: a pipe gets 160 columns, $COLUMNS wins);
    imported in this process at another moment (a test that had set COLUMNS) it would keep that size."""
    width = console._width
    columns = os.environ.get("COLUMNS", "")
    console._width = int(columns) if columns.isdigit() else 160
    try:
        yield
    finally:
        console._width = width


_SIGNALS = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD",
                                          "SIGPIPE", "SIGALRM", "SIGWINCH") if hasattr(signal, n)]


@contextlib.contextmanager
def _process_state_kept():
    """Put back what an in-process command may change in the process (cli_in_process)."""
    import warnings
    env, cwd, argv = dict(os.environ), os.getcwd(), list(sys.argv)
    streams = (sys.stdin, sys.stdout, sys.stderr)
    hooks = (sys.excepthook, sys.unraisablehook, threading.excepthook)
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in _SIGNALS} if main_thread else {}
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    logs = [(lg, lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in loggers]
    disabled = logging.root.manager.disable
    filters = list(warnings.filters)
    torch = sys.modules.get("torch")
    threads, rng = (torch.get_num_threads(), torch.random.get_rng_state()) if torch else (None, None)
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams
        sys.excepthook, sys.unraisablehook, threading.excepthook = hooks
        os.chdir(cwd)
        sys.argv[:] = argv
        if os.environ != env:
            os.environ.clear()
            os.environ.update(env)
        for s, h in handlers.items():
            if signal.getsignal(s) is not h and h is not None:
                signal.signal(s, h)
        for lg, level, hs, propagate, off in logs:
            lg.setLevel(level)
            lg.handlers[:] = hs
            lg.propagate, lg.disabled = propagate, off
        logging.disable(disabled)
        warnings.filters[:] = filters
        torch = sys.modules.get("torch")
        if torch is not None:
            if threads is not None and torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            if rng is not None:
                torch.random.set_rng_state(rng)


@pytest.fixture
def cli(request):
    """`opscope ARGS` -> CompletedProcess: through the CLI's main(argv) in this process (cli_in_process), or the
    real command in a subprocess (run_cli) for a test marked `cli_process` (the command's own process is the
    point: exit by a signal, a terminal, start-up, what its children print to the stdout they inherit), and for
    browser and container tests. A test marked multiprocess only because the command starts processes of its own
    (a profile's runner, ranks) runs the command in process: each `opscope` process start paid 0.5-2.5 s of CPU
    (torch's import), 119 tests' worth of them about a sixth of the full suite's CPU."""
    real = any(request.node.get_closest_marker(m) for m in ("cli_process", "browser", "container"))
    return run_cli if real else cli_in_process


def ctrl_c_able():
    """preexec_fn for a child the test will Ctrl-C (SIGINT): as a terminal's foreground job gets it.

    A shell runs a background job (`.ci/run &`, nohup) with SIGINT ignored, every descendant inherits
    that, and Python then installs no KeyboardInterrupt handler: the Ctrl-C tests would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def layer_trace(tmp_path):
    """Records a real torch.profiler trace: a small transformer layer run `runs` times, with shapes, Python
    stacks and memory (record_shapes, with_stack, profile_memory). -> record(runs) -> the trace's path."""
    def record(runs: int = 3):
        import torch
        torch.manual_seed(0)
        layer, x = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval(), torch.randn(2, 8, 32)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                    with_stack=True, profile_memory=True) as prof:
            for _ in range(runs):
                with torch.no_grad():
                    layer(x)
        path = tmp_path / f"layer{runs}.json"
        prof.export_chrome_trace(str(path))
        return path
    return record
