"""CI's xdist workers (`-n 2` on 2 cores) run one math thread each (tests/conftest.py): torch's and BLAS's idle
threads spin-wait, and a thread per core in each of two workers made the same tests cost 4x the CPU."""
import pytest


def test_xdist_workers_that_fill_the_cores_run_one_torch_thread_each():
    from conftest import MATH_THREADS_SET
    if not MATH_THREADS_SET:
        pytest.skip("not under xdist, or the user set the threads: conftest set none (the rule is checked below)")
    import torch
    asked = MATH_THREADS_SET["OMP_NUM_THREADS"]
    assert torch.get_num_threads() == int(asked)     # torch read it: nothing imported torch before conftest


def test_the_rule_in_any_run_a_share_of_the_cores_per_worker_and_the_users_value_kept():
    """The xdist check above skips in a run without workers (the quick set): the rule conftest applies is checked here
    in every run, on the environments it meets."""
    from conftest import MATH_THREADS, math_threads
    assert math_threads({}, 16) == {}                                               # no xdist: torch's default
    assert math_threads({"PYTEST_XDIST_WORKER_COUNT": "2"}, 2) == dict.fromkeys(MATH_THREADS, "1")
    assert math_threads({"PYTEST_XDIST_WORKER_COUNT": "2"}, 16) == dict.fromkeys(MATH_THREADS, "8")
    assert math_threads({"PYTEST_XDIST_WORKER_COUNT": "4"}, 2) == dict.fromkeys(MATH_THREADS, "1")   # never 0
    for var in MATH_THREADS:       # the user's own: all left as they are (torch with MKL reads MKL's over OMP's)
        assert math_threads({"PYTEST_XDIST_WORKER_COUNT": "2", var: "3"}, 2) == {}
