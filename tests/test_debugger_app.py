"""The Textual debugger driven by Pilot: keys, panels, breakpoints, watches, lockstep, errors, snapshots."""
import re
from pathlib import Path

import pytest

from opscope.debugger.app import DebuggerApp
from opscope.debugger.screens import AdvisorScreen, HelpScreen
from opscope.debugger.controller import Controller, Failed, Finished, Stop
from opscope.runtime import open_session

from debugger_models import (GPT2_SMALL, LOW_PRECISION_TOML, LOW_SOFTMAX_TOML, NUMERICS, PLANTED_NAN, RAISES, SOFTMAX,
                             until, write)

SIZE = (150, 45)



def keys(text):
    return [{" ": "space", ">": "greater_than_sign"}.get(c, c) for c in text]


def at(seq):
    return lambda ev: isinstance(ev, Stop) and ev.seq == seq


def on(op):
    return lambda ev: isinstance(ev, Stop) and ev.node.op == op


async def continue_to(pilot, app, op):
    """From the first op, `c` to the breakpoint set on `op`: the stop it makes."""
    await until(pilot, app, at(0))
    await pilot.press("c")
    return await until(pilot, app, on(op))


def text_of(app, wid):
    return str(app.query_one(f"#{wid}").render())


@pytest.fixture(scope="module")
def mlp():
    return open_session("demo:mlp", "numpy")


def app_for(session, **kw):
    return DebuggerApp(Controller(session, **kw), model=session.spec)


async def test_keys_step_through_the_ops(mlp):
    app = app_for(mlp)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        assert "linear" in text_of(app, "op")
        await pilot.press("n")
        ev = await until(pilot, app, at(1))
        assert ev.node.name == "relu"
        op = text_of(app, "op")
        assert "relu" in op and "ReLU" in op and "activation.py" in op
        assert app.query_one("#tensors").row_count == 2         # in0, out
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Finished))
        assert "run finished" in text_of(app, "op")
        await pilot.press("r")
        await until(pilot, app, at(0))
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_keys_pressed_while_an_op_runs_are_done_at_the_next_stops():
    """Type-ahead: n n n pressed faster than the ops run steps three ops; none is dropped."""
    import torch

    class Wide(torch.nn.Module):               # 4M-element ops: a step takes tens of ms
        def forward(self, x):
            for _ in range(3):
                x = torch.tanh(x * 1.01)
            return x
    s = open_session("test:wide", "numpy", model=Wide(), inputs=(torch.randn(2048, 2048),))
    app = app_for(s)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        for _ in range(3):                      # in one go: the model is still on the first of them
            app.action_next()
        assert len(app._queued) == 2
        await until(pilot, app, at(3))
        await pilot.pause(0.3)
        assert app.last_event.seq == 3 and app.ctl.state == "paused" and not app._queued


async def test_b_toggles_a_breakpoint_on_the_selected_op_and_c_stops_there(mlp):
    app = app_for(mlp)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        tree = app.query_one("#graph")
        tree.move_cursor(app._leaves[3])                         # relu_1
        await pilot.press("b")
        assert [bp.glob for bp in app.ctl.breakpoints] == ["relu_1"]
        assert "relu_1" in str(app.query_one("#breakpoints").get_row_at(0)[1])
        await pilot.press("c")
        ev = await until(pilot, app, at(3))
        assert "breakpoint" in ev.reason
        tree.move_cursor(app._leaves[3])
        await pilot.press("b")                                    # off again
        assert len(app.ctl.breakpoints) == 0


async def test_breakpoints_typed_in_the_prompt(mlp):
    app = app_for(mlp)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        await pilot.press("a", *keys("linear"), "enter")
        await pilot.press("a", *keys("max_abs >> 2"), "enter")         # a bad one: logged, not added
        assert [bp.op for bp in app.ctl.breakpoints] == ["linear"]
        await pilot.press("c")
        ev = await until(pilot, app, at(2))
        assert ev.node.op == "linear"


async def test_watch_added_in_the_prompt_shows_value_and_history(mlp):
    app = app_for(mlp)
    async with app.run_test(size=SIZE) as pilot:
        ev = await until(pilot, app, at(0))
        await pilot.press("w", *keys("out.mean()"), "enter")
        first = f"{float(ev.outputs[0][1].mean()):.4f}"
        assert "out.mean()" in text_of(app, "watches") and first in text_of(app, "watches")
        await pilot.press("n")
        await until(pilot, app, at(1))
        assert "before: " + first in text_of(app, "watches")


