"""--py-spy finds py-spy where pip put it: beside the interpreter (a venv's bin/), even when that venv is not
activated and so not on PATH (issue 38: it said "py-spy is not installed")."""
import os
import shutil
import sys

import pytest

from opscope.profiler.pyspy import PySpy, find_py_spy

BESIDE = shutil.which("py-spy", path=os.path.dirname(sys.executable))


@pytest.mark.skipif(BESIDE is None, reason="py-spy is not installed beside this interpreter")
def test_py_spy_beside_the_interpreter_is_found_without_it_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert shutil.which("py-spy") is None            # what the old lookup saw
    assert find_py_spy() == BESIDE


def test_without_py_spy_anywhere_the_note_names_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    import sysconfig
    monkeypatch.setattr(sysconfig, "get_path", lambda name: str(tmp_path))
    spy = PySpy(os.getpid()).start()
    assert spy.proc is None and "not installed" in spy.note and str(tmp_path) in spy.note
