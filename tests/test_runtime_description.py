"""Description file validation: every mistake names the file, the key and what was expected."""
import pytest

from opscope.runtime import description
from opscope.runtime.backends import resolve
from opscope.runtime.errors import UsageError

GOOD = """
[backend]
name = "chip"
implementation = "sim"
fallback = "numpy"
[hardware]
peak_flops = { float32 = 1.0e13, float16 = 4.0e13 }
memory_bandwidth = 1.0e12
launch_overhead = 2.0e-6
kind = "npu"
[operators]
unsupported = ["gelu"]
"""


def _load(tmp_path, text):
    p = tmp_path / "chip.toml"
    p.write_text(text)
    return p, description.load(p)


def test_good_description_loads(tmp_path):
    _, d = _load(tmp_path, GOOD)
    assert d.name == "chip" and d.implementation == "sim" and d.unsupported == ["gelu"]
    assert d.peak("float16") == 4.0e13 and d.peak("bfloat16") == 1.0e13    # unlisted dtypes: float32 rate
    assert d.as_dict()["memory_bandwidth"] == 1.0e12 and d.digest


@pytest.mark.parametrize("text, key, expected", [
    (GOOD.replace('kind = "npu"', 'kind = "npu"\nclock_ghz = 1.5'), "hardware.clock_ghz", "unknown key"),
    (GOOD.replace("memory_bandwidth = 1.0e12", 'memory_bandwidth = "fast"'), "hardware.memory_bandwidth", "expected bytes/s"),
    (GOOD.replace('name = "chip"\n', ""), "backend.name", "missing"),
    (GOOD.replace("memory_bandwidth = 1.0e12\n", ""), "hardware.memory_bandwidth", "missing"),
    (GOOD.replace('["gelu"]', '["no_such_op"]'), "operators.unsupported", "unknown op"),
    (GOOD.replace("float32 = 1.0e13", "float32 = -1.0"), "hardware.peak_flops.float32", "positive"),
    (GOOD + "\n[extras]\nx = 1\n", "extras", "unknown section"),
    (GOOD.replace('implementation = "sim"', 'implementation = "magic"'), "backend.implementation", "expected"),
    ("[backend\nname=", "", "TOML"),
    (GOOD.replace("launch_overhead = 2.0e-6", "launch_overhead = -1.0"), "hardware.launch_overhead", ">= 0"),
    (GOOD + "\n[tuning]\nthreads = [\"four\"]\n", "tuning.threads", "positive integers"),
])
def test_bad_description_names_file_and_key(tmp_path, text, key, expected):
    p = tmp_path / "chip.toml"
    p.write_text(text)
    with pytest.raises(UsageError) as e:
        description.load(p)
    msg = str(e.value)
    assert str(p) in msg and key in msg and expected.lower() in msg.lower(), msg
    assert "\n" not in msg


def test_bad_fallback_names_the_description_that_asks_for_it(tmp_path):
    p = tmp_path / "chip.toml"
    p.write_text(GOOD.replace('fallback = "numpy"', 'fallback = "tpu:7"'))
    with pytest.raises(UsageError, match=r"chip\.toml: backend\.fallback: unknown backend 'tpu:7'"):
        resolve(str(p))


def test_resolve_reports_missing_description_file(tmp_path):
    with pytest.raises(UsageError, match="nope.toml"):
        resolve(str(tmp_path / "nope.toml"))


# --- hostile and malformed files (issue 11.6): one line, the file and the key, exit 2 ----------------
NESTED = GOOD.replace('kind = "npu"', 'kind = "npu"\nextra = ' + "[" * 3000 + "]" * 3000)