async def test_run_to_nan_key_shows_the_op_and_the_input(tmp_path):
    s = open_session(write(tmp_path, "planted.py", PLANTED_NAN) + ":factory", "numpy")
    app = app_for(s)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        await pilot.press("e")
        ev = await until(pilot, app, lambda e: isinstance(e, Stop) and e.reason == "NaN made here")
        assert ev.node.op == "log"
        op = text_of(app, "op")
        assert "NaN/Inf" in op and "introduced here" in op


async def test_lockstep_panel_and_tolerance_stop(tmp_path):
    chip = write(tmp_path, "lowp.toml", LOW_PRECISION_TOML)
    s = open_session(write(tmp_path, "numerics.py", NUMERICS) + ":factory", chip)
    app = app_for(s, reference="numpy", tolerance=1e-5)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        assert "within tolerance" in text_of(app, "op")
        await pilot.press("c")
        ev = await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq > 0)
        assert ev.node.module_path == "fc1"
        op = text_of(app, "op")
        assert "error introduced by this op" in op and "vs reference" in op


async def test_a_model_that_raises_shows_the_op_and_stays_usable(tmp_path):
    s = open_session(write(tmp_path, "raises.py", RAISES) + ":factory", "numpy")
    app = app_for(s)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        await pilot.press("c")
        ev = await until(pilot, app, lambda e: isinstance(e, Failed))
        op = text_of(app, "op")
        assert "the model raised" in op and "dbg_test_explode" in op and "refused its input" in op
        await pilot.press("n")                                    # nothing to step: says to restart
        await pilot.press("r")
        await until(pilot, app, at(0))
        await pilot.press("n")
        await until(pilot, app, at(1))


async def advice_shown(pilot, app):
    for _ in range(500):
        await pilot.pause(0.02)
        scr = app.screen
        if isinstance(scr, AdvisorScreen) and (scr.result is not None or scr.error is not None):
            await pilot.pause()
            return scr
    raise AssertionError("the advisor pane never showed its advice")


@pytest.mark.slow
async def test_advisor_pane_shows_the_advice_for_this_session():
    """A (shift+a) opens the advisor on the ops run so far; it works in a thread and the UI keeps going."""
    s = open_session("demo:gpt", "sim:npu-a1")        # gelu is unsupported there: it falls back
    app = app_for(s)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Finished))
        await pilot.press("A")
        scr = await advice_shown(pilot, app)
        assert scr.error is None and scr.result.complete
        text = str(scr.query_one("#advice").render())
        first = scr.result.advice[0]
        assert first.rule == "implement-fallback-op"
        assert first.title in text and "est. gain" in text and first.message[:40] in text
        await pilot.press("escape")
        assert not isinstance(app.screen, AdvisorScreen)
        await pilot.press("r")                                   # the debugger is still usable
        await until(pilot, app, at(0))
        await pilot.press("A")                 # mid-run again: the last whole run is the better evidence
        scr = await advice_shown(pilot, app)
        assert scr.result.complete and scr.result.ops == len(s.plan.steps)


# --- second pass: loading, history, deleting, progress, small terminals, the Python side ------------

def screen_text(app) -> str:
    """What the terminal shows, as plain text (the SVG export without its markup)."""
    import html
    import re
    svg = app.export_screenshot()
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


async def test_the_tui_opens_at_once_and_shows_progress_while_it_loads(mlp):
    import threading
    gate = threading.Event()

    def loader(progress):
        progress("capturing demo:mlp...")
        gate.wait(30)
        return Controller(mlp)
    app = DebuggerApp(model="demo:mlp", loader=loader)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(100):
            await pilot.pause(0.02)
            if "capturing demo:mlp" in text_of(app, "op"):
                break
        assert "loading" in text_of(app, "op") and "capturing demo:mlp" in text_of(app, "op")
        await pilot.press("n")                                  # keys while loading: no crash
        gate.set()
        await until(pilot, app, at(0))
        assert app.total == len(mlp.plan.steps)


