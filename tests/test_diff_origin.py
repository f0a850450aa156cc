"""Error that builds up under tolerance still has an origin (issue 27, item 12).

The model: a float16 tanh (the sim chip's `low_precision`) whose rounding stays under the
tolerance, then `y - y.mean()`, which cancels the large common part and magnifies the rounding
past the tolerance. The subtraction fails, from its inputs; `diff` must name the tanh."""
import csv
import io
import json

import pytest

from debugger_models import LOW_PRECISION_TOML, write

pytestmark = pytest.mark.multiprocess

CANCEL = '''
import torch
from torch import nn


class Cancel(nn.Module):
    def forward(self, x):
        y = torch.tanh(x)                          # float16 on the chip: rounding ~1e-4, under tolerance
        return y - y.mean(dim=-1, keepdim=True)    # cancels the common 0.46: the rounding is what is left


def factory():
    torch.manual_seed(0)
    return Cancel().eval(), (0.5 + 1e-3 * torch.randn(4, 256),)
'''

TANH_TOML = LOW_PRECISION_TOML.replace('low_precision = ["linear"]', 'low_precision = ["tanh"]')


def test_diff_names_the_sub_tolerance_tanh_as_the_origin(tmp_path, cli):
    model = write(tmp_path, "cancel.py", CANCEL) + ":factory"
    chip = write(tmp_path, "tanh16.toml", TANH_TOML)
    out = tmp_path / "acc.csv"
    r = cli("diff", model, "-b", chip, "--tolerance", "1e-3", "--json", "-o", out)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ops = {o["op"]: o for o in doc["ops"]}
    tanh, sub = ops["tanh"], ops["sub"]
    assert tanh["status"] == "pass" and tanh["local_err"] < 1e-3         # under tolerance: nothing failed there
    assert sub["status"] == "fail" and sub["error_from"] == "inputs"     # the cancelling op fails, inherited
    assert sub["received_err"] > 1e-3 and sub["local_err"] < 1e-5        # what its inputs brought, not its own
    assert tanh["significant"] and not sub["significant"]
    s = doc["summary"]
    assert s["first_introduced"] is None                 # no op is over tolerance on its own ...
    assert s["error_origin"]["op"] == "tanh"             # ... yet the origin is named
    assert s["first_significant"]["op"] == "tanh"
    assert "error began at" in s["line"] and "tanh" in s["line"]
    # the plain report ranks by introduced error, the tanh first
    r = cli("diff", model, "-b", chip, "--tolerance", "1e-3")
    assert r.returncode == 0, r.stderr
    ranked = r.stdout.split("ops ranked by the error they introduced")[1]
    first_row = next(line for line in ranked.splitlines() if "│" in line and any(c.isdigit() for c in line))
    assert "tanh" in first_row, ranked
    # msprobe's ratios in the CSV: the tanh's values are within 1/1000 almost everywhere, the sub's are not
    rows = {x["op"]: x for x in csv.DictReader(io.StringIO(out.read_text()))}
    assert float(rows["tanh"]["one_thousandth_ratio"]) == 1.0
    assert float(rows["sub"]["one_thousandth_ratio"]) < float(rows["sub"]["five_thousandths_ratio"]) <= 1.0


def test_without_the_planted_tanh_nothing_is_significant(tmp_path, cli):
    model = write(tmp_path, "cancel.py", CANCEL) + ":factory"
    r = cli("diff", model, "-b", "sim:npu-a1", "--tolerance", "1e-3", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["summary"]
    assert s["error_origin"] is None and s["first_failing"] is None


def test_the_debugger_breaks_where_sub_tolerance_error_began(tmp_path):
    """`--break introduced`: the TUI's controller stops at the tanh, not at the failing sub after it."""
    from opscope.debugger.controller import Controller, Stop
    from opscope.runtime import open_session
    s = open_session(write(tmp_path, "cancel.py", CANCEL) + ":factory", write(tmp_path, "tanh16.toml", TANH_TOML))
    c = Controller(s, reference="numpy", tolerance=1e-3, breakpoints=["introduced"])
    try:
        c.cont()
        ev = c.wait()
        assert isinstance(ev, Stop) and ev.node.op == "tanh", ev
        assert ev.diff.significant and not ev.diff.exceeds
        assert "more error than rounding" in ev.diff.verdict()
    finally:
        c.quit()


ARGMAX = '''
import torch
from torch import nn


class Pick(nn.Module):
    def forward(self, x):
        return torch.argmax(torch.tanh(x), dim=-1)       # an integer output: no epsilon to measure against


def factory():
    torch.manual_seed(0)
    return Pick().eval(), (torch.randn(4, 8),)
'''


def test_an_integer_output_is_compared_not_a_crash(tmp_path):
    """np.finfo(int64) raises ValueError: the significance of an integer op is its tolerance."""
    from opscope.debugger.report import run_report
    from opscope.runtime import open_session
    report = run_report(open_session(write(tmp_path, "pick.py", ARGMAX) + ":factory", "numpy"), "numpy")
    rows = {r.op: r for r in report.rows}
    assert rows["argmax"].status == "pass" and not rows["argmax"].significant
