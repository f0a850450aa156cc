"""A compiler stack's regions in a plan (issue 25, item 8): `opscope compile -b onnxruntime|openvino` saves each
region's compiled program (ONNX model, OpenVINO IR), `run --plan` loads it without the stack's importer, a plan
run with other weights compiles the region again, another stack version is refused, and a saved program that is
not plain data (external files, custom domains, a wrong checksum) is one line, exit 2."""
from __future__ import annotations

import copy
import hashlib
import json
import zipfile

import numpy as np
import pytest
import torch

from opscope.runtime import models
from opscope.runtime.passes.plan_file import compile_to_file, load_plan, open_plan_session
from opscope.runtime.session import compare

# what each stack's importer is: a plan that holds the region must not call it
IMPORTER = {"onnxruntime": "torch.onnx.export", "openvino": "openvino.convert_model"}


@pytest.fixture(scope="module", params=["onnxruntime", "openvino"])
def stack_plan(request, tmp_path_factory):
    pytest.importorskip(request.param)
    path = tmp_path_factory.mktemp("plans") / f"gpt-{request.param}.opsplan"
    info = compile_to_file(path, "demo:gpt", request.param)
    return request.param, path, info


def _rewrite(src, dst, *, doc_edit=None, members=None):
    """The plan at `src` with plan.json edited and members replaced/added, its checksum made to match (what
    anyone editing a plan can do: plan.sha256 is not a signature)."""
    with zipfile.ZipFile(src) as z:
        files = {n: z.read(n) for n in z.namelist()}
    doc = json.loads(files["plan.json"])
    if doc_edit:
        doc_edit(doc)
    files.update(members or {})
    files["plan.json"] = json.dumps(doc).encode()
    files["plan.sha256"] = hashlib.sha256(files["plan.json"]).hexdigest().encode()
    with zipfile.ZipFile(dst, "w") as z:
        for n, b in files.items():
            z.writestr(n, b)
    return doc


def test_the_plan_holds_each_region_and_run_plan_loads_it_without_the_importer(stack_plan, monkeypatch):
    stack, path, info = stack_plan
    assert "fuse" not in info["passes"]        # the stack fuses; opscope's fused nodes would split its region
    with zipfile.ZipFile(path) as z:
        doc = json.loads(z.read("plan.json"))
        assert [r["file"] for r in doc["regions"]] == ["regions/region0.bin"] and "regions/region0.bin" in z.namelist()
    assert doc["regions"][0]["stack"].startswith(stack + " ") and len(doc["regions"][0]["members"]) > 50

    def refused(*a, **k):
        raise AssertionError(f"{IMPORTER[stack]} ran: the plan's region was compiled again")
    monkeypatch.setattr(IMPORTER[stack], refused)
    s = open_plan_session(path, "demo:gpt")
    assert s.extra["plan"]["regions_loaded"] == 1 and s.extra["plan"]["regions_compiled"] == 0
    assert compare(s.run_host(), s.eager())["max_abs"] <= 1e-4


def test_other_weights_of_the_same_shapes_compile_the_region_again(stack_plan):
    stack, path, _ = stack_plan
    model, inputs = models.load("demo:gpt")
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01)
    loaded = load_plan(path, model=other, inputs=inputs)
    assert loaded.info["regions_loaded"] == 0 and loaded.info["regions_compiled"] == 1
    out = loaded.executor.run(*inputs)
    with torch.no_grad():
        want = [other(*inputs).numpy()]
    assert compare([np.asarray(o) for o in out], want)["max_abs"] <= 1e-4           # the saved program had the old weights folded in


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    path = tmp_path_factory.mktemp("plans") / "mlp.opsplan"
    compile_to_file(path, "demo:mlp", "onnxruntime")
    return path


@pytest.mark.multiprocess
def test_a_plan_from_another_stack_version_is_refused_and_recompile_rewrites_it(mlp_plan, tmp_path, cli):
    old = tmp_path / "old.opsplan"

    def older(doc):
        doc["regions"][0]["stack"] = "onnxruntime 0.0.1"
    _rewrite(mlp_plan, old, doc_edit=older)
    r = cli("run", "demo:mlp", "--plan", old)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "compiled by onnxruntime 0.0.1" in r.stderr and "--recompile" in r.stderr
    r = cli("run", "demo:mlp", "--plan", old, "--recompile", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["max_abs_err"] <= 1e-4 and doc["plan"]["recompiled"]


def _onnx_with(kind: str) -> bytes:
    """A one-input, one-output ONNX model that is not plain data."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("i0", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("o0", TensorProto.FLOAT, [2, 8])
    if kind == "external":             # ONNX Runtime would read /etc/passwd into the weight
        w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 8])
        w.data_location = TensorProto.EXTERNAL
        w.external_data.add(key="location", value="/etc/passwd")
        node = helper.make_node("Add", ["i0", "w"], ["o0"], name="n0")
        graph = helper.make_graph([node], "g", [x], [y], initializer=[w])
    else:                              # an op from a custom domain: kernels from a library
        node = helper.make_node("Evil", ["i0"], ["o0"], name="n0", domain="com.evil")
        graph = helper.make_graph([node], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["external", "custom-domain", "checksum", "undeclared"])
def test_a_saved_onnx_region_that_is_not_plain_data_is_one_line_exit_2(kind, mlp_plan, tmp_path, cli):
    path = mlp_plan
    bad = tmp_path / "bad.opsplan"
    if kind in ("external", "custom-domain"):
        blob = _onnx_with(kind)

        def point_at(doc):
            doc["regions"][0].update(bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())
        _rewrite(path, bad, doc_edit=point_at, members={"regions/region0.bin": blob})
        says = "external file" if kind == "external" else "custom domain com.evil"
    elif kind == "checksum":
        def shorter(doc):
            doc["regions"][0]["sha256"] = "0" * 64
        _rewrite(path, bad, doc_edit=shorter)
        says = "regions/region0.bin does not match its checksum"
    else:
        _rewrite(path, bad, members={"regions/region7.bin": b"\0" * 64})
        says = "holds regions/region7.bin, which its plan.json does not name"
    r = cli("run", "demo:mlp", "--plan", bad)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr, r.stderr
    assert says in r.stderr, r.stderr
