"""Issue 39: `train --hybrid`'s defaults and reports do not mislead. A job outside tolerance of one process names
the cause (demo:cnn's BatchNorm normalizes with each rank's rows, as DDP without SyncBatchNorm; --sync-bn makes it
match), and --overlap's default bucket is chosen from the model's gradients (demo:gpt's 17 MB in one 25 MiB bucket
overlapped nothing)."""
import json
import os
import subprocess
import sys

import pytest

from opscope.runtime.dist.buckets import DDP_BUCKET_BYTES, auto_bucket_bytes

pytestmark = pytest.mark.multiprocess
CLI = [sys.executable, "-m", "opscope.app"]


def _train(*args, home):
    r = subprocess.run([*CLI, "train", *args, "--json"], capture_output=True, text=True, timeout=400,
                       env={**os.environ, "OPSCOPE_HOME": str(home)})
    return r, (json.loads(r.stdout) if r.stdout.strip() else None)


@pytest.mark.slow
def test_batch_norm_outside_tolerance_is_never_ok_without_a_note_naming_it(tmp_path):
    r, doc = _train("demo:cnn", "--hybrid", "torch:cpu=0.5,torch:cpu=0.5", "--steps", "2", home=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    ref = doc["single_process"]
    assert not ref["within_tolerance"]
    assert doc["status"] == "ok" and "BatchNorm" in ref["note"] and "model.stem.1" in ref["note"]
    assert "--sync-bn" in ref["note"] and doc["sync_bn"] is False


@pytest.mark.slow
def test_sync_bn_matches_one_process_on_the_whole_batch_with_unequal_shares(tmp_path):
    """--sync-bn: demo:cnn's BatchNorm statistics all-reduced across the ranks (forward and backward, as torch's
    SyncBatchNorm), so 2 ranks of 6 and 2 rows match one process on the 8-row batch within 1e-4 (they were 1.9e-2
    off in loss without it); unequal shares check the backward's weighting by each rank's rows."""
    r, doc = _train("demo:cnn", "--hybrid", "torch:cpu=0.75,torch:cpu=0.25", "--sync-bn", "--steps", "2",
                    home=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    ref = doc["single_process"]
    assert doc["sync_bn"] is True and doc["shares"]["rows"] == [6, 2]
    assert ref["within_tolerance"] and ref["note"] is None and doc["status"] == "ok", ref
    assert ref["loss_error"]["max_abs"] <= 1e-4 and ref["parameter_error"]["max_abs"] <= 1e-4
    assert doc["identical_parameters"]


@pytest.mark.slow
def test_overlap_without_bucket_mb_splits_demo_gpt_into_buckets_and_says_so(tmp_path):
    r, doc = _train("demo:gpt", "--hybrid", "torch:cpu=0.5,torch:cpu=0.5", "--overlap", "--steps", "1",
                    home=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    b = doc["buckets"]
    assert b["count"] >= 4 and b["bytes"] < DDP_BUCKET_BYTES and "quarter" in b["chosen"]
    assert doc["steps"][0]["buckets"] == b["count"]
    assert doc["single_process"]["within_tolerance"] and doc["single_process"]["note"] is None


def test_the_automatic_bucket_is_a_quarter_of_the_gradients_and_never_more_than_ddps():
    assert auto_bucket_bytes({"w": 1000, "b": 24}) == 1024
    assert auto_bucket_bytes({"w": 100 * 2 ** 20}) == DDP_BUCKET_BYTES


def test_a_bad_bucket_size_is_one_line():
    r = subprocess.run([*CLI, "train", "demo:mlp", "--hybrid", "torch:cpu=0.5,torch:cpu=0.5", "--overlap",
                        "--bucket-mb", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--bucket-mb: 0: give a number above 0 MB" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("flags, named", [(["--sync-bn"], "--sync-bn"), (["--overlap", "--shard", "optimizer"],
                                                                          "--overlap, --shard"),
                                          (["--timeout", "5"], "--timeout")])
def test_a_job_flag_without_hybrid_is_refused_in_one_line(cli, flags, named):
    """`train MODEL --sync-bn` (no --hybrid) trained one process and said nothing of the flag it ignored."""
    r = cli("train", "demo:mlp", "--steps", "1", *flags)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith(f"opscope: error: {named}: ") and "--hybrid" in line, line
