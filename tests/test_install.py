"""README's install command picks the CPU build of torch wherever it runs, and keeps a torch the user has.

The trap (issue 34): on a machine where only PyPI is configured, `torch==2.13.0` resolves to PyPI's CUDA build
(526 MB plus cuda-toolkit, nvidia-cudnn-cu13, nvidia-nccl-cu13). These tests build two local package indexes
in a temporary folder -- a "PyPI" holding a fake CUDA-build torch with its nvidia dependencies, and a "CPU
index" holding a fake `torch 2.13.0+cpu` -- and ask pip (`install --dry-run --report -`) what README's first
command would install, in a bare virtual environment, with every pip configuration of this machine switched
off. The wheels are a few hundred bytes each: what pip resolves is decided by names, versions and
dependencies alone, so the fakes face exactly the choice the real wheels do.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA_DEPS = ["nvidia-cudnn-cu13", "nvidia-nccl-cu13", "cuda-toolkit"]

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.timeout(600)]


def readme_install() -> list[list[str]]:
    """The pip commands in README's first command (the part before `opscope profile`), as argv lists."""
    text = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n", text).group(1)
    return [shlex.split(part) for part in first.split("&&") if shlex.split(part)[:1] == ["pip"]]


def readme_gpu_install() -> list[list[str]]:
    """The pip commands README gives GPU users (the line after 'GPU users' that starts with pip)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"GPU users.*?```bash\n(.*?)```", text, re.S).group(1)
    return [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.startswith("pip install")]


def _wheel(folder: Path, name: str, version: str, requires: list[str] = ()) -> Path:
    """A minimal, valid wheel: only its metadata (pip resolves on name, version and Requires-Dist)."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    meta = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                    *(f"Requires-Dist: {r}\n" for r in requires)])
    files = {f"{dist}.dist-info/METADATA": meta,
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: opscope-tests\nRoot-Is-Purelib: true\n"
                                        "Tag: py3-none-any\n"}
    record = "".join(f"{p},,\n" for p in files) + f"{dist}.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for p, body in {**files, f"{dist}.dist-info/RECORD": record}.items():
            z.writestr(p, body)
    return path


def _index(root: Path, wheels: dict[str, list[tuple[str, list[str]]]]) -> str:
    """A PEP 503 simple index under root: one page per project linking its wheels; returns its file:// URL."""
    files = root / "files"
    files.mkdir(parents=True)
    for project, versions in wheels.items():
        page = root / "simple" / project
        page.mkdir(parents=True)
        links = [_wheel(files, project, version, requires) for version, requires in versions]
        page.joinpath("index.html").write_text(
            "<html><body>" + "".join(f'<a href="../../files/{w.name}">{w.name}</a>' for w in links) + "</body></html>")
    return (root / "simple").as_uri()


def _torch_requirement() -> str:
    """opscope's own torch requirement, as pyproject.toml states it (the fake opscope asks for the same)."""
    import tomllib
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [torch] = [d for d in deps if re.match(r"torch\b", d)]
    return torch


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    """'PyPI': CUDA-build torch 2.13.0 and 2.12.0 (pulling the nvidia wheels), the nvidia wheels, filelock and a
    fake opscope that needs torch as opscope does. 'CPU index': torch 2.13.0+cpu and filelock, as PyTorch's
    index serves them. 'wheels': a find-links folder holding only the CPU wheel, as this machine has."""
    base = tmp_path_factory.mktemp("indexes")
    cuda = CUDA_DEPS + ["filelock"]
    pypi = _index(base / "pypi", {"torch": [("2.13.0", cuda), ("2.12.0", cuda)],
                                  **{d: [("13.0.0", [])] for d in CUDA_DEPS}, "filelock": [("3.20.0", [])],
                                  "opscope": [("0.1.0", [_torch_requirement()])]})
    cpu = _index(base / "cpu", {"torch": [("2.13.0+cpu", ["filelock"])], "filelock": [("3.20.0", [])]})
    wheels = base / "wheels"
    wheels.mkdir()
    _wheel(wheels, "torch", "2.13.0+cpu", ["filelock"])
    return {"pypi": pypi, "cpu": cpu, "wheels": str(wheels)}