async def test_a_dead_breakpoint_found_while_loading_exits_2_with_the_message(mlp):
    from opscope.runtime.errors import UsageError

    def loader(progress):
        c = Controller(mlp, breakpoints=["lienar"])
        dead = c.breakpoints.dead([st.node for st in c.steps])
        c.quit()
        raise UsageError(dead[0])
    app = DebuggerApp(model="demo:mlp", loader=loader)
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(200):
            await pilot.pause(0.02)
            if app.load_error is not None:
                break
    assert isinstance(app.load_error, UsageError) and "did you mean linear" in str(app.load_error)
    assert app.return_code == 2


async def test_a_dead_breakpoint_typed_in_the_prompt_is_warned(mlp):
    app = app_for(mlp)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        await pilot.press("a", *keys("lienar"), "enter")
        await pilot.pause()
        log = "\n".join(str(line.text) for line in app.query_one("#log").lines)
        assert "matches no op" in log and "did you mean linear" in log


async def test_p_steps_back_to_an_op_as_it_was_and_n_comes_forward(mlp):
    app = app_for(mlp)
    async with app.run_test(size=SIZE) as pilot:
        first = await until(pilot, app, at(0))
        for seq in (1, 2):
            await pilot.press("n")
            await until(pilot, app, at(seq))
        await pilot.press("p", "p")
        op = text_of(app, "op")
        assert "looking back" in op and first.node.name in op
        assert app.query_one("#tensors").row_text(3).split()[0] == "out"
        mean = f"{float(first.outputs[0][1].mean()):.4f}"
        assert mean in app.query_one("#tensors").row_text(3)        # its output's stats, as they were
        await pilot.press("n")                                      # forward through the history
        assert "relu" in text_of(app, "op") and "looking back" in text_of(app, "op")
        await pilot.press("n")                                      # back at the live op
        assert "looking back" not in text_of(app, "op") and "linear_1" in text_of(app, "op")
        await pilot.press("n")                                      # and the model steps on
        await until(pilot, app, at(3))
        app._tree.move_cursor(app._leaves[0])                       # enter on an op that ran: shown
        await pilot.press("enter")
        assert "looking back" in text_of(app, "op") and "#1/5" in text_of(app, "op")
        await pilot.press("l")
        assert "looking back" not in text_of(app, "op")


@pytest.mark.slow
async def test_breakpoints_and_watches_can_be_deleted(mlp):
    app = app_for(mlp, breakpoints=["relu", "linear"])
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        bt = app.query_one("#breakpoints")
        bt.focus()
        bt.move_cursor(row=0)
        await pilot.press("x")
        assert [bp.op for bp in app.ctl.breakpoints] == ["linear"]
        app._tree.focus()
        await pilot.press("w", *keys("out.mean()"), "enter")
        await pilot.press("w", *keys("out.std()"), "enter")
        await pilot.press("x", *keys("1"), "enter")
        assert [w.expr for w in app.ctl.watches] == ["out.std()"]
        assert "out.mean()" not in text_of(app, "watches")


async def test_footer_shows_a_and_help_shows_the_paging_keys(mlp):
    app = app_for(mlp)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        assert re.search(r"\ba\s+add break\b", screen_text(app))
        await pilot.press("question_mark")
        await pilot.pause()
        assert "[ and ]  page up / page down" in str(app.screen.query_one("Static").render())


async def test_a_long_continue_shows_an_op_counter_and_the_time():
    """An op that waits on the test (no timing): while it runs, the title counts ops and seconds."""
    import threading

    import torch
    from opscope.runtime import operator

    gate = threading.Event()

    def held(x):
        gate.wait(60)
        return x * 2

    @operator(reference=held)
    def dbg_test_gate(x):
        return x * 2

    class Long(torch.nn.Module):
        def forward(self, x):
            for _ in range(5):
                x = torch.tanh(x)
            return dbg_test_gate(x)
    s = open_session("test:long", "numpy", model=Long(), inputs=(torch.randn(8, 8),))
    app = app_for(s)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        await pilot.press("c")
        try:
            for _ in range(400):
                await pilot.pause(0.02)
                if "ops," in app.sub_title:
                    break
            assert "running (continue): 4 ops," in app.sub_title and app.sub_title.endswith(" s")
        finally:
            gate.set()
        await until(pilot, app, lambda e: isinstance(e, Finished))


