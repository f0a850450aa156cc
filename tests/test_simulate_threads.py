"""Issue 39: `simulate` measures a share's compute with the threads each rank of `train --hybrid` will get (one
per rank on a 2-core host), not this process's default of a thread per core."""
import os

import torch

from opscope.runtime.dist.launch import threads_per_rank
from opscope.runtime.dist.simulate import measure, rank_threads


def test_compute_is_measured_with_the_threads_a_rank_gets_and_the_process_keeps_its_own(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), real(n))[1])
    m = measure("demo:mlp", ["torch:cpu"] * 4, [0.25] * 4, repeats=1)
    assert m.threads == rank_threads(4) == threads_per_rank(4)
    assert seen[0] == threads_per_rank(4)            # the steps ran with them
    assert torch.get_num_threads() == before


def test_omp_num_threads_asked_is_what_the_ranks_get(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert rank_threads(2) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "x")
    assert rank_threads(2) == threads_per_rank(2)
    assert os.environ["OMP_NUM_THREADS"] == "x"