@pytest.fixture
def venv(tmp_path):
    """A bare virtual environment (no pip, nothing installed): pip acts on it through --python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp_path / "venv"], check=True, timeout=120)
    return tmp_path / "venv" / "bin" / "python"


def _pip(argv: list[str], venv: Path, indexes: dict, *, cpu_index: str | None = None, find_links: bool = False,
         report: bool = True) -> subprocess.CompletedProcess:
    """Run one of README's pip commands against the local indexes: PyPI's place is taken by the local 'PyPI',
    PyTorch's CPU index by the local one (or cpu_index), `-e ".[test]"` by the fake opscope; no pip.conf,
    no PIP_* variable of this machine, no network."""
    assert argv[:2] == ["pip", "install"], argv
    args = [a.replace(CPU_INDEX, cpu_index or indexes["cpu"]) for a in argv[2:]]
    args = ["opscope" if a == ".[test]" else a for a in args if a != "-e"]
    if "--index-url" not in args:
        args = ["--index-url", indexes["pypi"], *args]          # what "only PyPI configured" means
    else:
        args = [*args, "--extra-index-url", indexes["pypi"]] if find_links else args
    if find_links:
        args = ["--find-links", indexes["wheels"], *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_RETRIES="0", PIP_NO_INPUT="1")
    cmd = [sys.executable, "-m", "pip", "--python", str(venv), "install", *args]
    if report:
        cmd[6:6] = ["--dry-run", "--quiet", "--report", "-"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def _chosen(r: subprocess.CompletedProcess) -> dict[str, str]:
    assert r.returncode == 0, r.stderr[-3000:]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(r.stdout)["install"]}


def _install(venv: Path, wheels: Path, name: str, version: str) -> None:
    """Put a torch in the environment as a user's earlier install would have (no dependencies needed)."""
    wheel = _wheel(wheels, name, version, [])
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv), "install", "-q", "--no-deps", "--no-index",
                    wheel], check=True, env=env, timeout=300, capture_output=True)


def _run_readme(commands, venv, indexes, **kw) -> list[dict[str, str]]:
    """Each pip command of README in turn: what it would install (dry run), then installed for real so the
    next command sees it, as `&&` would."""
    seen = []
    for argv in commands:
        seen.append(_chosen(_pip(argv, venv, indexes, **kw)))
        r = _pip(argv, venv, indexes, report=False, **kw)
        assert r.returncode == 0, r.stderr[-3000:]
    return seen


def test_readme_install_is_two_pip_commands_then_the_profiler():
    commands = readme_install()
    assert commands and all(c[:2] == ["pip", "install"] for c in commands)
    assert any(CPU_INDEX in c for c in commands), "README's first command no longer names PyTorch's CPU index"


def test_only_pypi_configured_resolves_the_cpu_build_and_no_cuda_wheel(venv, indexes):
    torch_step, *rest = _run_readme(readme_install(), venv, indexes)
    assert torch_step.get("torch") == "2.13.0+cpu", torch_step
    everything = {k: v for step in (torch_step, *rest) for k, v in step.items()}
    assert not set(everything) & set(CUDA_DEPS), everything
    assert "opscope" in everything and "filelock" in everything       # torch's own dependencies still come
    assert all("torch" not in step for step in rest), rest             # the second step keeps the CPU torch


def test_the_same_pin_without_the_cpu_index_is_the_trap(venv, indexes):
    """Control: the fixture is the issue's trap -- the bare pin picks PyPI's CUDA build and its nvidia wheels."""
    chosen = _chosen(_pip(["pip", "install", "torch==2.13.0"], venv, indexes))
    assert chosen["torch"] == "2.13.0" and set(CUDA_DEPS) <= set(chosen)


def test_an_existing_cuda_torch_of_the_pinned_release_is_kept(venv, indexes, tmp_path):
    _install(venv, tmp_path, "torch", "2.13.0")           # PyPI's CUDA build of the same release
    steps = _run_readme(readme_install(), venv, indexes)
    assert all("torch" not in step for step in steps), steps
    assert not {k for step in steps for k in step} & set(CUDA_DEPS)


def test_gpu_users_command_keeps_their_cuda_torch(venv, indexes, tmp_path):
    commands = readme_gpu_install()
    assert commands, "README has no pip command for GPU users"
    _install(venv, tmp_path, "torch", "2.12.0")           # any CUDA build opscope accepts (torch>=2.4)
    steps = _run_readme(commands, venv, indexes)
    assert all("torch" not in step for step in steps), steps
    assert "opscope" in {k for step in steps for k in step}


