"""Save the debugger's screens as SVG (Textual) and PNG (cairosvg): screenshots/tui-*.png.

    python screenshots/make_tui_screenshots.py [NAME ...]     # all, or only tui-NAME.png

The sim backend keeps op times (roofline estimates) the same on every run.
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import cairosvg

from opscope.debugger.app import DebuggerApp
from opscope.debugger.controller import Controller, Failed, Finished, Stop
from opscope.debugger.pystack import open_debug_session as open_session
from opscope.debugger.train import open_train_session
from opscope.runtime.train import OptimizerSpec

HERE = Path(__file__).resolve().parent
SIZE = (160, 48)
MONO = "DejaVu Sans Mono"
sys.path.insert(0, str(HERE.parent / "tests"))
from debugger_models import LOW_SOFTMAX_TOML, PLANTED_NAN, RAISES, SOFTMAX, write  # noqa: E402
from test_debug_train import GRAD_NAN  # noqa: E402

ONLY = set(sys.argv[1:])


async def until(pilot, app, pred):
    for _ in range(2000):
        await pilot.pause(0.02)
        if app.last_event is not None and pred(app.last_event):
            await pilot.pause()
            return
    raise RuntimeError(f"never reached the state; last event {app.last_event!r}")


def save(app, name: str) -> None:
    svg = app.export_screenshot(title=f"opscope debug: {name}")
    (HERE / f"tui-{name}.svg").write_text(svg)
    # cairosvg has no Fira Code and its "monospace" fallback is proportional here: columns drift.
    # Name an installed monospace font for the PNG (the SVG keeps Textual's own choice).
    png_svg = svg.replace("Fira Code, monospace", f"{MONO}, monospace")
    cairosvg.svg2png(bytestring=png_svg.encode(), write_to=str(HERE / f"tui-{name}.png"))
    print(f"wrote screenshots/tui-{name}.png")


async def shoot(session, name, script, size=SIZE, **kw):
    if ONLY and name not in ONLY:
        return
    app = DebuggerApp(Controller(session, **kw), model=session.spec)
    async with app.run_test(size=size) as pilot:
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq == 0)
        await script(pilot, app)
        save(app, name)


async def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="opscope-shots-"))
    # a training step whose custom backward divides by zero: stopped at that backward op
    train = open_train_session(write(tmp, "grad_nan.py", GRAD_NAN) + ":factory", "sim:npu-a1",
                               OptimizerSpec("adamw", lr=1e-3))

    async def grad_nan(pilot, app):
        app.ctl.add_watch("np.linalg.norm(grad)")
        for _ in range(12):            # into the backward: the watch has a history of gradient norms
            await pilot.press("n")
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq == 12)
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.node.op == "div")
    await shoot(train, "train", grad_nan, reference="numpy", break_on_nan=True)
    if ONLY == {"train"}:
        return
    gpt = open_session("demo:gpt", "sim:npu-a1")

    async def attention(pilot, app):
        app.ctl.breakpoints.add("scaled_dot_product_attention")
        app.ctl.add_watch("out.std()")
        app.ctl.add_watch("np.abs(out).max()")
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.node.op == "scaled_dot_product_attention")
        await pilot.press("n")
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq > 13)
    await shoot(gpt, "step", attention, reference="numpy")

    async def help_screen(pilot, app):
        await pilot.press("question_mark")
        await pilot.pause(0.2)
    await shoot(gpt, "help", help_screen)

    async def advisor(pilot, app):
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Finished))
        await pilot.press("A")
        for _ in range(1000):
            await pilot.pause(0.02)
            if getattr(app.screen, "result", None) is not None:
                break
        await pilot.pause(0.2)
    await shoot(gpt, "advisor", advisor)

    nan = open_session(write(tmp, "planted.py", PLANTED_NAN) + ":factory", "sim:npu-a1")

    async def to_nan(pilot, app):
        await pilot.press("e")
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.reason == "NaN made here")
    await shoot(nan, "nan", to_nan)
    await shoot(nan, "80x24", to_nan, size=(80, 24), reference="numpy")

    # the accuracy report: a chip whose softmax runs in float16, against numpy
    soft = open_session(write(tmp, "attend.py", SOFTMAX) + ":factory",
                        write(tmp, "half-softmax.toml", LOW_SOFTMAX_TOML))

    async def report(pilot, app):
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq > 0)
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Finished))
        await pilot.press("R")
        await pilot.pause(0.2)
    await shoot(soft, "report", report, reference="numpy", tolerance=1e-5)

    async def look_back(pilot, app):
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq > 0)
        await pilot.press("n")
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.node.name == "linear_1")
        await pilot.press("p")                 # back to the softmax that introduced the error, as it was
        await pilot.pause(0.2)
    await shoot(soft, "history", look_back, reference="numpy", tolerance=1e-5)

    bad = open_session(write(tmp, "raises.py", RAISES) + ":factory", "sim:npu-a1")

    async def fail(pilot, app):
        await pilot.press("c")
        await until(pilot, app, lambda e: isinstance(e, Failed))
    await shoot(bad, "error", fail)


if __name__ == "__main__":
    asyncio.run(main())
