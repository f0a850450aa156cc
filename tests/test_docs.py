"""The manual (docs/, mkdocs.yml) builds with `mkdocs build --strict`, as CI builds it: a broken link, a
missing page, a page left out of the nav or an API reference that names nothing fails the build."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_mkdocs_build_strict_passes(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    site = tmp_path / "site"
    for page in ("index.html", "getting-started/index.html", "security/index.html", "benchmarks/index.html",
                 "status/index.html", "describe-a-chip/index.html", "adding-a-stack/index.html",
                 "architecture/index.html", "commands/profile/index.html"):
        assert (site / page).is_file(), page
    api = (site / "python-api" / "index.html").read_text()
    assert "Capture a model and place it on a backend" in api     # open_session's docstring, via mkdocstrings


def test_every_docs_page_is_in_the_nav():
    """A page on disk that no one can reach from the menu is a page lost (mkdocs only warns about it)."""
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    assert pages and all(p in nav for p in pages), [p for p in pages if p not in nav]


def _command_lines() -> list[tuple[str, str]]:
    """Every `opscope ...` command in a ```bash block of README.md and docs/ (one per line, `&&` and `;` split),
    with the page it is on."""
    import re
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M):
            for line in block.replace("\\\n", " ").splitlines():
                for part in re.split(r"&&|;", line.split(" #")[0]):
                    if part.strip().startswith("opscope "):
                        found.append((page.relative_to(ROOT).as_posix(), part.strip()))
    return found


@pytest.mark.slow
def test_every_command_in_the_manual_parses():
    """Each documented command line is accepted by opscope's own parser (in-process, no torch): a renamed flag,
    a dropped command or a misspelt choice in the manual fails here. The manual's shorthand is read as a user
    would: `[...]` is optional (left out), `a|b|c` is one of them (the first), `--diff | --write` likewise."""
    import re
    import shlex

    from opscope.app.cli import build_parser
    lines = _command_lines()
    assert len(lines) > 50
    refused = []
    for page, line in lines:
        text = re.sub(r"\s\[[^\]]*\]", "", line).replace(" | ", "|")
        argv = [word.split("|")[0] for word in shlex.split(text)][1:]
        try:
            build_parser(argv).parse_args(argv)
        except SystemExit as e:
            if e.code:
                refused.append(f"{page}: {line}")
    assert not refused, "\n".join(refused)