async def test_the_debugpy_address_stays_on_screen(mlp):
    app = DebuggerApp(Controller(mlp), model="demo:mlp", notice="debugpy listening on 127.0.0.1:5678")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        await pilot.press("n")
        await until(pilot, app, at(1))
        assert "debugpy listening on 127.0.0.1:5678" in app.sub_title


@pytest.mark.parametrize("size", [(80, 24), (120, 35)])
async def test_small_terminals_show_the_reason_the_verdict_the_nan_sentence_and_the_tensors(tmp_path, size):
    s = open_session(write(tmp_path, "planted.py", PLANTED_NAN) + ":factory", "numpy")
    app = app_for(s, reference="numpy")
    async with app.run_test(size=size) as pilot:
        await until(pilot, app, at(0))
        await pilot.press("e")
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.reason == "NaN made here")
        app.screen.refresh(layout=True)
        await pilot.pause()
        shown = screen_text(app)
        assert "stopped: NaN made here" in shown
        assert "NaN/Inf on both sides" in shown                       # the verdict line
        assert "NaN/Inf: introduced here" in shown                    # the NaN sentence
        assert re.search(r"out\s+4x8\s+float32\s+32\s+0\s", shown)     # the output's NaN count


async def test_at_80x24_a_breakpoint_stop_shows_every_input_and_the_output_with_their_stats(mlp):
    """Issue 38: at 80x24 a linear's `out` row and the stats columns right of max were cut off."""
    from opscope.debugger.stats import fmt
    app = app_for(mlp, breakpoints=["linear"])
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, app, at(0))
        ev = await until(pilot, app, on("linear"))
        app.screen.refresh(layout=True)
        await pilot.pause()
        shown = screen_text(app)
    stats = ev.input_stats + ev.output_stats
    assert len(ev.input_stats) == 3 and len(ev.output_stats) == 1, [s.name for s in stats]    # x, weight, bias; out
    for s in stats:
        cells = [s.name.split(" ")[0], "x".join(map(str, s.shape)), s.dtype, str(s.nan), str(s.inf),
                 fmt(s.min), fmt(s.max), fmt(s.mean), fmt(s.std)]
        assert re.search(r"\s+".join(map(re.escape, cells)), shown), (cells, shown)


MANY_INPUTS = '''
import torch
from torch import nn


class Many(nn.Module):
    def forward(self, x):
        return torch.cat([x * (i + 1) for i in range(9)], dim=0)


def factory():
    return Many().eval(), (torch.ones(2, 3),)
'''


@pytest.mark.parametrize("size", [(80, 24), (150, 45)])
async def test_an_op_with_more_inputs_than_rows_keeps_its_output_in_view(tmp_path, size):
    """cat of 9 tensors (in0[0] .. in0[8]): the inputs scroll under the header, the output row stays."""
    s = open_session(write(tmp_path, "many.py", MANY_INPUTS) + ":factory", "numpy")
    app = app_for(s, breakpoints=["cat"])
    async with app.run_test(size=size) as pilot:
        ev = await continue_to(pilot, app, "cat")
        app.screen.refresh(layout=True)
        await pilot.pause()
        assert len(ev.input_stats) == 9
        table = text_of(app, "tensors")
        assert re.search(r"^ out\s+18x3\s", table, re.M) and re.search(r"^ in0\[0\]\s", table, re.M), table
        app.query_one("#tensors").focus()
        for _ in range(8):
            await pilot.press("down")
        await pilot.pause()
        table = text_of(app, "tensors")
        assert re.search(r"^ in0\[8\]\s", table, re.M) and re.search(r"^ out\s", table, re.M), table


async def test_report_screen_lists_every_op_and_the_first_failing(tmp_path):
    chip = write(tmp_path, "lows.toml", LOW_SOFTMAX_TOML)
    s = open_session(write(tmp_path, "soft.py", SOFTMAX) + ":factory", chip)
    out = tmp_path / "acc.json"
    app = DebuggerApp(Controller(s, reference="numpy", tolerance=1e-5), model=s.spec, report_path=str(out))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        await pilot.press("c")
        ev = await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq > 0)
        assert ev.node.op == "softmax"
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Finished))
        await pilot.press("R")
        await pilot.pause()
        text = str(app.screen.query_one("#report").render())
        assert "first failing op: #" in text and "softmax" in text
    import json
    doc = json.loads(out.read_text())
    assert doc["summary"]["first_failing"]["op"] == "softmax" and doc["summary"]["complete"]


