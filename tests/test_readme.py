"""README's "Python API" section runs as written: each ```python block, in a fresh interpreter."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
ENTRY_POINTS = ("open_session", "hooked", "HybridStrategy", "@operator", "profile(", 'backend="opscope"')


def python_api_blocks() -> list[str]:
    text = README.read_text()
    start = text.index("\n## Python API")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end > 0 else None]
    return re.findall(r"```python\n(.*?)```", section, re.S)


BLOCKS = python_api_blocks()


def test_the_section_shows_every_entry_point():
    assert len(BLOCKS) >= len(ENTRY_POINTS)
    for name in ENTRY_POINTS:
        assert any(name in b for b in BLOCKS), f"README's Python API section has no example of {name}"


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_python_api_example_runs(block, tmp_path):
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, f"README example failed:\n{block}\n{r.stderr[-3000:]}"
    assert r.stdout.strip(), "every example prints what it shows"
    assert "False" not in r.stdout.split()          # the torch.compile example prints its check
