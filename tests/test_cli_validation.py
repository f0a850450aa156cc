"""Bad values are refused before torch is imported, misspellings get a suggestion and the command's own --help,
and every parser's --help ends with examples (issue 34)."""
import argparse
import contextlib
import io
import json
import subprocess
import sys

import pytest

from opscope.app.cli import COMMANDS, build_parser

# argv -> what the one line must say. Each is refused by argparse or by the command's precheck, before torch.
BAD_VALUES = [
    (["train", "demo:mlp", "--optimizer", "adam"], "unknown optimizer 'adam'"),
    (["profile", "demo:mlp", "--steps", "0"], "--steps"),
    (["profile", "demo:mlp", "--warmup", "-1"], "--warmup"),
    (["run", "demo:mlp", "-b", "missing.toml"], "missing.toml does not exist"),
    (["run", "demo:mlp", "--repeat", "0"], "--repeat"),
    (["run", "demo:gtp"], "did you mean demo:gpt?"),
    (["run", "no/such/model.py:factory"], "no/such/model.py does not exist"),
    (["train", "demo:mlp", "--backend", "nmupy"], "did you mean numpy?"),
    (["profile", "demo:mlp", "--backend", "sim:npu-a2"], "did you mean npu-a1?"),
    (["diff", "demo:mlp", "--reference", "nmupy"], "unknown backend 'nmupy'"),
    (["backend", "check", "sim:npu"], "unknown sim backend 'npu'"),
    (["debug", "demo:mlp", "-b", "missing.toml"], "missing.toml does not exist"),
    (["compile", "demo:mlp", "-b", "missing.toml", "-o", "x.opsplan"], "missing.toml does not exist"),
    # every subcommand's checked values (issue 34's leftovers: each was refused only after torch or DuckDB)
    (["trace", "export", "RUN", "--format", "badfmt"], "invalid choice: 'badfmt'"),
    (["trace", "export", "RUN", "--format", "perfetto", "-o", "x.json"], "the name says chrome"),
    (["trace", "import", "missing.json"], "missing.json: the file does not exist"),
    (["profile", "--", "python", "missing.py"], "script missing.py does not exist"),
    (["profile", "--steps", "3", "--", "python", "missing.py"], "a script decides its own steps"),
    (["profile", "demo:mlp", "--engine", "native"], "--engine native records a script"),
    (["profile", "demo:mlp", "--train", "--lr", "-1"], "--lr: -1: give a number above 0"),
    (["profile", "demo:mlp", "--web", "--port", "99999"], "--port: 99999: give a whole number 0 to 65535"),
    (["train", "demo:mlp", "--lr", "0"], "--lr: 0: give a number above 0"),
    (["train", "demo:mlp", "--hybrid", "nmupy=0.5,numpy=0.5"], "unknown backend 'nmupy'"),
    (["run", "demo:mlp", "--fallback", "numpy,nmupy"], "unknown backend 'nmupy'"),
    (["run", "demo:mlp", "--plan", "missing.opsplan"], "plan missing.opsplan does not exist"),
    (["run", "demo:mlp", "--plan", "x.opsplan", "--capture", "dynamo"], "cannot be used with --capture dynamo"),
    (["runs", "--limit", "-1"], "--limit: -1: give 0 or more"),
    (["runs", "rm", "--older-than", "soon"], "give an age such as"),
    (["runs", "rm", "--keep", "-1"], "--keep: -1: give 0 or more"),
    (["show", "RUN", "--top", "-1"], "--top: -1: give 0 or more"),
    (["compare", "A", "B", "--top", "-1"], "--top: -1: give 0 or more"),
    (["sql", "RUN", "SELECT 1", "--max-rows", "0"], "give a whole number 1 to 1000000"),
    (["sql", "RUN", "SELECT 1", "--timeout", "nan"], "give a number above 0 and at most 600 seconds"),
    (["monitor", "--interval", "0"], "--interval: 0: give a number above 0 and at most 86400 seconds"),
    (["monitor", "--sim-load", "2"], "--sim-load: 2: give a number 0 to 1"),
    (["monitor", "--duration", "-1"], "--duration: -1: give a number 0 or more seconds"),
    (["monitor", "--interval", "1e10"], "--interval: 1e10: give a number above 0 and at most 86400 seconds"),
    (["monitor", "--metrics-port", "70000"], "give a whole number 0 to 65535"),
    (["simulate", "demo:gpt", "--ranks", "0"], "--ranks: 0: give 1 or more"),
    (["simulate", "demo:gpt", "--bucket-mb", "0"], "--bucket-mb: 0: give a number above 0 MB"),
    (["simulate", "demo:gpt", "--bandwidth", "0"], "--bandwidth: 0: give a number above 0 bytes/s"),
    (["simulate", "demo:gpt", "--hybrid", "sim:nope=1"], "unknown sim backend"),
    (["simulate", "demo:gtp"], "did you mean demo:gpt?"),
    (["tune", "demo:mlp", "--budget", "0"], "--budget: 0: give 1 or more"),
    (["debug", "demo:mlp", "--tolerance", "-1"], "--tolerance: -1: give a number above 0"),
    (["debug", "demo:mlp", "--train", "--lr", "-1"], "--lr: -1: give a number above 0"),
    (["debug", "demo:mlp", "--history-mb", "nan"], "--history-mb: nan: give a number 0 to 1000000000 MB"),
    (["debug", "demo:mlp", "--history-mb", "1e308"], "--history-mb: 1e308: give a number 0 to 1000000000 MB"),
    (["debug", "demo:mlp", "--debugpy", "70000"], "--debugpy: 70000: give a whole number 0 to 65535"),
    (["diff", "demo:mlp", "--tolerance", "-1"], "--tolerance: -1: give a number above 0"),
    (["serve", "--port", "70000"], "--port: 70000: give a whole number 0 to 65535"),
    (["migrate", "scan", ".", "--fail-under", "101"], "--fail-under: 101: give a number 0 to 100"),
    (["optimize", "demo:mlp", "--suite", "missing.txt"], "suite file missing.txt does not exist"),
    (["backend", "check", "numpy", "--timeout", "0"], "--timeout: 0: give a number above 0"),
    (["ops", "--backend", "nmupy"], "unknown backend 'nmupy'"),
]

