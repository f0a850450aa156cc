"""benchmarks/bench_stacks.py runs end to end (it had broken silently when the backend list moved to the registry):
one stack, one round, demo:mlp, the CPU clock; it prints the ratios the README quotes. No timing is asserted."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.multiprocess
def test_bench_stacks_prints_each_stacks_ratio_to_eager_and_to_its_native_route():
    pytest.importorskip("onnxruntime")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_stacks.py"), "--model", "demo:mlp",
                        "--stacks", "onnxruntime", "--repeat", "1", "--warmup", "0", "--no-inductor", "--clock", "cpu"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "cpu time, medians of 1 interleaved rounds" in r.stdout
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("onnxruntime ") and "vs eager" in ln)
    assert "parity native/opscope" in line and "n/a" not in line, r.stdout
