"""The manual's Python examples run as written: every ```python block of README.md and of docs/*.md, each in
a fresh interpreter. A fragment that is not meant to run on its own is fenced ```py instead (it is
highlighted the same)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
API_PAGE = ROOT / "docs" / "python-api.md"
ENTRY_POINTS = ("open_session", "hooked", "HybridStrategy", "@operator", "profile(", 'backend="opscope"')


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M)


BLOCKS = [(page, block) for page in PAGES for block in python_blocks(page)]


def test_the_python_api_page_shows_every_entry_point():
    blocks = python_blocks(API_PAGE)
    assert len(blocks) >= len(ENTRY_POINTS)
    for name in ENTRY_POINTS:
        assert any(name in b for b in blocks), f"docs/python-api.md has no example of {name}"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("page,block", BLOCKS,
                         ids=[f"{page.relative_to(ROOT)}-{i}" for i, (page, _) in enumerate(BLOCKS)])
def test_manual_python_example_runs(page, block, tmp_path):
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, f"{page.relative_to(ROOT)} example failed:\n{block}\n{r.stderr[-3000:]}"
    assert r.stdout.strip(), "every example prints what it shows"
    assert "False" not in r.stdout.split()          # the torch.compile example prints its check