# every case in one interpreter: main() in-process, and after each whether torch has been imported
PROBE = """
import contextlib, io, json, sys
from opscope.app import cli
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main(argv)
        except SystemExit as e:
            code = e.code
    out.append([code, err.getvalue(), [m for m in ("torch", "duckdb") if m in sys.modules]])
print(json.dumps(out))
"""


@pytest.mark.multiprocess
def test_a_bad_value_is_refused_before_torch_or_duckdb_is_imported(tmp_path):
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps([argv for argv, _ in BAD_VALUES])],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**__import__("os").environ, "OPSCOPE_HOME": str(tmp_path / "home")})
    assert r.returncode == 0, r.stderr
    for (argv, says), (code, err, heavy) in zip(BAD_VALUES, json.loads(r.stdout)):
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, err)
        assert says in err, (argv, err)
        assert not heavy, f"`opscope {' '.join(argv)}` imported {heavy} before refusing: {err}"


def _error(argv) -> str:
    """The one line main() prints for `argv` (it must exit 2)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as e:
        from opscope.app.cli import main
        main(argv)
    assert e.value.code == 2, err.getvalue()
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert len(lines) == 1, err.getvalue()
    return lines[0]


@pytest.mark.parametrize("argv, suggestion, help_of", [
    (["run", "demo:mlp", "--backedn", "numpy"], "did you mean --backend?", "opscope run --help"),
    (["profile", "demo:mlp", "--setps=3"], "did you mean --steps?", "opscope profile --help"),
    (["rn", "demo:mlp"], "did you mean run?", "opscope --help"),
    (["migrate", "scna", "."], "did you mean scan?", "opscope migrate --help"),
    (["trace", "export", "RUN", "--fromat", "csv"], "did you mean --format?", "opscope trace export --help"),
    (["profile", "demo:mlp", "--engine", "graf"], "did you mean graph?", "opscope profile --help"),
])
def test_a_misspelling_gets_a_suggestion_and_the_commands_own_help(argv, suggestion, help_of):
    line = _error(argv)
    assert suggestion in line and f"(see `{help_of}`)" in line, line


def test_nothing_close_gets_no_suggestion():
    line = _error(["run", "demo:mlp", "--zzzzzz"])
    assert "did you mean" not in line and "(see `opscope run --help`)" in line, line


def _parsers(parser, path=()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def test_every_parser_and_subparser_has_examples():
    seen = set()
    for command in [None, *COMMANDS]:
        top = build_parser([command] if command else [])
        for path, parser in _parsers(top):
            if (path[:1] != (command,)) if command else path:
                continue        # the top parser, and the other commands' placeholders: walked with their own argv
            help_text = parser.format_help()
            assert "examples:" in help_text.lower(), f"`opscope {' '.join(path)} --help` has no examples"
            seen.add(path)
    # the verbs the issue names are among them
    for verbs in [("backend", "check"), ("trace", "export"), ("trace", "import"), ("migrate", "scan"),
                  ("migrate", "apply"), ("migrate", "check"), ("compile",), ("optimize",), ("simulate",),
                  ("monitor",)]:
        assert verbs in seen, verbs


def _typed_options():
    """(argv to the parser, flag) for every option of every command and verb that converts its value (a count, a
    number, a port, a choice): walked, not picked, so an option added tomorrow is covered too."""
    for command in COMMANDS:
        for path, parser in _parsers(build_parser([command])):
            if path[:1] != (command,):
                continue
            for action in parser._actions:
                if action.option_strings and action.type is not None and action.nargs != 0:
                    yield list(path), action.option_strings[0]


TYPED = list(_typed_options())
# refused later, by design: show --step -1 gets the run's own range ("recorded 5 step(s), numbered 0 to 4") once the
# run is read (test_cli_contract.py)
LATER = {(("show",), "--step", "-1")}


@pytest.mark.parametrize("bad", ["nan", "-1", "x"])
def test_every_typed_option_of_every_parser_refuses_a_bad_value_while_parsing(bad):
    """NaN passes float() and fails every comparison, -1 passes int(): each must be refused by the option's type, in
    one line that names the option, before any command (or torch) runs."""
    assert len(TYPED) > 40, TYPED          # the walk found the parsers (a broken walk would pass vacuously)
    accepted = []
    for path, flag in TYPED:
        if (tuple(path), flag, bad) in LATER:
            continue
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                build_parser(path).parse_args([*path, f"{flag}={bad}"])
            except SystemExit as e:
                if e.code == 2 and flag in err.getvalue() and "Traceback" not in err.getvalue():
                    continue
        accepted.append(f"opscope {' '.join(path)} {flag} {bad}: {err.getvalue().strip()!r}")
    assert not accepted, "\n".join(accepted)