@pytest.mark.parametrize("text, key, expected", [
    (NESTED, "", "nested too deeply"),
    (GOOD.replace('kind = "npu"', 'kind = ' + "{a=" * 300 + "1" + "}" * 300), "hardware.kind", "expected"),
    (GOOD.replace('implementation = "sim"', 'implementation = ".x"'), "backend.implementation", "dotted module"),
    (GOOD.replace('implementation = "sim"', 'implementation = "x..y"'), "backend.implementation", "dotted module"),
    (GOOD.replace('implementation = "sim"', 'implementation = "torch"\ndevice = "meta"'), "backend.device", "no data"),
    (GOOD.replace('implementation = "sim"', 'implementation = "torch"\ndevice = "gpu:0"'), "backend.device",
     "not a torch device"),
    (GOOD.replace("float32 = 1.0e13", "float32 = nan"), "hardware.peak_flops.float32", "positive finite"),
    (GOOD.replace("float32 = 1.0e13", "float32 = inf"), "hardware.peak_flops.float32", "positive finite"),
    (GOOD.replace("float32 = 1.0e13", "float32 = 1" + "0" * 400), "hardware.peak_flops.float32", "positive finite"),
    (GOOD.replace("float32 = 1.0e13", "flaot32 = 1.0e13"), "hardware.peak_flops.flaot32", "unknown dtype"),
    (GOOD.replace("memory_bandwidth = 1.0e12", "memory_bandwidth = -nan"), "hardware.memory_bandwidth", "finite"),
    (GOOD.replace("memory_bandwidth = 1.0e12", "memory_bandwidth = -inf"), "hardware.memory_bandwidth", "finite"),
    (GOOD.replace("launch_overhead = 2.0e-6", "launch_overhead = inf"), "hardware.launch_overhead", ">= 0"),
    (GOOD.replace('kind = "npu"', 'kind = "npu"\nhost_bandwidth = -3.0'), "hardware.host_bandwidth", "positive"),
    (GOOD.replace('kind = "npu"', 'kind = "npu"\nmemory_capacity = nan'), "hardware.memory_capacity", "positive"),
    (GOOD.replace('kind = "npu"', 'kind = "npu"\ncores = -2'), "hardware.cores", ">= 0"),
    (GOOD.replace('kind = "npu"', 'kind = "npu"\npreferred_layout = "nwhc"'), "hardware.preferred_layout", "nhwc"),
    (GOOD.replace('name = "chip"', 'name = ""'), "backend.name", "empty"),
    (GOOD.replace('fallback = "numpy"', 'fallback = ""'), "backend.fallback", "backend specs"),
    (GOOD + "\n[tuning]\nthreads = [1" + "0" * 30 + "]\n", "tuning.threads", "positive integers"),
])
def test_hostile_description_names_file_and_key(tmp_path, text, key, expected):
    test_bad_description_names_file_and_key(tmp_path, text, key, expected)


def test_vendor_module_that_fails_to_import_is_a_usage_error(tmp_path):
    p = tmp_path / "chip.toml"
    p.write_text(GOOD.replace('implementation = "sim"', 'implementation = "no_such_vendor.backend"'))
    with pytest.raises(UsageError, match=r"chip\.toml: backend\.implementation: cannot import 'no_such_vendor\.backend'"):
        resolve(str(p), trusted=True)      # as the user's own script would (tests/test_stacks_trust.py: who may)


def test_a_description_that_is_not_a_file_or_too_big_is_refused(tmp_path):
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(UsageError, match="dir.toml is not a regular file"):
        description.load(tmp_path / "dir.toml")
    big = tmp_path / "big.toml"
    big.write_text(GOOD + "#" * (description.MAX_BYTES + 1))
    with pytest.raises(UsageError, match="big.toml: larger than"):
        description.load(big)


def test_meta_device_is_not_available():
    from opscope.runtime.backends import torch_backend
    ok, why = torch_backend.available("meta")
    assert not ok and "no data" in why
    with pytest.raises(UsageError, match="torch:meta is not available"):
        resolve("torch:meta")


BAD_FILES = {
    "nested": NESTED,
    "dotted": GOOD.replace('implementation = "sim"', 'implementation = ".x"'),
    "meta": GOOD.replace('implementation = "sim"', 'implementation = "torch"\ndevice = "meta"'),
    "nan": GOOD.replace("float32 = 1.0e13", "float32 = nan"),
    "binary": "\udcff",
}


def _home_with_bad_files(home):
    folder = home / "backends"
    folder.mkdir()
    (folder / "good.toml").write_text(GOOD.replace('name = "chip"', 'name = "good"'))
    for name, text in BAD_FILES.items():
        (folder / f"{name}.toml").write_bytes(text.encode("utf-8", "surrogateescape"))
    return folder


def test_bad_files_in_home_show_as_not_available_and_break_nothing(cli, opscope_home):
    import json
    folder = _home_with_bad_files(opscope_home)
    r = cli("backends", "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    rows = {row["spec"]: row for row in json.loads(r.stdout)["backends"]}
    assert rows["sim:good"]["available"] is True and rows["sim:npu-a1"]["available"] is True
    for name in BAD_FILES:
        row = rows[f"sim:{name}"]
        assert row["available"] is False and str(folder / f"{name}.toml") in row["reason"], row
    assert "backend.device" in rows["sim:meta"]["reason"] and "peak_flops.float32" in rows["sim:nan"]["reason"]
    assert "backend.implementation" in rows["sim:dotted"]["reason"]
    r = cli("backends")                                  # the table too
    assert r.returncode == 0 and "Traceback" not in r.stderr and "sim:good" in r.stdout and "sim:nested" in r.stdout


@pytest.mark.multiprocess
@pytest.mark.slow
def test_good_backend_runs_beside_bad_files(cli, opscope_home):
    _home_with_bad_files(opscope_home)
    r = cli("run", "demo:mlp", "--backend", "sim:good", "--json")
    assert r.returncode == 0, r.stderr
    for name in BAD_FILES:
        r = cli("run", "demo:mlp", "--backend", f"sim:{name}")
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and len(lines) == 1 and f"{name}.toml" in lines[0], r.stderr
