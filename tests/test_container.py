"""The image from the Containerfile, built and run with Podman on a base made from Debian's packages
(deploy/make-base.sh): a profile inside it writes the run store on a mounted volume, the analyzer container
answers with its token and refuses without, its HEALTHCHECK passes; bad build arguments and token files
are one line, exit 2.

Needs root, podman, runc and mmdebstrap (CI installs them, .ci/run); skipped elsewhere. The base tarball is
kept in /var/tmp/opscope-base (OPSCOPE_BASE_CACHE), so a second run does not redo mmdebstrap; Podman's layer
cache keeps the torch and dependency layers, so after a source change only opscope itself is reinstalled.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "localhost/opscope:test"
BASE = "localhost/opscope-base"
TOKEN = "container-test-token"
WAIT = 240          # seconds the analyzer may take to answer on a loaded machine: a bound, not a threshold

pytestmark = [pytest.mark.slow, pytest.mark.container, pytest.mark.multiprocess, pytest.mark.timeout(1200),
              pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("podman")
                                      and shutil.which("runc") and shutil.which("mmdebstrap")),
                                 reason="needs root with podman, runc and mmdebstrap (apt-get install podman runc "
                                        "mmdebstrap)")]


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    """`podman` as this machine needs it: runc (crun fails on hybrid cgroups) and no default ulimits (refused)."""
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def run(*args, timeout=900, check=True):
        r = subprocess.run(["podman", "--runtime", "runc", *map(str, args)], capture_output=True, text=True,
                           env=env, timeout=timeout)
        if check and r.returncode != 0:
            pytest.fail(f"podman {' '.join(map(str, args))[:200]} -> {r.returncode}\n{r.stderr[-3000:]}")
        return r
    run.env = env
    return run


def _build_args() -> list[str]:
    """Where this machine gets torch: the find-links folder pip is configured with (holding the CPU wheel),
    mounted into the build; and the CA bundle pip trusts here, for a TLS-inspecting proxy."""
    args = []
    r = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True,
                       text=True)
    wheels = (os.environ.get("PIP_FIND_LINKS") or (r.stdout if r.returncode == 0 else "")).split()
    wheels = wheels[0] if wheels else ""
    if wheels and any(Path(wheels).glob("torch-*+cpu-*.whl")):
        args += ["-v", f"{wheels}:/wheels:ro", "--build-arg", "WHEELS=/wheels"]
    ca = Path("/etc/ssl/certs/ca-certificates.crt")
    if ca.is_file():
        args += ["-v", f"{ca}:/ca.crt:ro", "--build-arg", "CA_BUNDLE=/ca.crt"]
    return args


@pytest.fixture(scope="module")
def image(podman):
    started = time.monotonic()
    subprocess.run([str(ROOT / "deploy" / "make-base.sh")], check=True, env=podman.env, timeout=900,
                   capture_output=True)
    # --format docker: the OCI format has no HEALTHCHECK. --network=host: pip reaches the package index.
    podman("build", "--format", "docker", "--network=host", "--build-arg", f"BASE={BASE}", *_build_args(),
           "-t", IMAGE, "-f", ROOT / "Containerfile", ROOT, timeout=1200)
    size = int(podman("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout.strip())
    print(f"\nimage {IMAGE}: {size / 1e9:.2f} GB (built in {time.monotonic() - started:.0f} s)")
    return {"size": size}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"X-Opscope-Token": token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_profile_in_the_image_keeps_its_run_on_the_mounted_volume(podman, image, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 10001, 10001)                  # the image's user owns its volume, as fsGroup does on a cluster
    r = podman("run", "--rm", "--network=none", "-v", f"{data}:/data", IMAGE,
               "opscope", "profile", "demo:mlp", "-b", "numpy", "--steps", "2")
    assert "2 step(s)" in r.stdout
    r = podman("run", "--rm", "--network=none", "-v", f"{data}:/data", IMAGE, "opscope", "runs", "--json")
    [run] = json.loads(r.stdout)["runs"]
    assert run["model"] == "demo:mlp" and run["status"] == "ok" and run["steps"] == 2
    assert (data / "runs.duckdb").is_file()       # on the host: the store outlives the container
    assert image["size"] < 1.5e9                  # CPU torch: the aim


def test_the_analyzer_container_needs_its_token_and_is_healthy(podman, image, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 10001, 10001)
    podman("run", "--rm", "--network=none", "-v", f"{data}:/data", IMAGE,
           "opscope", "profile", "demo:mlp", "-b", "numpy", "--steps", "2")
    port = _free_port()
    name = f"opscope-test-{port}"
    # the image's default command: `opscope serve --host 0.0.0.0` with OPSCOPE_TOKEN from the environment
    podman("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8050", "-e", f"OPSCOPE_TOKEN={TOKEN}",
           "-v", f"{data}:/data", IMAGE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + WAIT
        while True:
            try:
                status, body = _get(f"{base}/", TOKEN)
                break
            except OSError:
                if time.monotonic() > deadline:
                    logs = podman("logs", name, check=False)
                    pytest.fail(f"the analyzer did not answer in {WAIT} s:\n{logs.stdout}\n{logs.stderr}")
                time.sleep(1)
        assert status == 200 and "opscope" in body
        status, body = _get(f"{base}/_opscope/live?run=x")
        assert status in (401, 403) and "token" in body
        assert _get(f"{base}/metrics", "wrong")[0] == 403
        status, body = _get(f"{base}/metrics", TOKEN)
        assert status == 200 and "opscope_device_utilization_ratio" in body
        health = podman("healthcheck", "run", name, check=False)
        assert health.returncode == 0, health.stdout + health.stderr
        state = podman("inspect", "--format", "{{json .State.Health}}", name).stdout
        assert '"healthy"' in state.lower() or '"status":"healthy"' in state.replace(" ", "").lower(), state
    finally:
        podman("rm", "-f", name, check=False)


def test_a_token_file_others_can_read_is_refused_in_one_line(podman, image, tmp_path):
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    secret.chmod(0o644)
    r = podman("run", "--rm", "--network=none", "-v", f"{secret}:/run/secrets/opscope-token:ro",
               "-e", "OPSCOPE_TOKEN_FILE=/run/secrets/opscope-token", IMAGE, check=False)
    assert r.returncode == 2, r.stderr
    [line] = _container_lines(r.stderr)
    assert "other users can read it" in line and "chmod 600" in line


def test_a_build_argument_naming_no_torch_build_stops_the_build_in_one_line(podman, image):
    r = podman("build", "--format", "docker", "--network=none", "--build-arg", f"BASE={BASE}",
               "--build-arg", "TORCH=gpu", "-f", ROOT / "Containerfile", ROOT, check=False, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    # podman echoes the failed step (which holds the message's text too); the step's own output is one line
    [said] = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("Containerfile:")]
    assert said.startswith("Containerfile: --build-arg TORCH=gpu names no torch build; use cpu")


def _container_lines(stderr: str) -> list[str]:
    """What the container wrote, without podman's own log lines (`time="..." level=error msg="unable to get
    systemd connection to add healthchecks"` on a machine without systemd)."""
    return [line for line in stderr.strip().splitlines() if not line.startswith('time="')]
