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
