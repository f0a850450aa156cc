"""CI's xdist workers (`-n 2` on 2 cores) run one math thread each (tests/conftest.py): torch's and BLAS's idle
threads spin-wait, and a thread per core in each of two workers made the same tests cost 4x the CPU."""
import os

import pytest


def test_xdist_workers_that_fill_the_cores_run_one_torch_thread_each():
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not count:
        pytest.skip("not under xdist: the process keeps torch's default of a thread per core")
    import torch
    asked = os.environ["OMP_NUM_THREADS"]            # set by conftest (or by the user, whose value is kept)
    assert torch.get_num_threads() == int(asked)     # torch read it: nothing imported torch before conftest
