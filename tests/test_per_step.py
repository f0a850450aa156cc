"""One rule for per-step numbers (issue 27): Compare, the Operators page and the CLI divide each run by the steps
its events hold, with one function (stats.per_step). Two runs of one model on sim:npu-a1 with 5 and 2 steps read
0.40x per op on the Compare page while the CLI said 1.00x: the page divided totals."""
import json

import pytest

from opscope.app.web.server import create_app
from opscope.profiler import RunStore, profile, stats
from opscope.runtime import models

from test_web_security import _callback_body, _server_callbacks


def _call(app, key, values):
    cb = app.callback_map[key]
    r = app.server.test_client().post("/_dash-update-component", json=_callback_body(key, cb, values))
    assert r.status_code == 200, r.get_data(as_text=True)
    return r.get_json()["response"]


@pytest.fixture
def five_and_two():
    model, inputs = models.load("demo:mlp")
    a = profile("demo:mlp", "sim:npu-a1", model=model, inputs=inputs, steps=5)
    b = profile("demo:mlp", "sim:npu-a1", model=model, inputs=inputs, steps=2)
    return a, b


@pytest.mark.multiprocess
def test_compare_of_5_and_2_steps_reads_1x_per_op_on_the_page_and_in_the_cli(five_and_two, cli):
    a, b = five_and_two
    out = cli("compare", a, b, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert (doc["steps_a"], doc["steps_b"], doc["per"]) == (5, 2, "step")
    assert doc["ops"] and all(o["ratio"] == pytest.approx(1.0, rel=1e-6) for o in doc["ops"])
    assert all(n["ratio"] == pytest.approx(1.0, rel=1e-6) for n in doc["nodes"])
    assert doc["ratio"] == pytest.approx(1.0, rel=1e-6)
    assert "per step" in cli("compare", a, b).stdout

    app = create_app(store=RunStore())
    _server_callbacks(app)
    key = next(k for k in app.callback_map if "compare-table.rowData" in k)
    page = _call(app, key, [a, b, None])      # None: the runs the page was opened with (its State) are not these
    rows = {r["op"]: r for r in page["compare-table"]["rowData"]}
    assert set(rows) == {o["op"] for o in doc["ops"]}
    for o in doc["ops"]:                                  # the page shows the CLI's numbers, op for op
        r = rows[o["op"]]
        assert r["a_ms"] == pytest.approx(o["a_ns"] / 1e6) and r["b_ms"] == pytest.approx(o["b_ns"] / 1e6)
        assert r["ratio"] == pytest.approx(1.0, rel=1e-6) and r["a_count"] == r["b_count"] == o["a_count"]
    assert "1.00x" in json.dumps(page["compare-summary"])

    # the Operators page: the same division (total / step) and it says over how many steps the totals are
    ops_key = next(k for k in app.callback_map if k.startswith("..ops-table.rowData"))
    for rid, steps in ((a, 5), (b, 2)):
        run = RunStore().get_run(rid)
        resp = _call(app, ops_key, [{"run": rid, "status": "ok", "events": run["events"], "dropped": 0}, "op", None])
        table = {r["key"]: r for r in resp["ops-table"]["rowData"]}
        assert f"totals over {steps} steps" in resp["ops-busy"]["children"]
        for o in doc["ops"]:
            assert table[o["op"]]["per_step_ns"] == pytest.approx(o["a_ns"])
            assert table[o["op"]]["total_ns"] == pytest.approx(o["a_ns"] * steps)


def test_per_step_divides_by_the_steps_the_events_hold():
    times = {"steps": [{"step": 0}, {"step": 1}, {"step": 2}, {"step": 3}]}
    rows = stats.per_step([{"total_ns": 800, "count": 8}], stats.step_count(times))
    assert rows[0]["total_ns_per_step"] == 200 and rows[0]["count_per_step"] == 2
    assert stats.step_count({"steps": []}) == 1
