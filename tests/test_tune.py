"""The auto-tuner: never slower than the default, and the cache answers a second call without measuring."""
import json

import pytest

from opscope.profiler import tuning_cache
from opscope.profiler.tune import tune


@pytest.mark.slow
def test_tune_gpt_on_torch_cpu_then_reuse_the_cache(cli):
    r = cli("tune", "demo:gpt", "--backend", "torch:cpu", "--budget", "3", "--json")
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    assert first["cache_hit"] is False and first["trials_run"] == len(first["trials"]) >= 2
    assert first["trials"][0]["config"] == first["default"]["config"]          # trial 0 is the default
    assert first["best"]["seconds"] <= first["default"]["seconds"]
    assert set(first["knobs"]) >= {"threads", "matrix_dtype", "chunks"}

    r = cli("tune", "demo:gpt", "--backend", "torch:cpu", "--budget", "3", "--json")
    assert r.returncode == 0, r.stderr
    second = json.loads(r.stdout)
    assert second["cache_hit"] is True and second["trials_run"] == 0 and second["trials"] == []
    assert second["best"] == first["best"] and second["cache_key"] == first["cache_key"]


TORCH_DESC = """
[backend]
name = "my-cpu"
implementation = "torch"
device = "cpu"
summary = "{summary}"
[tuning]
threads = [1]
"""


def test_a_changed_description_or_library_version_misses_the_cache(tmp_path, monkeypatch):
    desc = tmp_path / "my-cpu.toml"
    desc.write_text(TORCH_DESC.format(summary="first"))
    a = tune("demo:mlp", str(desc), budget=2, repeats=1)
    assert a["cache_hit"] is False and a["trials_run"] >= 1
    assert tune("demo:mlp", str(desc), budget=2, repeats=1)["cache_hit"] is True

    desc.write_text(TORCH_DESC.format(summary="edited"))
    b = tune("demo:mlp", str(desc), budget=2, repeats=1)
    assert b["cache_hit"] is False and b["cache_key"] != a["cache_key"]

    real = tuning_cache.software_versions()
    monkeypatch.setattr(tuning_cache, "software_versions", lambda: {**real, "torch": real["torch"] + "-next"})
    c = tune("demo:mlp", str(desc), budget=2, repeats=1)
    assert c["cache_hit"] is False and c["key_parts"]["versions"]["torch"].endswith("-next")


def test_sim_tuning_picks_the_faster_dtype(tmp_path):
    chip = tmp_path / "chip.toml"
    chip.write_text("""
[backend]
name = "fp16-chip"
implementation = "sim"
[hardware]
peak_flops = { float32 = 1.0e12, float16 = 4.0e12 }
memory_bandwidth = 1.0e12
launch_overhead = 1.0e-7
""")
    r = tune("demo:mlp", str(chip), budget=2, repeats=1)
    assert r["knobs"] == {"dtype": ["float32", "float16"]}
    assert r["best"]["config"] == {"dtype": "float16"} and r["speedup"] > 2
