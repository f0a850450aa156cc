"""Fallback chains (issue 12.2): `fallback = ["numpy", "torch:cpu"]`, each refused node placed on the
first fallback that runs it, the report naming who took it and who refused; and kernels that cannot
take a node's arguments refuse in supports() so the node falls back (issue 12.3)."""
import json
from pathlib import Path

import pytest

from opscope.runtime import OPS, open_session
from opscope.runtime.backends import resolve
from opscope.runtime.errors import ModelError, UnsupportedOpError, UsageError
from opscope.runtime.session import compare

MODELS = Path(__file__).parent / "models"
CHAIN = '["numpy", "torch:cpu"]'


def _chip(folder, name="chain", fallback=CHAIN, unsupported=()):
    p = Path(folder) / f"{name}.toml"
    p.write_text(f'[backend]\nname = "{name}"\nimplementation = "sim"\nfallback = {fallback}\n'
                 '[hardware]\npeak_flops = { float32 = 1.0e13 }\nmemory_bandwidth = 1.0e12\n'
                 f'[operators]\nunsupported = {json.dumps(list(unsupported))}\n')
    return str(p)


def _where(session) -> dict[str, str]:
    return {st.node.op: st.backend.name for st in session.plan.steps if st.node.op != "transfer"}


def test_description_takes_a_string_or_a_list_of_fallbacks(tmp_path):
    b = resolve(_chip(tmp_path))
    assert b.description.fallbacks == ["numpy", "torch:cpu"]
    assert [f.name for f in b.fallbacks] == ["numpy", "torch:cpu"]
    one = resolve(_chip(tmp_path, "one", '"numpy"'))
    assert one.description.fallbacks == ["numpy"] and one.fallback.name == "numpy"
    none = resolve(_chip(tmp_path, "none", "[]"))
    assert none.description.fallbacks == [] and none.fallback is None


@pytest.mark.parametrize("fallback, key, want", [
    ('["numpy", "numpy"]', "backend.fallback", "listed twice"),
    ('["numpy", 3]', "backend.fallback", "backend specs"),
    ('[""]', "backend.fallback", "backend specs"),
    ('["numpy", "tpu:7"]', "backend.fallback[1]", "unknown backend 'tpu:7'"),
])
def test_bad_fallback_lists_name_the_file_and_key(tmp_path, fallback, key, want):
    with pytest.raises(UsageError) as e:
        resolve(_chip(tmp_path, fallback=fallback))
    msg = str(e.value)
    assert "chain.toml" in msg and f"{key}:" in msg and want in msg, msg


def test_a_chain_that_loops_is_refused(opscope_home):
    folder = opscope_home / "backends"
    folder.mkdir()
    _chip(folder, "a", '["numpy", "sim:b"]')
    _chip(folder, "b", '"sim:a"')
    with pytest.raises(UsageError, match=r"loops \(sim:a -> sim:b -> sim:a\)"):
        resolve("sim:a")


def test_ops_go_to_the_first_fallback_that_runs_them(tmp_path):
    """linear: the chip refuses, numpy (first) takes it; the custom op: numpy refuses too, torch:cpu takes it."""
    s = open_session(f"{MODELS / 'custom_op.py'}:factory", _chip(tmp_path, unsupported=["linear"]))
    assert _where(s) == {"opscopetest:scaled_gate": "torch:cpu", "linear": "numpy"}
    fell = {f["op"]: f for f in s.plan.placement.report()["fallback_ops"]}
    assert fell["linear"]["backend"] == "numpy" and fell["linear"]["refused_by"] == []
    assert "marked unsupported" in fell["linear"]["reason"]
    gate = fell["opscopetest:scaled_gate"]
    assert gate["backend"] == "torch:cpu"
    assert gate["refused_by"] == [{"backend": "numpy", "reason": "no opscope op for opscopetest:scaled_gate"}]
    assert compare(s.run_host(), s.eager())["max_abs"] <= 1e-5


