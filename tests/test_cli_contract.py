"""What a new user hits in the first hour (issue 17): no tracebacks, nonsense refused with one line,
--help cheap and with examples, numbers that say what they are, tables that fit 100 columns."""
import json
import math
import re
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from opscope.app.cli import COMMANDS, EXAMPLES

BAD_MODEL = textwrap.dedent("""\
    import torch


    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            raise ValueError("the model's own failure")


    def factory():
        return Bad(), (torch.randn(2, 4),)
    """)
RAISE_LINE = 11

NAN_MODEL = textwrap.dedent("""\
    import torch


    class Nan(torch.nn.Module):
        def forward(self, x):
            return x * float("nan")


    def factory():
        return Nan(), (torch.randn(2, 4),)
    """)


def one_line(r):
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    return len(lines) == 1 and "Traceback" not in r.stderr + r.stdout


# --- --help: cheap, with examples and defaults --------------------------------------------------

HELP_PROBE = """
import contextlib, io, sys
from opscope.app.cli import main
try:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(code, "torch" in sys.modules, len(out.getvalue()))
"""

@pytest.mark.multiprocess
@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_does_not_import_torch(command):
    argv = [command, "--help"] if command else ["--help"]
    r = subprocess.run([sys.executable, "-c", HELP_PROBE, *argv], capture_output=True, text=True, timeout=120)
    code, torch_loaded, printed = r.stdout.split()
    assert code == "0" and int(printed) > 100, r.stderr
    assert torch_loaded == "False", f"`opscope {' '.join(argv)}` imported torch"


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_help_shows_examples_defaults_and_the_home(cli, command):
    r = cli(*command.split(), "--help")                 # "trace export": a command and its verb
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "examples:" in r.stdout and EXAMPLES[command][0] in text
    assert "OPSCOPE_HOME" in text


def test_help_states_defaults(cli):
    text = " ".join(cli("run", "--help").stdout.split())
    assert "(default: torch:cpu)" in text and "(default: 1)" in text       # --backend, --repeat


# --- no traceback reaches the user ----------------------------------------------------------------

@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("argv", [["run"], ["migrate", "check", "--backend", "numpy"], ["debug"]],
                         ids=["run", "migrate-check", "debug"])
def test_a_model_that_raises_is_one_line_with_the_users_frame(cli, tmp_path, argv):
    model = tmp_path / "bad_model.py"
    model.write_text(BAD_MODEL)
    args = [*argv[:1], *argv[1:2], f"{model}:factory", *argv[2:]] if argv[0] == "migrate" else \
        [argv[0], f"{model}:factory", "--backend", "numpy"]
    r = cli(*args, tty=argv[0] == "debug")              # debug needs a terminal
    err = r.stderr
    assert r.returncode == 1, err
    assert "Traceback" not in err and "torch/" not in err, err
    ours = re.findall(r"opscope: error:[^\n]*", err)       # the TUI's escape codes may precede it (debug)
    assert len(ours) == 1 and "the model's own failure" in ours[0], err
    assert f"bad_model.py:{RAISE_LINE}" in ours[0], err


