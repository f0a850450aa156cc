"""Names from files, traces and models print as written, in every CLI command and every TUI panel.

Regression (issue 24): a backend description named `x[/]y`, an alert rule id `x[/]y`, an ONNX Runtime
provider `Evil[/]Provider` and a breakpoint pattern `[/]` each ended the command (or the TUI) in a
Rich MarkupError; `[bold]` in a name restyled the line and vanished. Every name now goes through one
helper (app/cli/common.say for the console, debugger/view.say for Textual) and table cells are Text.
One store is built once for the module (a profiled hostile model, an imported ORT profile, an imported
torch.profiler trace) and every command reads it.
"""
import contextlib
import io
import json
import os
import sys
import textwrap

import pytest

from opscope.app.cli import main

sys.path.insert(0, os.path.dirname(__file__))
from test_trace_import import ORT_PROFILE, _ort_node  # noqa: E402  -- the ORT profile shape, one place

DESC = "ev[/]il[bold]npu[link=https://e.x]k["     # a description's name
SUMMARY = "sum[/]mary [bold]x"
MODULE = "[/]evil[bold]"                          # module attribute names (no '.': torch refuses it)
OUTER = "[link=file:///x]blk["
KIND = "[/]Evil[bold]Linear"                       # a module's class name
PROVIDER = "Evil[/]Provider"
ORT_NODE = "/[bold]fc1[/]/Gemm"
TORCH_OP = "aten::[/]evil[bold]"
TORCH_MODULE = "[/]mod[bold]"
RULE = "x[/]y[bold]"

MODEL = '''
import torch

Evil = type({kind!r}, (torch.nn.Linear,), {{}})     # a class whose name is hostile too


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module({module!r}, Evil(8, 8))
        self.add_module("gel[u]", torch.nn.GELU())

    def forward(self, x):
        return getattr(self, "gel[u]")(getattr(self, {module!r})(x)).mean()    # a scalar: train takes it


def factory():
    torch.manual_seed(0)
    m = torch.nn.Sequential()
    m.add_module({outer!r}, Block())
    return m.eval(), (torch.randn(2, 8),)
'''


def opscope(*argv):
    """The CLI in this process (torch imported once for the module): -> (exit code, stdout + stderr).
    The console is wide, so that no table wraps a name over two lines."""
    from opscope.app.cli.common import console
    out, err = io.StringIO(), io.StringIO()
    width, console.width = console.width, 1000
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as e:
            main([str(a) for a in argv])
    finally:
        console.width = width
    return e.value.code, out.getvalue() + err.getvalue()


def _ort_profile(path):
    events, t = list(ORT_PROFILE), 3000
    for _ in range(2):
        start = t
        for name, op, dur in [(ORT_NODE, "Gemm", 40), ("/act/Gelu", "Gelu", 12)]:
            events += _ort_node(t, name, op, dur, provider=PROVIDER)
            t += dur + 5
        events.append({"cat": "Session", "pid": 4242, "tid": 4242, "dur": t - start, "ts": start, "ph": "X",
                       "name": "SequentialExecutor::Execute", "args": {}})
        t += 100
    path.write_text(json.dumps(events))


def _torch_trace(path):
    """A real torch.profiler trace (a record_function per step), its op and module names made hostile."""
    import torch
    m = torch.nn.Sequential()
    m.add_module("blk", torch.nn.Linear(8, 8))
    x = torch.randn(2, 8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                with_stack=True, with_modules=True) as prof:
        for _ in range(2):
            with torch.profiler.record_function("[/]evil[bold]"):
                m(x).relu()
    raw = path.with_suffix(".raw.json")
    prof.export_chrome_trace(str(raw))
    doc = json.loads(raw.read_text())
    for e in doc["traceEvents"]:
        name = e.get("name")
        if name == "aten::relu":
            e["name"] = TORCH_OP
        elif isinstance(name, str) and name.startswith("nn.Module: "):
            e["name"] = name.replace("nn.Module: ", "nn.Module: " + TORCH_MODULE)
    path.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    home = root / "home"
    (home / "backends").mkdir(parents=True)
    from opscope.runtime.descriptions import __file__ as bundled
    toml = open(os.path.join(os.path.dirname(bundled), "npu-a1.toml")).read()
    toml = toml.replace('name = "npu-a1"', f"name = {json.dumps(DESC)}")
    toml = "\n".join(f"summary = {json.dumps(SUMMARY)}" if line.startswith("summary =") else line
                     for line in toml.splitlines())
    (home / "backends" / "hostile.toml").write_text(toml)
    folder = root / "m[bold]x["                   # the model's path, its run label, says `[bold]m[/]odel`
    folder.mkdir()
    (folder / "]odel.py").write_text(MODEL.format(kind=KIND, module=MODULE, outer=OUTER))
    (root / "rules.toml").write_text(textwrap.dedent(f'''\
        [[alert]]
        id = {json.dumps(RULE)}
        metric = "utilization"
        condition = "value >= 0"
        severity = "info"
        message = "{{device.name}} [/] at {{value:.0%}}"
        '''))
    ort = root / "ort[bold].json"
    _ort_profile(ort)
    trace = root / "torch[bold].json"
    _torch_trace(trace)
    w = {"root": root, "home": home, "model": f"{folder}/]odel.py:factory", "ort": ort, "trace": trace}
    old = os.environ.get("OPSCOPE_HOME")
    os.environ["OPSCOPE_HOME"] = str(home)
    try:       # what these print is checked with the other commands (PRINTED): each runs once
        w["printed"] = {"profile": opscope("profile", w["model"], "-b", "sim:hostile", "--steps", "1"),
                        "trace import": opscope("trace", "import", ort)}
        w["ort_run"] = w["printed"]["trace import"][1].split()[0]
        code, out = opscope("runs", "--json")
        w["run"] = next(r["run_id"] for r in json.loads(out)["runs"] if r["model"] == w["model"])
        code, out = opscope("trace", "import", trace, "--json")
        assert code == 0, out
        w["torch_run"] = json.loads(out)["run_id"]
    finally:
        os.environ.pop("OPSCOPE_HOME") if old is None else os.environ.__setitem__("OPSCOPE_HOME", old)
    return w


