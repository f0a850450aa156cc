"""A vendor's stack as its own package (examples/vendor_stack, built and pip-installed from a copy outside the
repository): found by the `opscope.backends` entry point, listed, given its [backend.options] (checked by its own
schema), runs demo:gpt within 1e-4 as a region, profiles with per-op children counted once, and is named in a
plan -- with no file of opscope's core edited. Broken packages are listed as not available and break nothing."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "vendor_stack"
BROKEN = {  # entry point -> what its module is
    "brokenimport": "raise ImportError('the vendor SDK is missing')\n",
    "nocreate": "kind, clock = 'regions', 'host'\ndef available(d):\n    return True, ''\n",
    "badschema": "kind, clock = 'regions', 'host'\noptions = {'threads': {'type': 'integer', 'help': 'x'}}\n"
                 "def available(d):\n    return True, ''\ndef create(d):\n    raise AssertionError\n",
}


def _pip(*args):
    r = subprocess.run([sys.executable, "-m", "pip", "-q", *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The example package and a package of broken entry points, installed into this environment for the module."""
    root = tmp_path_factory.mktemp("vendor")
    shutil.copytree(EXAMPLE, root / "good", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "build"))
    bad = root / "bad"
    (bad / "broken_stacks").mkdir(parents=True)
    (bad / "broken_stacks" / "__init__.py").write_text("")
    for name, text in BROKEN.items():
        (bad / "broken_stacks" / f"{name}.py").write_text(text)
    (bad / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "opscope-broken-stacks"\nversion = "0.1"\n'
        '[project.entry-points."opscope.backends"]\n'
        + "".join(f'{n} = "broken_stacks.{n}"\n' for n in BROKEN) + '[tool.setuptools]\npackages = ["broken_stacks"]\n')
    try:
        for pkg in ("good", "bad"):
            _pip("install", "--no-deps", "--no-build-isolation", "-e", str(root / pkg))
        yield root / "good"
    finally:
        _pip("uninstall", "-y", "opscope-example-stack", "opscope-broken-stacks")


def _one_line_exit_2(r):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    return r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr


# cli_process: the vendor package is installed while the test runs; a process that started before it
# (this worker) has read the entry points already, as any Python process would
@pytest.mark.cli_process
@pytest.mark.multiprocess
@pytest.mark.slow
def test_listed_with_its_options_and_broken_packages_are_not_available(installed, cli):
    r = cli("backends", "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rows = {row["spec"]: row for row in json.loads(r.stdout)["backends"]}
    ts = rows["tsregions"]
    assert ts["available"] is True and ts["package"] == "opscope-example-stack" and ts["clock"] == "host"
    assert set(ts["options"]) == {"freeze", "threads"}
    assert "cannot import" in rows["brokenimport"]["reason"] and "vendor SDK is missing" in rows["brokenimport"]["reason"]
    assert "no create()" in rows["nocreate"]["reason"]
    assert "threads: type is 'integer'" in rows["badschema"]["reason"]
    assert not any(rows[n]["available"] for n in BROKEN)
    assert rows["numpy"]["available"] and rows["onnxruntime"]["available"]     # nothing else noticed
    text = cli("backends", env={"COLUMNS": "250"})
    assert text.returncode == 0 and "not available: cannot import broken_stacks.brokenimport" in text.stdout
    r = cli("run", "demo:mlp", "-b", "nocreate")
    assert _one_line_exit_2(r) and "not available" in r.stderr, r.stderr


# cli_process: the vendor package is installed while the test runs; a process that started before it
# (this worker) has read the entry points already, as any Python process would
@pytest.mark.cli_process
@pytest.mark.multiprocess
@pytest.mark.slow
def test_receives_its_options_and_a_rejected_one_is_one_line(installed, cli, tmp_path):
    probe = ("import json, sys\nfrom opscope.runtime.backends import resolve\n"
             "b = resolve(sys.argv[1])\nprint(json.dumps([b.name, b.description.options]))\n")
    for spec, options in (("tsregions", {"freeze": True, "threads": 1}),        # the schema's defaults
                          (str(installed / "tsregions.toml"), {"freeze": True, "threads": 1})):
        out = subprocess.run([sys.executable, "-c", probe, spec], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout.splitlines()[-1])[1] == options
    for text, key in (("threads = \"four\"", "backend.options.threads: expected torch intra-op threads"),
                      ("workspace = 1", "backend.options.workspace: unknown option; tsregions takes freeze, threads")):
        chip = tmp_path / "bad.toml"
        chip.write_text(f'[backend]\nname = "bad"\nimplementation = "tsregions"\n[backend.options]\n{text}\n')
        r = cli("run", "demo:mlp", "-b", chip)
        assert _one_line_exit_2(r) and key in r.stderr and str(chip) in r.stderr, r.stderr


# cli_process: the vendor package is installed while the test runs; a process that started before it
# (this worker) has read the entry points already, as any Python process would
@pytest.mark.cli_process
@pytest.mark.multiprocess
@pytest.mark.slow
def test_runs_profiles_and_plans_demo_gpt(installed, cli, tmp_path):
    chip = installed / "tsregions.toml"
    r = cli("run", "demo:gpt", "-b", chip, "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["max_abs_err"] <= 1e-4 and run["backend"] == "tsregions"
    (region,) = run["placement"]["regions"]
    assert region["backend"] == "tsregions" and region["nodes"] >= 80
    # profiled: per-op children beneath the region, each op's time counted once
    r = cli("profile", "demo:gpt", "-b", chip, "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr
    r = cli("show", json.loads(r.stdout)["run_id"], "--by", "op", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["op"]: row for row in json.loads(r.stdout)["ops"]}
    assert {"region", "linear", "layer_norm", "scaled_dot_product_attention"} <= set(rows)
    assert sum(row["self_ns"] for row in rows.values()) <= rows["region"]["total_ns"]
    assert rows["region"]["self_ns"] < 0.5 * rows["region"]["total_ns"]
    assert sum(row["share"] for row in rows.values()) == pytest.approx(1.0)
    # named in a plan: compile, then run the plan with no -b
    plan = tmp_path / "gpt.opsplan"
    r = cli("compile", "demo:gpt", "-b", "tsregions", "-o", plan, "--json")
    assert r.returncode == 0, r.stderr
    r = cli("run", "demo:gpt", "--plan", plan, "--json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["backend"] == "tsregions" and run["max_abs_err"] <= 1e-4 and run["placement"]["regions"]
