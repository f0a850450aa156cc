"""Conformance: every op on numpy and torch:cpu matches PyTorch's float64 CPU reference; a wrong
kernel is caught; the CLI prints one JSON document and exits 1 on a failure."""
import json
import textwrap

import numpy as np
import pytest

from opscope.runtime import OPS
from opscope.runtime.backends import resolve
from opscope.runtime.conformance import check
from opscope.runtime.ops.registry import INTERNAL_OPS
from opscope.runtime.samples import SAMPLES


def test_every_op_has_sample_inputs():
    missing = sorted(set(OPS) - set(SAMPLES) - INTERNAL_OPS - {n for n, o in OPS.items() if o.kind == "custom"})
    assert not missing, f"add entries to runtime/samples.py for {missing}"


@pytest.mark.slow       # every op on a backend: ~110 s under load 15: not in the quick set (issue 34)
@pytest.mark.parametrize("backend", ["numpy", "torch:cpu"])
def test_conformance_passes_for_every_op(backend):
    # user ops that other tests define with @operator have no samples: check the built-in set
    builtin = sorted(n for n, o in OPS.items() if o.kind != "custom" and n not in INTERNAL_OPS)
    report = check(resolve(backend), ops=builtin)
    assert not report.failed, [(c.op, c.dtype, c.message) for c in report.failed]
    counts = report.counts()
    assert counts["untested"] == 0 and counts["unsupported"] == 0
    checked = {c.op for c in report.cells}
    assert checked == set(SAMPLES)
    dtypes = {c.dtype for c in report.cells}
    assert {"float32", "float16", "float64", "int64"} <= dtypes


def test_a_wrong_kernel_fails_with_its_error():
    b = resolve("numpy")
    b.ops.register("gelu", lambda x, approximate="none": np.maximum(x, 0).astype(x.dtype))   # relu, not gelu
    report = check(b, ops=["gelu", "add"])
    cells = {(c.op, c.dtype): c for c in report.cells}
    assert cells[("gelu", "float32")].status == "fail" and cells[("gelu", "float32")].max_abs > 0.1
    assert cells[("add", "float32")].status == "pass"


def test_sim_without_float64_reports_it_unsupported():
    report = check(resolve("sim:npu-a1", with_fallback=False), ops=["linear", "gelu"])
    cells = {(c.op, c.dtype): c.status for c in report.cells}
    assert cells[("linear", "float32")] == "pass" and cells[("linear", "float16")] == "pass"
    assert cells[("linear", "float64")] == "unsupported"
    assert cells[("gelu", "float32")] == "unsupported"


BROKEN_BACKEND = textwrap.dedent("""
    import numpy as np
    from opscope.runtime.backends import numpy_backend

    def create(desc):
        b = numpy_backend.create(desc, name=desc.name)
        b.ops.register("exp", lambda x: (np.exp(x) * 1.01).astype(x.dtype))
        return b
""")


@pytest.mark.multiprocess
def test_cli_check_json_and_exit_codes(cli, tmp_path):
    r = cli("backend", "check", "numpy", "--ops", "add,softmax", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and {c["op"] for c in doc["results"]} == {"add", "softmax"}
    assert all(c["status"] == "pass" for c in doc["results"])

    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "__init__.py").write_text("")
    (tmp_path / "acme" / "broken_chip.py").write_text(BROKEN_BACKEND)
    (tmp_path / "broken.toml").write_text('[backend]\nname = "broken"\nimplementation = "acme.broken_chip"\n')
    r = cli("backend", "check", str(tmp_path / "broken.toml"), "--ops", "exp,add", env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 1, r.stderr
    assert "FAIL" in r.stdout and "exp" in r.stdout

    r = cli("backend", "check", "numpy", "--ops", "no_such_op")
    assert r.returncode == 2 and "no_such_op" in r.stderr