# --- a transformers model (GPT-2 small's widths, two blocks, random weights) ------------------------

@pytest.fixture(scope="module")
def gpt2_file(tmp_path_factory):
    pytest.importorskip("transformers")
    return write(tmp_path_factory.mktemp("gpt2"), "gpt2_small.py", GPT2_SMALL)


@pytest.mark.slow
async def test_gpt2_stop_shows_the_ops_own_line_and_its_python_stack(gpt2_file):
    from opscope.debugger.pystack import open_debug_session

    s = open_debug_session(gpt2_file + ":factory", "numpy")
    app = app_for(s, breakpoints=["matmul"])
    async with app.run_test(size=SIZE) as pilot:
        ev = await continue_to(pilot, app, "matmul")
        # the attention matmul lives in a helper (eager_attention_forward), not in the module's forward
        assert ev.stack[0].function == "eager_attention_forward"
        assert ev.node.source == ev.stack[0].where and "modeling_gpt2.py" in ev.node.source
        assert any(f.function == "forward" for f in ev.stack[1:])
        assert not any("/opscope/" in f.path or f.path.startswith(("/work/main/runtime", "/work/main/debugger"))
                       for f in ev.stack)
        op = text_of(app, "op")
        assert "called from" in op and "modeling_gpt2.py" in op
        assert ev.stack[0].code in op


@pytest.mark.slow
async def test_gpt2_nan_in_a_weight_names_the_parameter(gpt2_file):
    import torch
    from opscope.runtime import models

    model, inputs = models.load(gpt2_file + ":factory")
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight[3, 5] = float("nan")
    s = open_session("gpt2:nan-weight", "numpy", model=model, inputs=inputs)
    app = app_for(s)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        await pilot.press("e")
        ev = await until(pilot, app, lambda e: isinstance(e, Stop) and e.reason == "NaN made here")
        assert ev.node.module_path == "transformer.h.1.mlp.c_fc"
        op = text_of(app, "op")
        assert "parameter transformer.h.1.mlp.c_fc.weight" in op
        await pilot.press("e")                                      # every later op only carries it
        await until(pilot, app, lambda e: isinstance(e, Finished))


# --- snapshots (pytest --snapshot-update rewrites them) ----------------------------------------
# sim backend: its op times are roofline estimates, so the screen is the same on every run.

def _snap_app():
    return app_for(open_session("demo:mlp", "sim:npu-a1"), reference="numpy")


async def settle(pilot):
    """One full re-layout before the snapshot: a screen reached by partial repaints (how many depends
    on timing, e.g. whether the "running..." title showed) is drawn the same but cut into different
    SVG rectangles."""
    pilot.app.screen.refresh(layout=True)
    await pilot.pause()


def _wait_for(seq):
    async def run_before(pilot):
        await until(pilot, pilot.app, at(seq))
    return run_before


def test_snapshot_stepped(snap_compare):
    async def run_before(pilot):
        await until(pilot, pilot.app, at(0))
        await pilot.press("n")
        await until(pilot, pilot.app, at(1))
        await settle(pilot)
    assert snap_compare(_snap_app(), terminal_size=SIZE, run_before=run_before)


def test_snapshot_help(snap_compare):
    async def run_before(pilot):
        await until(pilot, pilot.app, at(0))
        await pilot.press("question_mark")
        await settle(pilot)
    assert snap_compare(_snap_app(), terminal_size=SIZE, run_before=run_before)


def test_snapshot_failed(snap_compare, tmp_path, monkeypatch):
    # a relative path: the model's path is on the screen (title, source line), and TMPDIR may be anywhere
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "raises.py", RAISES)
    s = open_session("raises.py:factory", "sim:npu-a1")

    async def run_before(pilot):
        await until(pilot, pilot.app, at(0))
        await pilot.press("c")
        await until(pilot, pilot.app, lambda e: isinstance(e, Failed))
        await settle(pilot)
    assert snap_compare(app_for(s), terminal_size=SIZE, run_before=run_before)


