"""Saved execution plans (.opsplan): compile then load gives eager's outputs without capturing,
refuses stale, foreign and damaged plans with one line (exit 2), and the loader survives fuzzing."""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from opscope.runtime import models, open_session
from opscope.runtime.backends import BUNDLED
from opscope.runtime.errors import UsageError
from opscope.runtime.passes.plan_file import compile_to_file, load_plan, open_plan_session, read_plan
from opscope.runtime.session import compare


@pytest.fixture(scope="module")
def gpt_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans") / "gpt.opsplan"
    info = compile_to_file(path, "demo:gpt", "sim:npu-a1")
    return path, info


def test_compile_then_run_plan_gives_fresh_capture_outputs_without_capturing(gpt_plan, monkeypatch):
    path, info = gpt_plan
    assert info["passes"] == ["dce", "fold", "cse", "layout", "fuse", "memplan"] and info["format"] == "opscope-plan"
    fresh = open_session("demo:gpt", "sim:npu-a1")

    def no_export(*a, **k):
        raise AssertionError("a saved plan must start without torch.export")
    monkeypatch.setattr("torch.export.export", no_export)
    s = open_plan_session(path, "demo:gpt")
    out, want = s.run_host(), fresh.run_host()
    assert compare(out, want)["max_abs"] <= 1e-5 and compare(out, s.eager())["max_abs"] <= 1e-4
    plan = s.extra["plan"]
    assert plan["backend"] == "sim:npu-a1" and any(n.op == "fused" for n in s.plan.graph.nodes)
    # start-up is reported beside the capture it replaced (how much it saves: benchmarks/bench_passes.py)
    assert plan["saved_seconds"] == pytest.approx(plan["capture_seconds"] - plan["startup_seconds"])
    assert s.plan.memory_plan["peak_bytes"] == info["memory_plan"]["peak_bytes"]


def test_plan_holds_no_weights_but_names_them(gpt_plan):
    path, _ = gpt_plan
    doc, files = read_plan(path)
    params = [c["param"] for c in doc["graph"]["constants"].values() if c and "param" in c]
    assert "lm_head.weight" in params and "h.0.attn.qkv.weight" in params
    assert sum(map(len, files.values())) < 200_000        # only the folded position embedding is inline
    assert doc["versions"]["torch"] and doc["backend"]["digest"]


def test_plan_refused_after_its_description_changed_and_recompiled_on_request(tmp_path, opscope_home):
    chip = opscope_home / "backends" / "chip.toml"
    chip.parent.mkdir(parents=True, exist_ok=True)
    text = (BUNDLED / "npu-a1.toml").read_text().replace('name = "npu-a1"', 'name = "chip"')
    chip.write_text(text)
    path = tmp_path / "mlp.opsplan"
    compile_to_file(path, "demo:mlp", "sim:chip", passes="fuse,memplan")
    assert open_plan_session(path, "demo:mlp").run_host()
    chip.write_text(text.replace("memory_bandwidth = 1.6e12", "memory_bandwidth = 1.0e12"))
    with pytest.raises(UsageError, match=r"description of sim:chip changed since the plan was compiled.*--recompile"):
        open_plan_session(path, "demo:mlp")
    s = open_plan_session(path, "demo:mlp", recompile=True)
    assert s.extra["plan"]["recompiled"] and s.extra["plan"]["passes"] == ["fuse", "memplan"]
    assert open_plan_session(path, "demo:mlp").run_host()          # the rewritten plan loads as it is


def test_plan_for_another_backend_or_model_is_refused(tmp_path):
    path = tmp_path / "mlp.opsplan"
    compile_to_file(path, "demo:mlp", "numpy", passes="all")
    with pytest.raises(UsageError, match=r"is for backend numpy, not torch:cpu"):
        open_plan_session(path, "demo:mlp", "torch:cpu")
    with pytest.raises(UsageError, match=r"compiled for another model"):
        open_plan_session(path, "demo:cnn")


def test_train_plan_runs_the_training_step(tmp_path):
    path = tmp_path / "train.opsplan"
    info = compile_to_file(path, "demo:mlp", "numpy", passes="all", train=True)
    assert info["nodes"] > 5
    model, inputs = models.load_train("demo:mlp")
    loaded = load_plan(path, model=model, inputs=inputs)
    losses = [float(np.asarray(loaded.executor.run(*inputs)[0])) for _ in range(3)]
    assert losses[-1] < losses[0] and loaded.plan.carry