def test_cpu_index_unreachable_takes_the_local_cpu_wheel(venv, indexes):
    """As on this machine: PyTorch's index cannot be reached, a CPU wheel lies in pip's find-links folder."""
    closed = "http://127.0.0.1:9/whl/cpu"                 # discard port: nothing listens, connection refused
    torch_step, *rest = _run_readme(readme_install(), venv, indexes, cpu_index=closed, find_links=True)
    assert torch_step.get("torch") == "2.13.0+cpu"
    assert not {k for step in (torch_step, *rest) for k in step} & set(CUDA_DEPS)


def test_cpu_index_unreachable_and_no_local_wheel_fails_instead_of_taking_cuda(venv, indexes):
    """Without a CPU wheel anywhere the torch step fails; it never falls back to PyPI's CUDA build."""
    closed = "http://127.0.0.1:9/whl/cpu"
    torch_step = readme_install()[0]
    r = _pip(torch_step, venv, indexes, cpu_index=closed)
    assert r.returncode != 0
    assert "No matching distribution found for torch==2.13.0" in r.stderr


def _machine_has_a_cpu_wheel() -> bool:
    r = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True,
                       text=True)
    folders = (os.environ.get("PIP_FIND_LINKS", "") + " " + (r.stdout if r.returncode == 0 else "")).split()
    return any(Path(f).glob("torch-2.13.0+cpu-*.whl") for f in folders if Path(f).is_dir())


def test_readme_torch_step_on_this_machine_resolves_the_local_cpu_wheel(venv):
    """README's torch step, with this machine's own pip configuration, where PyTorch's index is unreachable:
    it still succeeds, with the CPU wheel (one project asked of the dead index: seconds, not minutes)."""
    if not _machine_has_a_cpu_wheel():          # asked here, not at collection: pip config is a process
        pytest.skip("this machine's pip has no local CPU torch wheel (find-links)")
    torch_step = readme_install()[0]
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv), "install", "--dry-run", "--quiet",
                        "--report", "-", *torch_step[2:]], capture_output=True, text=True, timeout=300)
    assert _chosen(r)["torch"] == "2.13.0+cpu"


def containerfile_torch_step() -> str:
    """The Containerfile's torch step as the shell runs it, up to the install (what follows deletes files)."""
    text = (ROOT / "Containerfile").read_text()
    step = re.search(r"\nRUN (if \[ -n \"\$CA_BUNDLE\" \].*?want=\"torch==.*?)\n && site=", text, re.S).group(1)
    return step.replace("\\\n", "\n")


@pytest.fixture
def fake_pip(tmp_path, venv, indexes):
    """`pip` for the Containerfile's step: the real pip on the bare venv, dry run, with the local 'PyPI' in
    place of pypi.org and no configuration of this machine; it records what it was asked."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    script = bin_ / "pip"
    script.write_text(f"""#!{sys.executable}
import subprocess, sys
args = [a.replace("https://pypi.org/simple", {indexes['pypi']!r}) for a in sys.argv[1:]]
open({str(tmp_path / 'asked')!r}, "a").write(" ".join(args) + "\\n")
sys.exit(subprocess.call([sys.executable, "-m", "pip", "--python", {str(venv)!r}, args[0], "--dry-run",
                          *args[1:]]))
""")
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PATH=f"{bin_}:{os.environ['PATH']}",
               TORCH="cpu", TORCH_VERSION="2.13.0", WHEELS="", CA_BUNDLE="")
    return env


def test_containerfile_takes_the_cpu_build_from_its_index(fake_pip, indexes, tmp_path):
    r = subprocess.run(["sh", "-ec", containerfile_torch_step()], capture_output=True, text=True, timeout=300,
                       env={**fake_pip, "TORCH_INDEX": indexes["cpu"]})
    assert r.returncode == 0, r.stderr
    assert "torch==2.13.0+cpu" in (tmp_path / "asked").read_text()


def test_containerfile_without_its_cpu_index_stops_in_one_line_and_never_takes_cuda(fake_pip, tmp_path):
    """The issue's build: PyTorch's CPU index out of reach, PyPI (with its CUDA torch) reachable."""
    r = subprocess.run(["sh", "-ec", containerfile_torch_step()], capture_output=True, text=True, timeout=300,
                       env={**fake_pip, "TORCH_INDEX": "http://127.0.0.1:9/whl/cpu"})
    assert r.returncode == 1
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("Containerfile: could not install torch==2.13.0+cpu from http://127.0.0.1:9/whl/cpu "
                           "(ERROR: No matching distribution found for torch==2.13.0+cpu)"), line
    assert "never falls back to PyPI's CUDA build" in line
