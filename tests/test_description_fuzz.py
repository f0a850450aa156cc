"""Fuzzing description files (issue 11.6): random TOML-ish mutations of the bundled descriptions
either load as a valid Description (and resolve, or refuse as a usage error) or raise UsageError
with a one-line message naming the file -- never another exception."""
import math
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opscope.runtime import description
from opscope.runtime.backends import BUNDLED, resolve
from opscope.runtime.errors import UsageError

SOURCES = [p.read_text() for p in sorted(BUNDLED.glob("*.toml"))]
KEYS = sorted({k for section in description.SCHEMA.values() for k in section} | {"x", "name.sub", "[backend]"})
VALUES = ["nan", "-nan", "inf", "-inf", "0", "-1", "1e400", "1" + "0" * 40, "true", '""', '"meta"', '".x"',
          '"torch"', '"numpy"', '"sim"', '"a.b"', "[]", "{}", '["numpy", "torch:cpu"]', '["numpy", "numpy"]',
          '["sim:npu-a1"]', '"sim:edge-gpu"', '"torch:meta"', "1979-05-27T07:32:00Z", "[[1], [2]]",
          "{ float32 = nan }", "{ float32 = { a = 1 } }", '["gelu", 3]', '"\\u0000"', "[" * 600 + "]" * 600,
          "{a=" * 300 + "1" + "}" * 300, '"' + "x" * 5000 + '"']


# Mostly mutations that keep the TOML well formed, so the checks after parsing get exercised too.
MUTATIONS = ["value"] * 6 + ["key"] * 2 + ["drop"] * 2 + ["dup", "insert", "junk", "truncate", "section"]


@st.composite
def mutated(draw):
    lines = draw(st.sampled_from(SOURCES)).splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(MUTATIONS))
        line = lines[i]
        if kind == "value" and "=" in line:
            lines[i] = line.split("=", 1)[0] + "= " + draw(st.sampled_from(VALUES))
        elif kind == "key":
            lines.insert(i, f"{draw(st.sampled_from(KEYS))} = {draw(st.sampled_from(VALUES))}")
        elif kind == "drop":
            del lines[i]
        elif kind == "dup":
            lines.insert(i, line)
        elif kind == "insert":
            lines.insert(i, draw(st.text(max_size=30)))
        elif kind == "junk":
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + draw(st.sampled_from(["[", "]", "{", "}", '"', "=", ",", "\\", "\x00", "é"])) + line[at:]
        elif kind == "truncate":
            lines = lines[:i]
        else:
            lines.insert(i, draw(st.sampled_from(["[backend]", "[hardware]", "[operators]", "[tuning]", "[[backend]]",
                                                  "[hardware.peak_flops]", "[extra]"])))
        if not lines:
            lines = [""]
    return "\n".join(lines)


_DIR = Path(tempfile.mkdtemp(prefix="opscope-fuzz-"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_descriptions_load_or_refuse_with_a_message(text):
    path = _DIR / "chip.toml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        d = description.load(path)
    except UsageError as e:
        msg = str(e)
        assert msg and "\n" not in msg and str(path) in msg, msg
        assert len(msg) < 2000, msg            # values are shown abbreviated
        return
    assert isinstance(d, description.Description) and d.name.strip() and isinstance(d.fallbacks, list)
    assert all(math.isfinite(v) and v > 0 for v in d.peak_flops.values())
    for v in (d.memory_bandwidth, d.memory_capacity, d.host_bandwidth, d.launch_overhead):
        assert math.isfinite(v) and v >= 0
    try:
        resolve(str(path))
    except UsageError as e:
        assert str(e) and "\n" not in str(e), str(e)
