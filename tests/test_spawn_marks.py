"""The test suite's own contracts (tests/conftest.py): a test that starts a process without the multiprocess
marker fails, naming the marker; the in-process `cli` answers as the real command does and leaves the process
as it found it."""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_in_process, run_cli

INNER = '''
import multiprocessing
import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def made_once():
    return subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout


@pytest.fixture
def per_test():
    return subprocess.run([sys.executable, "-c", "print(2)"], capture_output=True, text=True).stdout


def _child():
    pass


def test_unmarked_popen():
    subprocess.run([sys.executable, "-c", "pass"])


def test_unmarked_popen_caught():
    try:
        subprocess.run(["/nonexistent/opscope-no-such-program"])
    except OSError:
        pass


def test_unmarked_fork():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def test_unmarked_multiprocessing_spawn():
    p = multiprocessing.get_context("spawn").Process(target=_child)
    p.start()
    p.join()


def test_unmarked_function_fixture(per_test):
    assert per_test == "2\\n"


def test_unmarked_session_fixture(made_once):
    assert made_once == "1\\n"


@pytest.mark.multiprocess
def test_marked_popen(per_test):
    subprocess.run([sys.executable, "-c", "pass"])


@pytest.mark.container
def test_container_marked():
    subprocess.run([sys.executable, "-c", "pass"])


def test_no_process():
    assert sum(range(4)) == 6
'''


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_test_that_starts_a_process_unmarked_fails_naming_the_marker(tmp_path, workers):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  multiprocess: x\n  browser: x\n  container: x\n"
                                         "  slow: x\n")
    (tmp_path / "test_inner.py").write_text(INNER)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", *workers,
                        "test_inner.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    out = r.stdout
    failed = {line.split("::")[1].split(" ")[0] for line in out.splitlines() if line.startswith("FAILED ")}
    passed = {line.split("::")[1].split(" ")[0] for line in out.splitlines() if line.startswith("PASSED ")}
    assert failed == {"test_unmarked_popen", "test_unmarked_popen_caught", "test_unmarked_fork",
                      "test_unmarked_multiprocessing_spawn", "test_unmarked_function_fixture"}, out
    assert passed == {"test_unmarked_session_fixture", "test_marked_popen", "test_container_marked",
                      "test_no_process"}, out
    assert r.returncode == 1
    # once per failing test in its failure section; the -rA summary lines (FAILED ...) repeat it only
    # where the terminal is wide enough not to cut them, so they are not counted
    said = [ln for ln in out.splitlines() if "add @pytest.mark.multiprocess" in ln and not ln.startswith("FAILED ")]
    assert len(said) == 5, out
    assert "test_inner.py::test_unmarked_fork starts a process (os.fork" in out, out


@pytest.mark.multiprocess
@pytest.mark.parametrize("argv", [["--version"], ["runs", "--json"], ["run", "demo:mlp", "--steps", "0"],
                                  ["no-such-command"], ["show", "nope"], ["trace", "import", "missing.json"]])
def test_in_process_cli_answers_as_the_command_does(argv):
    here, there = cli_in_process(*argv), run_cli(*argv)
    assert (here.returncode, here.stdout, here.stderr) == (there.returncode, there.stdout, there.stderr)


def test_in_process_cli_leaves_the_process_as_it_found_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = (dict(os.environ), os.getcwd(), list(sys.argv), sys.stdout, sys.stderr, sys.stdin,
              signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    r = cli_in_process("run", "demo:mlp", "-b", "numpy", "--json", env={"OPSCOPE_HOST_TIME": "measured"})
    assert r.returncode == 0, r.stderr
    assert '"run_id"' not in r.stderr and r.stdout.lstrip().startswith("{")
    r = cli_in_process("run", "demo:mlp", "--steps", "0")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    after = (dict(os.environ), os.getcwd(), list(sys.argv), sys.stdout, sys.stderr, sys.stdin,
             signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    assert after == before