@pytest.mark.slow
def test_lstm_on_a_sim_chip_falls_back_along_the_chain(tmp_path):
    s = open_session(f"{MODELS / 'recurrent.py'}:lstm", _chip(tmp_path))
    sim, numpy, torch_cpu = s.backend, *s.backend.fallbacks
    for st in s.plan.steps:
        n = st.node
        if n.op == "transfer":
            continue
        # each node sits on the first backend of [chip, numpy, torch:cpu] that runs it
        if st.backend is torch_cpu:
            assert sim.ops.supports(n) is not True and numpy.ops.supports(n) is not True, n.op
        elif st.backend is numpy:
            assert sim.ops.supports(n) is not True and numpy.ops.supports(n) is True, n.op
        else:
            assert st.backend is sim and sim.ops.supports(n) is True, n.op
    if any(n.op == "aten:lstm" for n in s.graph.nodes):     # until numpy has an lstm kernel
        assert _where(s)["aten:lstm"] == "torch:cpu"
    assert _where(s)["linear"] == "sim:chain"
    assert compare(s.run_host(), s.eager())["max_abs"] <= 1e-5


@pytest.mark.multiprocess
@pytest.mark.slow
def test_cli_reports_which_fallback_took_each_op(cli, tmp_path):
    r = cli("run", f"{MODELS / 'custom_op.py'}:factory", "--backend", _chip(tmp_path, unsupported=["linear"]), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {f["op"]: f["backend"] for f in doc["placement"]["fallback_ops"]} == \
        {"linear": "numpy", "opscopetest:scaled_gate": "torch:cpu"}
    assert doc["max_abs_err"] <= 1e-5


def test_when_every_fallback_refuses_the_message_says_which_and_why(tmp_path):
    with pytest.raises(UnsupportedOpError) as e:
        open_session(f"{MODELS / 'custom_op.py'}:factory", _chip(tmp_path, fallback='"numpy"'))
    msg = str(e.value)
    assert "give the backend a fallback" not in msg, msg      # it has one
    assert "its fallbacks (numpy)" in msg and "numpy says no opscope op for opscopetest:scaled_gate" in msg, msg
    assert e.value.ops == ["opscopetest:scaled_gate"] and "\n" not in msg


def test_no_fallback_flag_and_no_fallback_at_all_say_what_to_do(tmp_path):
    spec = _chip(tmp_path, unsupported=["linear"])
    with pytest.raises(UnsupportedOpError, match="run without --no-fallback"):
        open_session(f"{MODELS / 'custom_op.py'}:factory", spec, allow_fallback=False)
    with pytest.raises(UnsupportedOpError, match="give the backend a fallback in its description"):
        open_session(f"{MODELS / 'custom_op.py'}:factory", _chip(tmp_path, "bare", "[]", unsupported=["linear"]))


def test_a_kernel_that_cannot_take_the_arguments_refuses_and_the_node_falls_back(tmp_path, monkeypatch):
    """OpDef.accepts (the numpy kernel's own check) is asked by numpy-kernel backends, not by torch."""
    monkeypatch.setattr(OPS["linear"], "accepts", lambda node: "linear: not on this test's inputs")
    s = open_session(f"{MODELS / 'custom_op.py'}:factory", _chip(tmp_path))
    assert _where(s)["linear"] == "torch:cpu"
    fell = {f["op"]: f for f in s.plan.placement.report()["fallback_ops"]}
    assert fell["linear"]["reason"] == "linear: not on this test's inputs"
    assert fell["linear"]["refused_by"] == [{"backend": "numpy", "reason": "linear: not on this test's inputs"}]
    assert compare(s.run_host(), s.eager())["max_abs"] <= 1e-5


def test_a_numpy_kernel_that_raises_anyway_names_the_op_and_node(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("operands could not be broadcast together")

    monkeypatch.setattr(OPS["linear"], "numpy", broken)
    s = open_session("demo:mlp", "numpy")
    with pytest.raises(ModelError, match=r"op linear \(node linear\b.*\) failed on numpy: ValueError: operands"):
        s.run_host()
