"""Data parallelism as DDP and ZeRO do it: gradient buckets all-reduced while backward runs (--overlap), and
the optimizer state sharded over the ranks (--shard optimizer); both still equal one process on the full batch."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiprocess


def _train(*extra):
    r = subprocess.run([sys.executable, "-m", "opscope.app", "train", "demo:gpt", "--hybrid",
                        "torch:cpu=0.5,torch:cpu=0.5", "--steps", "2", "--json", *extra], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    ref = doc["single_process"]
    assert ref["loss_error"]["max_abs"] <= 1e-4 and ref["parameter_error"]["max_abs"] <= 1e-4
    assert doc["identical_parameters"]
    return doc


def test_bucketed_overlap_and_sharded_optimizer_state_equal_single_process_training():
    plain = _train("--overlap", "--bucket-mb", "0.25")
    assert all(s["buckets"] > 2 for s in plain["steps"])         # several buckets, sent during backward
    full = plain["steps"][-1]["optimizer_state_bytes"]
    assert full["0"] == full["1"] > 0                             # unsharded: every rank keeps all momentum

    sharded = _train("--shard", "optimizer")
    per_rank = sharded["steps"][-1]["optimizer_state_bytes"]
    assert per_rank["0"] + per_rank["1"] == full["0"]             # every parameter's state, once
    assert all(0.4 * full["0"] <= b <= 0.6 * full["0"] for b in per_rank.values())
    # the same training: the sharded run's losses are the unsharded run's
    assert max(abs(a - b) for a, b in zip(plain["losses"], sharded["losses"])) <= 1e-4
