"""Code from the working folder never runs in a child opscope starts (issue 33, point 1).

A folder a user types `opscope ...` in -- a cloned repository, a download folder -- holds a module named like one
opscope imports (numpy.py, torch/, duckdb.py, json.py, opscope/ ...). `python -m MODULE` puts that folder first on
sys.path, so before this fix the profile runner, the OpInfo worker, the `train --hybrid` ranks, the link benchmark
and `advise --apply` each imported the folder's module instead of the installed one. Every planted module here
writes a marker when it is imported; every kind of child runs from the planted folder; no marker may appear.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# libraries opscope (or torch under it) imports, the standard modules its children import after start-up, and
# opscope itself
PLANTED = ("numpy", "torch", "duckdb", "zmq", "onnxruntime", "onnx", "openvino", "jax", "msgpack", "msgspec",
           "orjson", "psutil", "pynvml", "rich", "textual", "dash", "sympy", "typing_extensions", "filelock",
           "networkx", "jinja2", "fsspec", "yaml", "packaging", "pyarrow", "expecttest", "tomli",
           "json", "argparse", "threading", "subprocess", "signal", "tempfile", "socket", "select", "hashlib",
           "logging", "runpy", "dataclasses", "opscope")
OPSCOPE = str(Path(sys.executable).with_name("opscope"))     # the console script a user types


def _plant(folder: Path, marks: Path) -> None:
    for name in PLANTED:
        code = f"open({str(marks / name)!r}, 'w').close()\n"
        if name in ("torch", "opscope"):      # packages: `import torch.nn` must find this folder's package too
            (folder / name).mkdir()
            (folder / name / "__init__.py").write_text(code)
        else:
            (folder / f"{name}.py").write_text(code)


@pytest.fixture
def planted(tmp_path):
    folder, marks = tmp_path / "clone", tmp_path / "marks"
    folder.mkdir()
    marks.mkdir()
    _plant(folder, marks)
    return folder, marks


def _opscope(folder, *args, timeout=600, env=None):
    return subprocess.run([OPSCOPE, *map(str, args)], cwd=folder, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _marked(marks: Path) -> list[str]:
    return sorted(p.name for p in marks.iterdir())


def _chip(folder, name, peak):
    path = folder / f"{name}.toml"
    path.write_text(f'[backend]\nname = "{name}"\nimplementation = "sim"\n[hardware]\n'
                    f'peak_flops = {{ float32 = {peak} }}\nmemory_bandwidth = {peak}\nlaunch_overhead = 0.0\n')
    return str(path)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(1500)
def test_no_child_imports_a_module_from_the_working_folder(planted, tmp_path):
    folder, marks = planted
    # the profile runner
    r = _opscope(folder, "profile", "demo:mlp", "-b", "numpy", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _marked(marks) == [], "profile runner"
    # the OpInfo worker (onnxruntime runs OpInfos in a worker process)
    r = _opscope(folder, "backend", "check", "onnxruntime", "--opinfo", "--opinfos", "add", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _marked(marks) == [], "OpInfo worker"
    # train --hybrid: one process per share (two simulated chips of different speeds, for the advice below)
    fast, slow = _chip(tmp_path, "fastchip", 3e10), _chip(tmp_path, "slowchip", 1e9)
    r = _opscope(folder, "train", "demo:mlp", "--hybrid", f"{fast}=0.5,{slow}=0.5", "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _marked(marks) == [], "train --hybrid ranks"
    run_id = json.loads(r.stdout.strip().splitlines()[-1])["run_id"]
    # advise --apply retrains in a child `opscope train`
    r = _opscope(folder, "advise", run_id, "--apply", "rebalance-ranks", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _marked(marks) == [], "advise --apply"
    # the link benchmark: two gloo processes
    r = _opscope(folder, "simulate", "--measure-link", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert _marked(marks) == [], "link benchmark"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_torchrun_ranks_are_profiled_from_a_planted_folder(planted, tmp_path):
    """The sitecustomize that profiles torchrun's ranks still works, and the ranks (whose own folder is the
    script's, as plain python would have it) import nothing from the working folder."""
    folder, marks = planted
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "train.py").write_text(
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "m = torch.nn.Linear(4, 2)\nfor _ in range(2):\n    m(torch.randn(3, 4)).sum().backward()\n"
        "dist.destroy_process_group()\n")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    r = _opscope(folder, "profile", "--json", "--", torchrun, "--nproc-per-node", "1", str(scripts / "train.py"),
                 env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout[r.stdout.rfind("\n{") + 1:])         # after the job's own output
    assert doc["run_id"] and doc["events"] > 0, doc                 # the sitecustomize profiled the rank
    assert _marked(marks) == []


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_profiled_module_still_finds_its_own_folder(planted, tmp_path):
    """`opscope profile -- python -m tool` runs `tool` from the working folder, as `python -m tool` does: the
    folder the user chose for their own code is theirs; only opscope's own imports stay out of it."""
    folder, marks = planted
    (folder / "tool.py").write_text("print('tool ran')\n")
    r = _opscope(folder, "profile", "--engine", "eager", "--", "python", "-m", "tool")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tool ran" in r.stdout + r.stderr


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("safe_path_flag", [True, False], ids=["-P", "bootstrap"])
def test_a_child_ignores_the_working_folder_and_empty_pythonpath_entries(planted, monkeypatch, safe_path_flag):
    """Both forms of the command (Python >= 3.11's -P, and the bootstrap 3.10 gets) and an empty or relative
    PYTHONPATH entry (`PYTHONPATH=:$PYTHONPATH` with nothing set names the working folder)."""
    if safe_path_flag and sys.version_info < (3, 11):
        pytest.skip("-P is Python 3.11's")
    from opscope.runtime import child
    folder, marks = planted
    monkeypatch.chdir(folder)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["", ".", "clone-relative", os.environ.get("PYTHONPATH", "")]))
    argv = child.python_command("opscope.app", "runs", "--json", safe_path_flag=safe_path_flag)
    p = child.start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-2000:]
    assert json.loads(out) is not None
    assert _marked(marks) == []
