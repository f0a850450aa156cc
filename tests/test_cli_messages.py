"""Every message that names a command or a document names one that exists (issue 17).

The string literals of app/, profiler/, runtime/ and debugger/ are read with `ast` (f-strings with
their {fields} as placeholders); each backticked `opscope ...` is parsed by the real parser, and each
"see X.md" must be a file in the repository. The --help examples (app/cli EXAMPLES) are checked too.
"""
import argparse
import ast
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from opscope.app.cli import EXAMPLES, build_parser

ROOT = Path(__file__).resolve().parents[1]
CODE = ("app", "profiler", "runtime", "debugger")
COMMAND = re.compile(r"`(opscope(?: [^`]*)?)`")
DOCUMENT = re.compile(r"\b(?:see|in|read|per)\s+`?([\w./-]+\.md)\b", re.I)
PLACEHOLDER = "x"


def _strings(tree):
    """(text, line) of every string literal; an f-string's fields read as PLACEHOLDER."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                inside.add(id(v))
                parts.append(v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else PLACEHOLDER)
            yield "".join(parts), node.lineno
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside:
            yield node.value, node.lineno


def _messages():
    found = []
    for folder in CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = path.read_text()
            # both patterns need their text in the source as written: a file with neither is not parsed
            # (parsing all ~290 files cost each xdist worker ~2 s of its collection)
            if "`opscope" not in source and ".md" not in source:
                continue
            tree = ast.parse(source, filename=str(path))
            for text, line in _strings(tree):
                where = f"{path.relative_to(ROOT)}:{line}"
                found += [("command", m, where) for m in COMMAND.findall(text)]
                found += [("document", m, where) for m in DOCUMENT.findall(text)]
    return found


MESSAGES = _messages()


def _argv(command: str) -> list[str] | None:
    """The argv a concrete command names; None for a synopsis ([OPTIONS], A|B, ...): only its name is checked."""
    words = command.split(None, 1)[1] if " " in command else ""
    if any(c in words for c in "[]|<>{}") or "..." in words:
        return None
    try:
        argv = shlex.split(words)
    except ValueError:
        return None
    # RUN, MODEL, FILE, B: placeholders a reader replaces (N, a count, by a number)
    return ["1" if a == "N" else PLACEHOLDER if re.fullmatch(r"[A-Z][A-Z_]*", a) else a for a in argv]


def _parse(argv: list[str]) -> str | None:
    """None if the real parser takes `argv` (missing required arguments aside), else its message."""
    err = io.StringIO()
    parser = build_parser(argv)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as e:
        text = err.getvalue().strip()
        # a message may name a command without its operands, or a flag without its value
        if e.code in (0, None) or "the following arguments are required" in text or \
                (argv and argv[-1].startswith("--") and "expected one argument" in text):
            return None
        return text or f"exit {e.code}"
    return None


def _command_names(argv: list[str]) -> list[str]:
    """The command (and verb) words of a synopsis: the words before the first option or placeholder."""
    names = []
    for a in argv:
        if a.startswith("-") or not re.fullmatch(r"[a-z][a-z-]*", a):
            break
        names.append(a)
    return names


def test_the_scan_finds_the_messages_it_is_meant_to_check():
    # a regex that silently matched nothing would make the tests below pass for nothing
    kinds = {k for k, _, _ in MESSAGES}
    assert kinds == {"command", "document"} or len([m for m in MESSAGES if m[0] == "command"]) > 30
    assert any(m == "opscope runs" for _, m, _ in MESSAGES)


@pytest.mark.parametrize("kind,text,where", [m for m in MESSAGES if m[0] == "command"],
                         ids=[f"{m[2]}:{m[1]}" for m in MESSAGES if m[0] == "command"])
def test_every_command_a_message_names_parses(kind, text, where):
    argv = _argv(text)
    if argv is None:                    # a synopsis: its command and verbs must exist
        words = text.split()[1:]
        argv = _command_names([w for w in words if not w.startswith("[")])
        argv = argv[:2]
    if text.strip() == "opscope COMMAND --help":
        return
    problem = _parse(argv + ["--help"] if not argv else argv)
    assert problem is None, f"{where}: `{text}` does not parse: {problem}"


@pytest.mark.parametrize("kind,text,where", [m for m in MESSAGES if m[0] == "document"],
                         ids=[f"{m[2]}:{m[1]}" for m in MESSAGES if m[0] == "document"])
def test_every_document_a_message_names_is_in_the_repository(kind, text, where):
    hits = [p for p in ROOT.rglob(Path(text).name) if ".venv" not in p.parts] if "/" not in text else \
        [ROOT / text] if (ROOT / text).is_file() else []
    assert hits, f"{where}: names {text}, which is not in the repository"


@pytest.mark.parametrize("command", sorted(EXAMPLES))
def test_help_examples_parse(command):
    for example in EXAMPLES[command]:
        argv = _argv(example)
        assert argv is not None, example
        assert _parse(argv) is None, f"`{example}` (in `opscope {command} --help`) does not parse"


def test_parse_catches_a_command_that_does_not_exist():
    assert _parse(["no-such-command"]) is not None
    assert _parse(["run", PLACEHOLDER, "--no-such-flag"]) is not None
    assert _parse(["show", PLACEHOLDER]) is None