MODULE_PATH = f"{OUTER}.{MODULE}"
SPEC = "]odel.py:factory"

# command (with {model}, {run}, {ort_run}, {torch_run}, {ort}, {rules} filled in) -> what it must print as written
COMMANDS = {
    "backends": (["backends"], [SUMMARY]),
    "backend check": (["backend", "check", "sim:hostile", "--ops", "linear"], [DESC]),
    "ops": (["ops", "-b", "sim:hostile"], [DESC]),
    "run": (["run", "{model}", "-b", "sim:hostile"], [SPEC, DESC]),
    "profile": (None, [SPEC, DESC]),              # None: printed while the module's store was made
    "runs": (["runs"], [SPEC, DESC, PROVIDER]),
    "show by module": (["show", "{run}", "--by", "module"], [SPEC, DESC, MODULE_PATH]),
    "show ort": (["show", "{ort_run}", "--by", "node"], [PROVIDER, ORT_NODE]),
    "show torch": (["show", "{torch_run}"], [TORCH_OP]),
    "show torch modules": (["show", "{torch_run}", "--by", "module"], [TORCH_MODULE]),
    "compare": (["compare", "{run}", "{ort_run}"], [SPEC, DESC, PROVIDER]),
    "trace import": (None, ["ort[bold].json"]),
    "advise": (["advise", "{run}"], [SPEC, DESC]),
    "advise ort": (["advise", "{ort_run}"], [PROVIDER]),
    "advise torch": (["advise", "{torch_run}"], ["torch[bold].json"]),
    "monitor": (["monitor", "--rules", "{rules}", "--device", "sim:hostile", "--duration", "0", "--interval",
                 "0.01"], [RULE, f"{DESC} [/] at"]),
    "diff": (["diff", "{model}", "-b", "sim:hostile", "--reference", "numpy", "--all"], [SPEC, DESC, MODULE_PATH]),
    "optimize": (["optimize", "{model}", "-b", "sim:hostile", "--cycles", "1", "--steps", "1", "-o",
                  "{root}/x.opsplan"], [SPEC, DESC]),
    "simulate": (["simulate", "{model}", "--hybrid", "sim:hostile=1", "--ranks", "8"], [SPEC]),   # shares name the spec
    "tune": (["tune", "{model}", "-b", "sim:hostile", "--budget", "2"], [SPEC, DESC]),
    "train": (["train", "{model}", "-b", "sim:hostile", "--steps", "1"], [SPEC, DESC, MODULE_PATH]),
    "compile": (["compile", "{model}", "-b", "sim:hostile", "-o", "{root}/c.opsplan"], [SPEC, DESC]),
    "migrate check": (["migrate", "check", "{model}", "-b", "sim:hostile"], [SPEC]),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_hostile_names_print_as_written(command, world, monkeypatch):
    monkeypatch.setenv("OPSCOPE_HOME", str(world["home"]))
    argv, literal = COMMANDS[command]
    fill = {**world, "rules": world["root"] / "rules.toml"}
    code, out = world["printed"][command] if argv is None else opscope(*(a.format(**fill) for a in argv))
    assert code == 0, out
    assert "MarkupError" not in out
    for text in literal:
        assert text in out, f"{text!r} not printed as written by `opscope {command}`:\n{out}"


def test_say_fills_fields_without_parsing_them():
    """The helper itself: specs and conversions as str.format, the template's styles kept around a name."""
    from opscope.app.cli.common import say
    for name in ["[/]", "[bold]x", "a\\", "\\[b]", "[link=https://e.x]y[/link]", ":smile:", "{}"]:
        t = say("[bold]{}[/] on [red]{x}[/] {n:.2f} {r!r}", name, x=name, n=1.234, r=name)
        assert t.plain == f"{name} on {name} 1.23 {name!r}"
        assert {str(s.style) for s in t.spans} == {"bold", "red"}


# --- the TUI ----------------------------------------------------------------------------------------

NODE = "[/]lin[bold]"           # node names arrive from plan files and imported graphs as they were written


def _keys(text):
    names = {"[": "left_square_bracket", "]": "right_square_bracket", "/": "slash", " ": "space",
             ">": "greater_than_sign", ".": "full_stop", "_": "underscore"}
    return [names.get(c, c) for c in text]


def _log(app) -> list[str]:
    return [strip.text for strip in app.query_one("#log").lines]


def _plain(title) -> str:
    from textual.content import Content
    return Content.from_markup(title).plain      # a widget hands its border title back as markup


@pytest.fixture
def hostile_session(world, monkeypatch):
    from opscope.runtime import open_session
    monkeypatch.setenv("OPSCOPE_HOME", str(world["home"]))
    s = open_session(world["model"], "sim:hostile")
    s.graph.nodes[0].name = NODE
    return s


async def test_hostile_names_render_as_written_in_every_panel(hostile_session):
    from debugger_models import until
    from opscope.debugger.app import DebuggerApp
    from opscope.debugger.controller import Controller, Stop
    from opscope.debugger.screens import AdvisorScreen, ReportScreen

    import shutil
    folder = hostile_session.spec.split("]odel.py")[0]
    reference = shutil.copy(os.path.join(os.environ["OPSCOPE_HOME"], "backends", "hostile.toml"), folder + "]ef.toml")
    assert "[bold]x[/]ef.toml" in reference                  # a path a reference is named by
    app = DebuggerApp(Controller(hostile_session, reference=reference), model=hostile_session.spec)
    async with app.run_test(size=(150, 45)) as pilot:
        await until(pilot, app, lambda ev: isinstance(ev, Stop) and ev.seq == 0)
        op = str(app.query_one("#op").render())
        for text in (NODE, MODULE_PATH, KIND, DESC):
            assert text in op, f"{text!r} not in the op panel:\n{op}"
        labels = []
        stack = [app.query_one("#graph").root]
        while stack:
            node = stack.pop()
            labels.append(node.label.plain)
            stack += node.children
        assert SPEC in labels[0] and {OUTER, MODULE, "gel[u]"} <= set(labels) and any(NODE in x for x in labels)
        assert SPEC in app.sub_title and DESC in app.sub_title
        assert "[0].std()" in str(app.query_one("#watches").render())

        # a breakpoint pattern typed in the prompt: its row, its log lines, its warning, as written
        await pilot.press("a", *_keys("[/]"), "enter")
        await pilot.pause()
        shown = [bp.describe() for bp in app.ctl.breakpoints]      # after the lockstep's tolerance stop
        assert "at [/]" in shown
        assert str(app.query_one("#breakpoints").get_row_at(shown.index("at [/]"))[1]) == "at [/]"
        assert "breakpoint added: [/]" in _log(app) and any("'[/]' matches no op" in x for x in _log(app))

        # a bad one: one line in the log, nothing added, the debugger goes on
        before = len(_log(app))
        await pilot.press("a", *_keys("max_abs >> [/]"), "enter")
        await pilot.pause()
        said = " ".join(" ".join(_log(app)[before:]).split())      # the log wraps a long line
        assert said.startswith("breakpoint 'max_abs >> [/]': ") and said.count("max_abs >> [/]") == 2
        assert len(app.ctl.breakpoints) == len(shown)
        await pilot.press("w", *_keys("[/]"), "enter")             # a watch that does not parse: the same
        await pilot.pause()
        assert "[/]" in _log(app)[-1] and not len(app.ctl.watches)

        await pilot.press("n")
        await until(pilot, app, lambda ev: isinstance(ev, Stop) and ev.seq == 1)
        assert MODULE_PATH.replace(MODULE, "gel[u]") in str(app.query_one("#op").render())
        assert _plain(app.query_one("#values-box").border_title).startswith("values: ")

        await pilot.press("R")
        await pilot.pause()
        assert isinstance(app.screen, ReportScreen)
        box = app.screen.query_one("#report-box")
        assert reference in _plain(box.border_title)
        assert NODE[:24] in str(app.screen.query_one("#report").render())
        await pilot.press("escape")
        await pilot.press("A")
        for _ in range(300):
            await pilot.pause(0.02)
            if isinstance(app.screen, AdvisorScreen) and (app.screen.result or app.screen.error):
                break
        assert isinstance(app.screen, AdvisorScreen) and app.screen.error is None
        await pilot.press("escape")
        assert "MarkupError" not in " ".join(_log(app))
