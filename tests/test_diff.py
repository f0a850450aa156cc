"""`opscope diff` and `opscope debug --report`: every op against a reference backend, as a table."""
import csv
import io
import json

import pytest

from opscope.debugger.report import COLUMNS, run_report
from opscope.runtime import open_session

from debugger_models import LOW_SOFTMAX_TOML, PLANTED_NAN, SOFTMAX, write

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def lowp(tmp_path):
    """A model with one softmax and a chip that runs softmax in float16."""
    return write(tmp_path, "soft.py", SOFTMAX) + ":factory", write(tmp_path, "lows.toml", LOW_SOFTMAX_TOML)


def test_the_first_failing_op_is_exactly_the_first_low_precision_op(lowp):
    model, chip = lowp
    report = run_report(open_session(model, chip), "numpy", tolerance=1e-5)
    first = report.summary()["first_failing"]
    assert first["op"] == "softmax" and first["node"] == "softmax"
    rows = {r.node: r for r in report.rows}
    soft = rows["softmax"]
    assert soft.error_from == "this op" and soft.status == "fail" and soft.local_err > 1e-5
    assert all(r.status == "pass" and r.err == 0 for r in report.rows if r.seq < soft.seq)
    after = [r for r in report.rows if r.seq > soft.seq]
    assert after and all(r.error_from == "inputs" and r.local_err < 1e-5 for r in after if r.status == "fail")
    assert report.summary()["first_introduced"]["node"] == "softmax"
    assert soft.source.endswith("soft.py:8") or "soft.py" in soft.source


def test_diff_cli_json_csv_and_file(lowp, cli, tmp_path):
    model, chip = lowp
    r = cli("diff", model, "-b", chip, "--reference", "numpy", "--tolerance", "1e-5", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["first_failing"]["op"] == "softmax"
    assert doc["summary"]["first_failing"]["module"] == ""          # a function, not a module, made it
    op = next(o for o in doc["ops"] if o["node"] == "softmax")
    for key in ("cosine", "max_abs", "max_rel", "err", "local_err", "tolerance", "error_from", "status", "module",
                "source", "dtype"):
        assert key in op
    assert op["status"] == "fail" and op["error_from"] == "this op" and op["dtype"] == "float32"
    out = tmp_path / "acc.csv"
    r = cli("diff", model, "-b", chip, "--csv", "-o", out)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert tuple(rows[0]) == COLUMNS and len(rows) == len(doc["ops"])
    assert next(x for x in rows if x["status"] == "fail")["node"] == "softmax"
    assert out.read_text() == r.stdout
    r = cli("diff", model, "-b", chip)
    assert r.returncode == 0 and "first failing op: #" in r.stdout and "softmax" in r.stdout


def test_diff_reports_nan_on_both_sides_never_within_tolerance(tmp_path, cli):
    model = write(tmp_path, "planted.py", PLANTED_NAN) + ":factory"
    r = cli("diff", model, "-b", "numpy", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    log = next(o for o in doc["ops"] if o["op"] == "log")
    assert log["status"] == "nan" and log["nan_both"] > 0
    assert "NaN/Inf on both sides" in log["verdict"] and "within tolerance" not in log["verdict"]
    assert doc["summary"]["first_nan"]["op"] == "log"
    assert all(o["status"] == "nan" for o in doc["ops"] if o["seq"] > log["seq"] and o["op"] == "tanh")


def test_bad_input_is_one_line_and_exit_2(cli, tmp_path):
    for args, needle in ((("diff", "demo:mlp", "-b", "numpy", "--reference", "nosuch"), "nosuch"),
                         (("diff", "demo:mlp", "-b", "numpy", "-o", tmp_path / "x.txt"), ".csv or .json"),
                         (("diff", "demo:mlp", "--tolerance", "-1"), "give a number above 0"),
                         (("debug", "demo:mlp", "--report", tmp_path / "r.csv"), "needs --reference"),
                         (("debug", "demo:mlp", "--reference", "numpy", "--report", tmp_path / "no" / "r.csv"),
                          "does not exist")):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert needle in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
