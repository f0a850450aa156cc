"""`--fallback BACKEND` (issue 26): a fallback for one run, without writing a description. A model whose op no
backend in the chain runs exits 2 with one line that names the op and the flag that gets it running."""
import json
from pathlib import Path

import pytest

MODEL = str(Path(__file__).parent / "models" / "custom_op.py") + ":factory"    # a torch.library op opscope lacks


@pytest.mark.multiprocess
def test_an_op_no_backend_in_the_chain_runs_names_the_op_and_the_flag(cli):
    r = cli("run", MODEL, "--backend", "sim:npu-a1")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "opscopetest:scaled_gate" in lines[0] and "--fallback torch:cpu" in lines[0]


@pytest.mark.multiprocess
def test_fallback_flag_adds_torch_after_the_descriptions_chain(cli):
    r = cli("run", MODEL, "--backend", "sim:npu-a1", "--fallback", "torch:cpu", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    fell = {f["op"]: f["backend"] for f in doc["placement"]["fallback_ops"]}
    assert fell["opscopetest:scaled_gate"] == "torch:cpu"


@pytest.mark.multiprocess
def test_train_takes_the_flag(cli):
    r = cli("train", "demo:mlp", "--backend", "sim:npu-a1", "--steps", "1", "--fallback", "torch:cpu", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["within_tolerance"]


def test_a_bad_flag_is_refused_before_the_model_loads():
    import argparse

    from opscope.app.cli.common import fallback_of
    from opscope.runtime.errors import UsageError
    ns = argparse.Namespace
    assert fallback_of(ns(no_fallback=False, fallback=None)) is True
    assert fallback_of(ns(no_fallback=True, fallback=None)) is False
    assert fallback_of(ns(no_fallback=False, fallback=["torch:cpu,numpy"])) == ["torch:cpu", "numpy"]
    for bad in (ns(no_fallback=False, fallback=["nosuch"]), ns(no_fallback=True, fallback=["torch:cpu"])):
        with pytest.raises(UsageError):
            fallback_of(bad)


def test_the_chain_is_the_descriptions_then_the_flags_each_once():
    from opscope.runtime.backends import resolve
    from opscope.runtime.fallback import fallback_chain
    b = resolve("sim:npu-a1")
    assert [x.name for x in fallback_chain(b, True)] == ["numpy"]
    assert [x.name for x in fallback_chain(b, ["torch:cpu", "numpy", "torch:cpu"])] == ["numpy", "torch:cpu"]
    assert fallback_chain(b, False) == []


@pytest.mark.multiprocess
def test_profile_passes_the_flag_to_its_runner(cli):
    """profile runs the model in a runner process: the flag travels in the runner's argv."""
    r = cli("profile", MODEL, "--backend", "sim:npu-a1", "--fallback", "torch:cpu", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["status"] == "ok"
    assert any(o["op"] == "opscopetest:scaled_gate" and o["fallback"] for o in doc["top_ops"])


def test_a_0d_value_keeps_its_shape_when_it_moves_to_torch():
    """np.ascontiguousarray makes a 0-d array 1-d: a scalar (a loss, a reduction) handed from numpy to a torch
    fallback came back shape (1,), and the OpInfo check called ops that fell back for it wrong."""
    import numpy as np
    from opscope.runtime.backends import resolve
    assert tuple(resolve("torch:cpu").memory.to_device(np.array(2.0, dtype=np.float32)).shape) == ()
