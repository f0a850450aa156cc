"""launch() over ranks that misbehave, with a stand-in rank module (a real child process each): a rank that fails
while an earlier one is still alive ends the job after the grace period, not at its deadline, and a rank that
prints a line past the bound loses that line only, never the launcher's memory or the records after it."""
import textwrap
import time

import pytest

from opscope.runtime.dist import launch as launch_module
from opscope.runtime.dist.job import DistJob

pytestmark = pytest.mark.multiprocess

RANK = textwrap.dedent('''
    import os, sys, time
    from opscope.runtime.dist.launch import MARK
    rank = int(os.environ["RANK"])
    if rank == 1:
        sys.stdout.write("x" * (int(os.environ["BIG"])) + "\\n")      # past the bound, then a record
        print(MARK + '{"kind": "note", "rank": 1}', flush=True)
        sys.exit(3)
    time.sleep(120)                                                 # rank 0: alive until it is killed
''')


def test_a_later_rank_that_fails_ends_the_job_after_the_grace_period_and_an_overlong_line_is_dropped(
        tmp_path, monkeypatch):
    (tmp_path / "stand_in_rank.py").write_text(RANK)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("BIG", str(4096))
    monkeypatch.setattr(launch_module, "MAX_LINE", 1024)
    monkeypatch.setattr(launch_module, "GRACE_S", 0.5)
    job = DistJob(model="demo:mlp", specs=["numpy", "numpy"])
    start = time.monotonic()
    result = launch_module.launch(job, worker="stand_in_rank", deadline_s=300)
    # before the fix rank 1 was never polled while rank 0 lived, so the job ran to its 300 s deadline
    assert time.monotonic() - start < 250
    assert result.exit_codes[1] == 3 and result.hung.get(0) == "running"
    assert [r["rank"] for r in result.records] == [1]              # the record after the dropped line arrived


def test_lines_are_bounded_and_an_overlong_one_is_dropped_whole(monkeypatch):
    import io
    monkeypatch.setattr(launch_module, "MAX_LINE", 16)
    text = "short\n" + "y" * 50 + "\n" + "z" * 10 + "\n" + "tail"
    assert list(launch_module._lines(io.StringIO(text))) == ["short\n", "z" * 10 + "\n", "tail"]
