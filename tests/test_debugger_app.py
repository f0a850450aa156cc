"""The Textual debugger driven by Pilot: keys, panels, breakpoints, watches, lockstep, errors, snapshots."""
import tempfile
from pathlib import Path

import pytest

from opscope.debugger.app import DebuggerApp
from opscope.debugger.screens import AdvisorScreen, HelpScreen
from opscope.debugger.controller import Controller, Failed, Finished, Stop
from opscope.runtime import open_session

from debugger_models import LOW_PRECISION_TOML, NUMERICS, PLANTED_NAN, RAISES, write

SIZE = (150, 45)


async def until(pilot, app, pred, tries=400):
    """Wait (in the app's loop) until the controller's last event satisfies `pred`."""
    for _ in range(tries):
        await pilot.pause(0.02)
        if app.last_event is not None and pred(app.last_event):
            await pilot.pause()
            return app.last_event
    raise AssertionError(f"the debugger never reached the expected state; last event: {app.last_event!r}")


def keys(text):
    return [{" ": "space", ">": "greater_than_sign"}.get(c, c) for c in text]


def at(seq):
    return lambda ev: isinstance(ev, Stop) and ev.seq == seq


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
        ev = await until(pilot, app, lambda e: isinstance(e, Stop) and e.reason.startswith("first"))
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


def test_snapshot_failed(snap_compare):
    # a fixed folder: the model's path is on the screen (title, source line)
    folder = Path(tempfile.gettempdir()) / "opscope-debugger-snapshots"
    folder.mkdir(exist_ok=True)
    s = open_session(write(folder, "raises.py", RAISES) + ":factory", "sim:npu-a1")

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
