"""Text from an artifact never drives the terminal (issue 33, point 4).

A run's model and backend fields, a trace's provider and node names, a file's name and a rank's error text come
from files anyone can write. Before this fix `trace import`, `runs` and `show` printed ESC[2J (clear the screen)
and OSC 0 (set the window title) from them as raw bytes, and an error text "\\n\\x1b[31m..." printed as a second,
red line. Every such text now goes through runtime.errors.terminal_text: one line, control characters escaped.
"""
import json
import os
import sys

import pytest

from opscope.runtime.errors import terminal_text

sys.path.insert(0, os.path.dirname(__file__))
from test_trace_import import ORT_PROFILE, _ort_node  # noqa: E402  -- the ORT profile shape, one place

CLEAR = "\x1b[2J"
TITLE = "\x1b]0;pwned\x07"                       # OSC 0: the window title
FORGED = "\n\x1b[31mopscope: all good"           # a second, red line
MODEL = f"m{CLEAR}odel{TITLE}"
BACKEND = f"back{FORGED}end"
PROVIDER = f"Evil{CLEAR}Provider{TITLE}"
NODE = f"/fc1{FORGED}/Gemm"


def test_terminal_text_escapes_every_control_character_on_one_line():
    assert terminal_text(f"a{CLEAR}b") == "a\\x1b[2Jb"
    assert terminal_text(TITLE) == "\\x1b]0;pwned\\x07"
    assert terminal_text("x\ny\r\tz") == "x\\ny\\r\\tz"
    assert terminal_text("\x00\x7f\x9b\x85") == "\\x00\\x7f\\x9b\\x85"          # NUL, DEL, C1 CSI, C1 NEL
    assert terminal_text("a\u202eb\u2066c\u2028d") == "a\\u202eb\\u2066c\\u2028d"   # bidi override, isolate, LS
    plain = "ünïcode 名前 [bold] x[/]y a\\b ✖"
    assert terminal_text(plain) == plain                      # printable text, markup and backslashes as written
    assert terminal_text(12) == "12"
    every = "".join(map(chr, range(0x20))) + "\x7f" + "".join(map(chr, range(0x80, 0xa0)))
    safe = terminal_text(every)
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 for c in safe)


def _ort_profile(path):
    events, t = list(ORT_PROFILE), 3000
    for _ in range(2):
        start = t
        for name, op, dur in [(NODE, "Gemm", 40), ("/act/Gelu", "Gelu", 12)]:
            events += _ort_node(t, name, op, dur, provider=PROVIDER)
            t += dur + 5
        events.append({"cat": "Session", "pid": 4242, "tid": 4242, "dur": t - start, "ts": start, "ph": "X",
                       "name": "SequentialExecutor::Execute", "args": {}})
        t += 100
    path.write_text(json.dumps(events))


def _raw_control(text: str) -> list[str]:
    return sorted({repr(c) for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) < 0xa0})


def test_runs_show_and_trace_import_print_no_control_character_from_a_run(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")       # wide enough that no table cell wraps the escaped text we look for
    trace = tmp_path / f"ort{CLEAR}{TITLE}.json"          # the file's name is the imported run's model
    _ort_profile(trace)
    r = cli("trace", "import", trace)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout + r.stderr and "\\x1b[2J" in r.stderr, r.stderr
    run_id = r.stdout.split()[0]
    from opscope.profiler.store import RunStore
    store = RunStore()
    store.update_run(run_id, model=MODEL, backend=BACKEND)
    failed = store.create_run(model=MODEL, backend=BACKEND)
    store.finish_run(failed, "failed", error=f"rank 1 raised ValueError: boom{FORGED}")
    for argv in (["runs"], ["show", run_id], ["show", run_id, "--by", "node"], ["show", failed],
                 ["compare", run_id, run_id]):
        r = cli(*argv)
        assert r.returncode == 0, r.stderr
        out = r.stdout + r.stderr
        assert _raw_control(out) == [], f"`opscope {' '.join(argv)}` printed raw control characters:\n{out!r}"
        assert "\\x1b[2J" in out or "\\n\\x1b[31m" in out, out    # the text is there, escaped
    r = cli("show", failed)
    line = next(ln for ln in r.stdout.splitlines() if "boom" in ln)
    assert line.endswith("boom\\n\\x1b[31mopscope: all good")                # one line, shown as it was
    r = cli("show", run_id, "--by", "node")
    assert "/fc1\\n\\x1b[31mopscope: all good/Gemm" in r.stdout


RANK_MODEL = '''
import os
import torch


def factory():
    if os.environ.get("RANK") == "1":
        raise ValueError("boom\\x1b[2J\\x1b]0;pwned\\x07 \\x1b[31mopscope: all good")
    return torch.nn.Linear(4, 1), (torch.randn(2, 4),)
'''


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_ranks_error_text_prints_escaped_on_one_line(cli, tmp_path):
    """train --hybrid: rank 1's error text reaches the report line and the error line as written, escaped."""
    (tmp_path / "ranks.py").write_text(RANK_MODEL)
    r = cli("train", f"{tmp_path / 'ranks.py'}:factory", "--hybrid", "numpy=0.5,torch:cpu=0.5", "--steps", "1")
    assert r.returncode == 1, r.stderr
    out = r.stdout + r.stderr
    assert _raw_control(out) == [], out
    [line] = [ln for ln in r.stderr.splitlines() if ln.startswith("opscope: error:")]
    assert "boom\\x1b[2J\\x1b]0;pwned\\x07 \\x1b[31mopscope: all good" in line
    r = cli("runs")
    assert r.returncode == 0 and _raw_control(r.stdout + r.stderr) == []


def test_the_console_and_the_tui_helpers_escape_every_field_and_cell():
    """say() on the console and in the TUI, and table(): the ways a name reaches a terminal."""
    from opscope.app.cli.common import say, table
    from opscope.debugger.view import say as tui_say
    assert say("[bold]{}[/] on {}", MODEL, BACKEND).plain == f"{terminal_text(MODEL)} on {terminal_text(BACKEND)}"
    assert tui_say("op [b]$name[/b]", name=NODE).plain == f"op {terminal_text(NODE)}"
    t = table(f"runs of {MODEL}", ["run", BACKEND], [[MODEL, PROVIDER]])
    cells = [t.title.plain, *(c.header.plain for c in t.columns), *(str(x) for c in t.columns for x in c._cells)]
    assert all("\x1b" not in c and "\n" not in c for c in cells), cells