def test_compile_cli_json_and_bad_input_exit_2(cli, tmp_path):
    out = tmp_path / "m.opsplan"
    r = cli("compile", "demo:mlp", "-b", "numpy", "--passes", "fuse,memplan", "-o", out, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["passes"] == ["fuse", "memplan"] and doc["memory_plan"]["peak_bytes"] > 0 and out.is_file()
    r = cli("compile", "demo:mlp", "--passes", "fusion", "-o", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "unknown pass 'fusion'" in r.stderr


def _damaged(path, tmp_path, how):
    data = path.read_bytes()
    bad = tmp_path / "bad.opsplan"
    bad.write_bytes(how(data))
    return bad


@pytest.mark.parametrize("how,message", [
    (lambda d: d[: len(d) // 2], "corrupted or truncated"),
    (lambda d: b"", "corrupted or truncated"),
    (lambda d: b"PK\x03\x04" + b"\x00" * 64, "corrupted or truncated"),
])
def test_truncated_or_corrupted_plan_is_one_line_exit_2(cli, gpt_plan, tmp_path, how, message):
    path, _ = gpt_plan
    bad = _damaged(path, tmp_path, how)
    with pytest.raises(UsageError, match=message):
        read_plan(bad)


def test_edited_plan_fails_its_checksum(tmp_path):
    path = tmp_path / "m.opsplan"
    compile_to_file(path, "demo:mlp", "numpy", passes="none")
    with zipfile.ZipFile(path) as z:
        body, digest = z.read("plan.json"), z.read("plan.sha256")
    edited = tmp_path / "edited.opsplan"
    with zipfile.ZipFile(edited, "w") as z:
        z.writestr("plan.json", body.replace(b'"relu"', b'"gelu"'))
        z.writestr("plan.sha256", digest)
    with pytest.raises(UsageError, match="checksum does not match"):
        read_plan(edited)


@pytest.fixture(scope="module")
def mlp_doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "mlp.opsplan"
    compile_to_file(path, "demo:mlp", "numpy", passes="all")
    doc, _ = read_plan(path)
    model, inputs = models.load("demo:mlp")
    return path.read_bytes(), doc, model, inputs


def _zip(doc_bytes: bytes) -> bytes:
    import hashlib
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("plan.json", doc_bytes)
        z.writestr("plan.sha256", hashlib.sha256(doc_bytes).hexdigest())
    return buf.getvalue()


def _load_or_refuse(tmp_path, data, model, inputs):
    p = tmp_path / "fuzz.opsplan"
    p.write_bytes(data)
    try:
        load_plan(p, model=model, inputs=inputs)
    except UsageError as e:
        assert "\n" not in str(e)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0), flip=st.integers(min_value=0), byte=st.integers(0, 255))
def test_fuzz_damaged_archives_never_raise_anything_but_a_usage_error(mlp_doc, tmp_path, cut, flip, byte):
    data, _, model, inputs = mlp_doc
    damaged = bytearray(data[: cut % (len(data) + 1)] if cut % 3 == 0 else data)
    if damaged:
        damaged[flip % len(damaged)] = byte
    _load_or_refuse(tmp_path, bytes(damaged), model, inputs)


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                     max_leaves=12)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.lists(st.sampled_from(["graph", "nodes", 0, 1, "args", "attrs", "inputs", "outputs", "output_meta",
                                      "target", "constants", "slot_meta", "output_refs", "carry", "placement",
                                      "passes", "num_slots", "input_slots", "0", "6"]), min_size=1, max_size=4),
       value=_JSON)
def test_fuzz_well_formed_archives_with_odd_json_are_refused_in_one_line(mlp_doc, tmp_path, path, value):
    """A plan with a valid checksum whose plan.json has any field replaced by any JSON value."""
    _, doc, model, inputs = mlp_doc
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            break
    last = path[-1]
    if isinstance(node, dict):
        node[str(last)] = value
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = value
    _load_or_refuse(tmp_path, _zip(json.dumps(doc).encode()), model, inputs)


def test_run_plan_from_the_cli_matches_eager_and_refuses_another_backend(cli, gpt_plan):
    """`opscope run MODEL --plan FILE`: the plan's backend unless -b says otherwise; -b of another backend refused."""
    path, _ = gpt_plan
    r = cli("run", "demo:gpt", "--plan", path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["max_abs_err"] < 1e-4 and doc["plan"]["startup_seconds"] >= 0
    other = "numpy" if doc["backend"] != "numpy" else "torch:cpu"
    r = cli("run", "demo:gpt", "--plan", path, "-b", other)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("run", "demo:gpt", "--plan", path, "--capture", "dynamo")
    assert r.returncode == 2 and "--plan" in r.stderr


def test_compile_into_a_folder_that_does_not_exist_is_one_line_exit_2(cli, tmp_path):
    r = cli("compile", "demo:mlp", "-b", "numpy", "-o", tmp_path / "no" / "such" / "x.opsplan")
    assert r.returncode == 2 and "does not exist" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_plan_whose_members_claim_absurd_sizes_is_refused_before_reading(tmp_path):
    """Reads are bounded by the archive's own sizes: an oversized checksum member is refused unread."""
    bad = tmp_path / "big.opsplan"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("plan.json", "{}")
        z.writestr("plan.sha256", "0" * (1 << 20))
    with pytest.raises(UsageError, match="not a checksum"):
        read_plan(bad)
