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
