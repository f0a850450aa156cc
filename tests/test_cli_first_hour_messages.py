"""The smaller first-hour messages of issue 34: torch's own logs silenced around capture, the model named when
it has no scalar loss, --capture dynamo suggested where it helps, a trace name that contradicts its format
refused, and Ctrl-C on a finished `profile --web` exiting 130."""
import contextlib
import io
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ctrl_c_able

MODELS = textwrap.dedent("""\
    import torch


    class Mismatch(torch.nn.Module):          # fails in torch.export's fake-tensor pass
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x) @ torch.ones(5, 5)


    class Loop(torch.nn.Module):              # Python that depends on a tensor's value
        def forward(self, x):
            for _ in range(int((x > 0).sum())):
                x = x * 2
            return x


    class NoLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)


    def mismatch():
        return Mismatch(), (torch.randn(2, 4),)


    def loop():
        return Loop(), (torch.tensor([1.0, -1.0, 2.0, 3.0]),)


    def no_loss():
        return NoLoss(), (torch.randn(2, 4),)
    """)


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "first_hour_models.py"
    path.write_text(MODELS)
    return path


def _opscope(*args, env=None, home):
    return subprocess.run([sys.executable, "-m", "opscope.app", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OPSCOPE_HOME": str(home), **(env or {})})


@pytest.mark.multiprocess
def test_a_capture_failure_is_one_line_without_torchs_logs(models, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_DEBUG"}
    r = subprocess.run([sys.executable, "-m", "opscope.app", "run", f"{models}:mismatch", "-b", "numpy"],
                       capture_output=True, text=True, timeout=300, env={**env, "OPSCOPE_HOME": str(tmp_path)})
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr          # no "E1204 ... Traceback" before it
    assert "capture failed for" in lines[0] and "first_hour_models.py:mismatch" in lines[0]
    debug = _opscope("run", f"{models}:mismatch", "-b", "numpy", env={"OPSCOPE_DEBUG": "1"}, home=tmp_path)
    assert "Traceback" in debug.stderr and "fake_tensor" in debug.stderr      # OPSCOPE_DEBUG=1 shows everything


@pytest.mark.multiprocess
def test_a_data_dependent_model_is_pointed_at_capture_dynamo(models, tmp_path):
    r = _opscope("run", f"{models}:loop", "-b", "numpy", home=tmp_path)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and len(lines) == 1, r.stderr          # torch.export's partial graph is not printed
    assert "GuardOnDataDependentSymNode" in lines[0] and "--capture dynamo" in lines[0]
    ok = _opscope("run", f"{models}:loop", "-b", "numpy", "--capture", "dynamo", "--json", home=tmp_path)
    assert ok.returncode == 0, ok.stderr                            # and the suggestion works
    # a failure that is not about data-dependent Python gets no such advice
    other = _opscope("run", f"{models}:mismatch", "-b", "numpy", home=tmp_path)
    assert "--capture dynamo" not in other.stderr


def test_train_without_a_scalar_loss_names_the_model(models, tmp_path, monkeypatch):
    from opscope.app.cli import main
    monkeypatch.setenv("OPSCOPE_HOME", str(tmp_path))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as e:
        main(["train", f"{models}:no_loss", "-b", "numpy", "--steps", "1"])
    assert e.value.code == 2, err.getvalue()
    assert f"model {models}:no_loss does not return a scalar loss" in err.getvalue()


def test_a_trace_name_that_contradicts_its_format_is_refused(tmp_path, monkeypatch):
    from opscope.app.cli import main
    monkeypatch.setenv("OPSCOPE_HOME", str(tmp_path))
    for argv, says in [(["--format", "perfetto", "-o", "x.json"], "name it *.pftrace"),
                       (["--format", "chrome", "-o", "x.csv.gz"], "name it *.json"),
                       (["-f", "csv", "-o", "x.pftrace"], "name it *.csv")]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
            main(["trace", "export", "RUN", *argv])
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        assert e.value.code == 2 and len(lines) == 1 and says in lines[0], err.getvalue()
        assert not (tmp_path / argv[-1]).exists()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ctrl_c_on_a_finished_profile_web_exits_130(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "opscope.app", "profile", "demo:mlp", "-b", "numpy", "--web",
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=ctrl_c_able,
                            env=dict(os.environ, OPSCOPE_HOME=str(tmp_path)))
    try:
        rid = re.match(r"run (\w+):", proc.stdout.readline()).group(1)
        from opscope.profiler.store import RunStore
        deadline = time.time() + 180
        while time.time() < deadline and RunStore(tmp_path / "runs.duckdb").get_run(rid)["status"] == "running":
            time.sleep(0.5)
        assert RunStore(tmp_path / "runs.duckdb").get_run(rid)["status"] == "ok"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("opscope: interrupted") and "Traceback" not in err