def test_snapshot_advisor(snap_compare):
    async def run_before(pilot):
        await until(pilot, pilot.app, at(0))
        await pilot.press("c")
        await until(pilot, pilot.app, lambda e: isinstance(e, Finished))
        await pilot.press("A")
        await advice_shown(pilot, pilot.app)
        await settle(pilot)
    assert snap_compare(_snap_app(), terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (120, 35), (200, 50)])
def test_snapshot_nan_stop_at_size(snap_compare, size, tmp_path, monkeypatch):
    """The stop reason, the verdict, the NaN sentence and the tensors at three terminal sizes."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "planted.py", PLANTED_NAN)
    s = open_session("planted.py:factory", "sim:npu-a1")

    async def run_before(pilot):
        await until(pilot, pilot.app, at(0))
        await pilot.press("e")
        await until(pilot, pilot.app, lambda e: isinstance(e, Stop) and e.reason == "NaN made here")
        await settle(pilot)
    assert snap_compare(app_for(s, reference="numpy"), terminal_size=size, run_before=run_before)


GRAPH_BREAK = '''
import torch
from torch import nn


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.sum().item() > -1e9:        # .item(): a graph break, so two regions
            h = h * 2.0
        return torch.tanh(self.b(h))


def factory():
    torch.manual_seed(0)
    return Broken().eval(), (torch.randn(4, 8),)
'''


async def test_capture_dynamo_steps_through_every_regions_ops(tmp_path):
    """torch.compile splits the model at .item(): n walks the ops of both regions in order, each
    compared with the reference; r while paused in the second region starts over at op 1."""
    from opscope.runtime.dynamo import open_dynamo_session
    s = open_dynamo_session(write(tmp_path, "broken.py", GRAPH_BREAK) + ":factory", "numpy")
    assert s.dynamo.stats()["regions"] == 2
    app = app_for(s, reference="torch:cpu")
    total = len(app.ctl.steps)
    assert total == sum(len(p.steps) for p in s.dynamo.plans)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, at(0))
        assert [str(n.label) for n in app.query_one("#graph").root.children] == ["region 0", "region 1"]
        seen = [app.last_event.node.op]
        for seq in range(1, total):
            await pilot.press("n")
            ev = await until(pilot, app, at(seq))
            assert ev.diff is not None and ev.diff.verdict() == "within tolerance"
            assert f"#{seq + 1}/{total}" in text_of(app, "op")
            seen.append(ev.node.op)
        assert "tanh" in seen and "mul" in seen and seen.count("relu") == 1
        assert app.ctl.current.node is s.dynamo.plans[-1].steps[-1].node      # the last region's last op
        await pilot.press("r")
        await until(pilot, app, at(0))
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Finished))
        assert "all" in app.ctl.report.summary()["line"] and len(app.ctl.report.rows) == total


HELPER_LOCALS = '''
import torch
from torch import nn


def gated(h, temperature):
    width = h.shape[-1]
    gate = torch.sigmoid(h / temperature)
    return h * gate


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return gated(self.fc(x), 2.0)


def factory():
    torch.manual_seed(0)
    return Gated().eval(), (torch.randn(4, 8),)
'''


async def test_a_stop_shows_the_locals_of_the_ops_frame_as_traced(tmp_path):
    """At sigmoid the helper's frame held h, temperature and width (gate not yet); at the mul, gate too."""
    from opscope.debugger.pystack import open_debug_session
    s = open_debug_session(write(tmp_path, "gated.py", HELPER_LOCALS) + ":factory", "numpy")
    app = app_for(s, breakpoints=["sigmoid"])
    async with app.run_test(size=SIZE) as pilot:
        ev = await continue_to(pilot, app, "sigmoid")
        assert dict(ev.locals) == {"h": "4x8 float32", "temperature": "2.0", "width": "8"}
        op = text_of(app, "op")
        assert "locals h: 4x8 float32  temperature: 2.0  width: 8" in op
        await pilot.press("n")
        ev = await until(pilot, app, on("mul"))
        assert dict(ev.locals)["gate"] == "4x8 float32"
        assert "gate: 4x8 float32" in text_of(app, "op")