def test_opscope_debug_shows_the_traceback(cli, tmp_path):
    (tmp_path / "home").write_text("")
    r = cli("tune", "demo:mlp", "--backend", "numpy", env={"OPSCOPE_HOME": str(tmp_path / "home"),
                                                          "OPSCOPE_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr


def _homes(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "runs.duckdb").write_bytes(b"not a database " * 500)
    (corrupt / "tuning").mkdir()
    (corrupt / "tuning" / "cache.json").write_bytes(b"\xff{ not json")
    return {"file": a_file, "uncreatable": a_file / "below-a-file", "corrupt": corrupt}


@pytest.mark.parametrize("home", ["file", "uncreatable", "corrupt"])
@pytest.mark.parametrize("argv", [["runs"], ["show", "abc"], ["profile", "demo:mlp", "--backend", "numpy"],
                                  ["tune", "demo:mlp", "--backend", "numpy", "--budget", "1", "--repeats", "1"]],
                         ids=["runs", "show", "profile", "tune"])
def test_a_bad_opscope_home_is_one_line(cli, tmp_path, home, argv):
    r = cli(*argv, env={"OPSCOPE_HOME": str(_homes(tmp_path)[home])})
    if home == "corrupt" and argv[0] == "tune":     # a damaged cache costs a re-measurement, nothing more
        assert r.returncode == 0, r.stderr
        return
    assert r.returncode in (1, 2) and one_line(r), r.stderr
    if argv[0] != "show" or home != "uncreatable":   # an absent store simply has no run "abc"
        assert "OPSCOPE_HOME" in r.stderr or "run store" in r.stderr, r.stderr


# --- nonsense refused: exit 2, one line -------------------------------------------------------------

@pytest.mark.parametrize("argv,says", [
    (["run", "demo:mlp", "--hybrid", "torch:cpu=0.7,numpy=0.5"], "sum to 1.2"),
    (["run", "demo:mlp", "--hybrid", "torch:cpu=0.7,numpy=-0.3"], ">= 0"),
    (["ops", "--backend", "no-such-chip"], "unknown backend"),
    (["ops", "--kind", "nonsense"], "kinds are"),
    (["run", "demo:mlp", "--repeat", "0"], "--repeat"),
])
def test_nonsense_is_exit_2_and_one_line(cli, argv, says):
    r = cli(*argv)
    assert r.returncode == 2 and one_line(r), r.stderr
    assert says in r.stderr


def test_hybrid_shares_that_round_to_one_are_normalised():
    from opscope.runtime.hybrid import HybridStrategy
    s = HybridStrategy(ratios={"a": 1 / 3, "b": 1 / 3, "c": 1 / 3 + 5e-7})
    assert math.isclose(sum(s.ratios.values()), 1.0)


def test_a_split_that_cannot_honour_the_shares_says_what_it_did(cli, tmp_path):
    (tmp_path / "two.py").write_text("import torch\n\ndef f():\n    torch.manual_seed(0)\n"
                                     "    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)\n")
    r = cli("run", f"{tmp_path}/two.py:f", "--hybrid", "torch:cpu=0.7,sim:npu-a1=0.3", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [s["rows"] for s in doc["shares"]] == [1, 1]
    assert "1/1 rows" in doc["split_note"] and "0.70/0.30" in doc["split_note"]
    human = cli("run", f"{tmp_path}/two.py:f", "--hybrid", "torch:cpu=0.7,sim:npu-a1=0.3")
    assert "note: a batch of 2 rows splits in whole rows: 1/1 rows" in " ".join(human.stdout.split())


# --- opscope ops -------------------------------------------------------------------------------------

# cli_process: `ops` lists the registry as a fresh process holds it; this worker also holds the @operator ops
# that other test modules define when they are collected
@pytest.mark.cli_process
@pytest.mark.multiprocess
def test_ops_lists_every_op_and_who_runs_it(cli):
    doc = json.loads(cli("ops", "--json").stdout)
    assert {"numpy", "torch:cpu", "sim:npu-a1"} <= set(doc["backends"])
    rows = {r["op"]: r for r in doc["ops"]}
    # The registry as a fresh process holds it: this pytest process also holds the @operator ops
    # other test files define, which the `ops` command cannot know.
    fresh = subprocess.run([sys.executable, "-c", "import json; from opscope.runtime.ops import OPS; "
                            "from opscope.runtime.ops.registry import INTERNAL_OPS; "
                            "print(json.dumps(sorted(set(OPS) - INTERNAL_OPS)))"],
                           capture_output=True, text=True, check=True)
    assert set(rows) == set(json.loads(fresh.stdout))  # nodes opscope inserts are not a model's ops
    assert "sim:npu-a1" not in rows["gelu"]["native"] and "numpy" in rows["gelu"]["native"]
    assert rows["gelu"]["why_not"]["sim:npu-a1"] == "marked unsupported in its description"
    assert rows["linear"]["kind"] and "float32" in rows["linear"]["dtypes"]
    one = cli("ops", "--backend", "sim:npu-a1")
    assert one.returncode == 0 and "marked unsupported" in one.stdout


# --- numbers that say what they are -------------------------------------------------------------

def test_an_all_nan_output_reports_nan_not_zero():
    from opscope.runtime.session import compare
    nan = np.full(4, np.nan)
    for actual, expected in [(nan, nan), (nan, np.ones(4)), (np.ones(4), nan)]:
        err = compare([actual], [expected])
        assert math.isnan(err["max_abs"]) and math.isnan(err["max_rel"]) and err["note"]
    ok = compare([np.array([1.0, np.nan])], [np.array([1.0, np.nan])])    # NaN on both sides agree
    assert ok["max_abs"] == 0.0
    assert "max(|expected|" in ok["rel_basis"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_run_says_nan_and_what_the_time_is(cli, tmp_path):
    (tmp_path / "nan_model.py").write_text(NAN_MODEL)
    r = cli("run", f"{tmp_path}/nan_model.py:factory", "--backend", "numpy")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "max abs err nan" in text and "0.00e+00" not in text and "every output value is NaN" in text
    assert "host wall" in text and "simulated" not in text
    doc = json.loads(cli("run", "demo:mlp", "--backend", "sim:npu-a1", "--json").stdout)
    assert doc["clock"] == "simulated" and doc["seconds"] < doc["host_seconds"]
    assert "per element" in doc["rel_err_basis"]
    sim = " ".join(cli("run", "demo:mlp", "--backend", "sim:npu-a1").stdout.split())
    assert "ms simulated on sim:npu-a1" in sim and "host wall" in sim


@pytest.mark.parametrize("x,shown", [(0.0042, "0.0042x"), (1.234, "1.23x"), (0.00001234, "1.2e-05x"),
                                     (0.0, "0.00x"), (None, "-")])
def test_ratios_never_print_as_zero(x, shown):
    from opscope.app.cli.common import fmt_ratio
    assert fmt_ratio(x) == shown


# --- tables fit 100 columns ---------------------------------------------------------------------

@pytest.mark.multiprocess
@pytest.mark.parametrize("argv,must_show", [
    (["ops"], "scaled_dot_product_attention"),
    (["backends"], "sim:npu-a1"),
    (["migrate", "scan", os.path.join(os.path.dirname(__file__), "migrate_corpus")], ".py:1"),
])
def test_tables_fit_100_columns_and_keep_their_key_column(cli, argv, must_show):
    r = cli(*argv, env={"COLUMNS": "100"})
    assert r.returncode == 0, r.stderr
    table_lines = [line for line in r.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table_lines and max(len(line) for line in table_lines) <= 100
    assert must_show in r.stdout
    assert "…" not in "".join(line.split("│")[1] for line in table_lines if line.startswith("│"))


def test_table_helper_wraps_text_instead_of_dropping_file_line():
    from rich.console import Console

    from opscope.app.cli import common
    rows = [[f"some/deep/folder/file_{i}.py:{i}:{i}", "torch.cuda.is_available" * 2, "device", "info", "apply",
             "compat.is_available(): true on whichever accelerator is chosen " * 2] for i in range(3)]
    old = common.console
    common.console = Console(width=100, file=open(os.devnull, "w"))
    try:
        t = common.table("findings", ["where", "API", "category", "severity", "fix", "use instead"], rows)
        with Console(width=100, record=True, file=open(os.devnull, "w")) as c:
            c.print(t)
        text = c.export_text()
    finally:
        common.console = old
    assert max(len(line) for line in text.splitlines()) <= 100
    for i in range(3):
        assert f"some/deep/folder/file_{i}.py:{i}:{i}" in text


# --- the run store: steps that exist, deleting runs, its size -----------------------------------

def _profiled(cli, steps=5):
    r = cli("profile", "demo:mlp", "--backend", "numpy", "--steps", str(steps), "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["run_id"]


@pytest.mark.multiprocess
def test_show_refuses_a_step_the_run_does_not_have(cli):
    rid = _profiled(cli)
    for step in ("99", "5", "-1"):
        r = cli("show", rid, "--step", step)
        assert r.returncode == 2 and one_line(r) and "recorded 5 step(s)" in r.stderr, r.stderr
    assert cli("show", rid, "--step", "4").returncode == 0


@pytest.mark.multiprocess
def test_runs_rm_by_id_age_and_keep_and_the_store_size(cli):
    ids = [_profiled(cli, 1) for _ in range(3)]             # oldest first
    listing = json.loads(cli("runs", "--json").stdout)
    assert listing["store"]["bytes"] > 0 and listing["store"]["path"].endswith("runs.duckdb")
    assert "run store" in cli("runs").stdout
    assert json.loads(cli("runs", "rm", "--older-than", "7d", "--json").stdout)["deleted"] == []
    kept = json.loads(cli("runs", "rm", "--keep", "2", "--json").stdout)
    assert kept["deleted"] == [ids[0]]
    gone = json.loads(cli("runs", "rm", ids[1][:8], "--json").stdout)
    assert gone["deleted"] == [ids[1]]
    assert [r["run_id"] for r in json.loads(cli("runs", "--json").stdout)["runs"]] == [ids[2]]
    for bad in (["runs", "rm"], ["runs", "rm", "--older-than", "7x"], ["runs", "rm", "--keep", "-1"],
                ["runs", "rm", "no-such-run"], ["runs", "rm", ids[2], "--keep", "1"]):
        r = cli(*bad)
        assert r.returncode == 2 and one_line(r), (bad, r.stderr)


def test_backend_check_default_dtypes_match_the_conformance_suite():
    from opscope.app.cli.backend import DEFAULT_DTYPES
    from opscope.runtime.conformance import DEFAULT_DTYPES as SUITE
    assert tuple(DEFAULT_DTYPES) == tuple(SUITE)
