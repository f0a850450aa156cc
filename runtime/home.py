"""OPSCOPE_HOME: where runs, tuning caches and user backend descriptions live."""
import os
from pathlib import Path


def opscope_home() -> Path:
    return Path(os.environ.get("OPSCOPE_HOME") or Path.home() / ".opscope")
