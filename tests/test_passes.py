"""The pass pipeline (runtime/passes): every pass keeps outputs within 1e-4 of eager PyTorch on the
demos and on every kind of backend, fusion saves on a sim chip what the cost model says, the memory
plan's peak is known before the run and is what the run measures."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from opscope.runtime import backends, models
from opscope.runtime.capture import capture
from opscope.runtime.errors import UsageError
from opscope.runtime.executor import Executor, compile_plan
from opscope.runtime.graph import Graph, Node, Ref, TensorMeta
from opscope.runtime.passes import NAMES, optimize, pass_names
from opscope.runtime.passes.fuse import fusion_gain, members
from opscope.runtime.roofline import node_seconds
from opscope.runtime.session import compare, eager_outputs

_CACHE: dict = {}


def captured(spec):
    if spec not in _CACHE:
        model, inputs = models.load(spec)
        _CACHE[spec] = (model, inputs, capture(model, inputs, spec), eager_outputs(model, inputs))
    return _CACHE[spec]


@pytest.mark.parametrize("spec", ["demo:mlp", "demo:cnn", "demo:gpt"])
@pytest.mark.parametrize("backend", ["numpy", "torch:cpu", "sim:npu-a1"])
@pytest.mark.parametrize("name", list(NAMES) + ["all"])
def test_every_pass_keeps_outputs_within_1e4_of_eager(spec, backend, name):
    model, inputs, graph, ref = captured(spec)
    b = backends.resolve(backend)
    # layout acts only where the chip prefers NHWC: ask for it everywhere, so every backend runs it
    plan = compile_plan(graph, b, passes=name, pass_options={"layout": "nhwc"})
    out = Executor(plan).run_host(*inputs)
    assert compare(out, ref)["max_abs"] <= 1e-4
    assert [e["pass"] for e in plan.pass_log] == pass_names(name)
    assert len(graph.nodes) == len(captured(spec)[2].nodes)      # the captured graph itself is untouched


def test_pass_log_says_what_changed_on_gpt():
    _, _, graph, _ = captured("demo:gpt")
    g, log = optimize(graph, backends.resolve("numpy"), "all")
    by = {e["pass"]: e for e in log.entries}
    assert any("arange" in c for c in by["fold"]["changes"])                    # positions are a constant
    assert len(by["fuse"]["changes"]) == 9 and "add -> layer_norm" in by["fuse"]["changes"][0]
    assert by["fuse"]["nodes_after"] == by["fuse"]["nodes_before"] - 9
    assert by["layout"]["requires"] == ["hardware.preferred_layout"]
    assert len(g.nodes) < len(graph.nodes)


def test_fused_node_keeps_its_members_readable():
    _, inputs, graph, _ = captured("demo:gpt")
    plan = compile_plan(graph, backends.resolve("numpy"), passes="fuse")
    seen = []

    class Hook:
        def after_op(self, call):
            seen.append(call.node)

    with Executor(plan).hooked(Hook()) as ex:
        ex.run(*inputs)
    fused = [n for n in seen if n.op == "fused"]
    assert len(fused) == 9
    f = fused[1]
    assert [m.op for m in members(f)] == ["add", "layer_norm"] == f.attrs["member_ops"]
    assert f.name == "fused[add_1+layer_norm_1]"
    assert members(f)[1].module_path == "h.0.ln_2" and members(f)[0].source.endswith("gpt.py:44")
    assert f.module_path == "h.0" and len(f.outputs) == 2       # the residual leaves the kernel too


def test_dce_removes_noops_and_dead_code_and_cse_shares():
    class M(torch.nn.Module):
        def forward(self, x):
            a = x.view(x.shape).to(torch.float32)         # a same-shape view and a same-dtype cast
            unused = torch.exp(x)                         # noqa: F841 -- dead
            return torch.relu(a) + torch.relu(a)          # the same relu twice

    x = torch.randn(4, 8)
    g = capture(M(), (x,), "m")
    new, log = optimize(g, backends.resolve("numpy"), "dce,cse")
    changes = {e["pass"]: e["changes"] for e in log.entries}
    assert any("no-op view" in c for c in changes["dce"]) and any("dead exp" in c for c in changes["dce"])
    assert len(changes["cse"]) == 1 and "relu" in changes["cse"][0]
    assert [n.op for n in new.nodes] == ["relu", "add"]
    out = Executor(compile_plan(new, backends.resolve("numpy"), passes="none")).run_host(x)
    assert np.allclose(out[0], 2 * torch.relu(x).numpy())


def test_unknown_pass_name_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown pass 'fusion'.*dce, fold"):
        pass_names("fuse,fusion")


def _chain_graph():
    """x -> add(x, y) -> mul(., 2) -> relu -> sum: a pointwise chain and its reduction."""
    m = TensorMeta((64, 1024), "float32")
    meta = {0: m, 1: m, 2: m, 3: m, 4: m, 5: TensorMeta((), "float32")}
    aten = torch.ops.aten

    def node(i, name, op, target, args, ins, out):
        return Node(i, name, op, target, args, {}, ins, [out], [meta[s] for s in ins], [meta[out]])
    nodes = [node(0, "add", "add", aten.add.Tensor, (Ref(0), Ref(1)), [0, 1], 2),
             node(1, "mul", "mul", aten.mul.Tensor, (Ref(2), 2.0), [2], 3),
             node(2, "relu", "relu", aten.relu.default, (Ref(3),), [3], 4),
             node(3, "sum", "sum", aten.sum.default, (Ref(4),), [4], 5)]
    return Graph(nodes, 6, [0, 1], {}, [Ref(5)], meta, "chain")


def test_fusion_saves_on_a_sim_chip_what_the_cost_model_predicts():
    g = _chain_graph()
    b = backends.resolve("sim:npu-a1")
    d = b.description
    fused, _ = optimize(g, b, "fuse")
    (f,) = fused.nodes
    assert f.op == "fused" and [m.op for m in members(f)] == ["add", "mul", "relu", "sum"]
    # the arithmetic: one launch, and only the external bytes (two inputs in, one scalar out)
    assert f.bytes_moved == 2 * 64 * 1024 * 4 + 4
    assert f.flops == sum(m.flops for m in members(f))
    want = max(f.flops / d.peak("float32"), f.bytes_moved / d.memory_bandwidth) + d.launch_overhead
    assert node_seconds(f, d) == pytest.approx(want)
    unfused = sum(node_seconds(n, d) for n in g.nodes)
    assert fusion_gain(fused, d) == pytest.approx(unfused - want)
    assert fusion_gain(fused, d) >= 3 * d.launch_overhead      # three launches saved, plus the bytes
    x, y = np.random.rand(64, 1024).astype(np.float32), np.random.rand(64, 1024).astype(np.float32)

    def simulated(graph, passes):
        plan = compile_plan(graph, b, passes=passes)
        ns = []

        class Hook:
            def after_op(self, call):
                ns.append(call.end_ns - call.start_ns)
        ex = Executor(plan)
        with ex.hooked(Hook()):
            out = ex.run_host(x, y)
        return sum(ns), out
    before, a = simulated(g, "none")
    after, c = simulated(g, "fuse")
    assert abs((before - after) - fusion_gain(fused, d) * 1e9) <= 4        # ns rounding, one per op
    assert np.allclose(a[0], c[0], rtol=1e-5)


def test_fusion_lowers_gpt_simulated_step_time_by_the_predicted_amount():
    _, inputs, graph, _ = captured("demo:gpt")
    b = backends.resolve("sim:npu-a1")

    def chip_ns(passes):
        plan = compile_plan(graph, b, passes=passes)
        total = [0]

        class Hook:
            def after_op(self, call):
                if call.backend is b:          # the chip's clock (gelu falls back to the host)
                    total[0] += call.end_ns - call.start_ns
        with Executor(plan).hooked(Hook()) as ex:
            ex.run(*inputs)
        return total[0], plan
    without, _ = chip_ns("none")
    with_fusion, plan = chip_ns("fuse")
    predicted = fusion_gain(plan.graph, b.description) * 1e9
    assert with_fusion < without
    assert abs((without - with_fusion) - predicted) <= len(graph.nodes)


def _measured_peak(plan, inputs):
    """The most bytes held by distinct live buffers after any op (not the plan's own accounting)."""
    ex = Executor(plan)
    box, peaks, accounted = {}, [], []
    env_of = ex._env

    def env(inputs):
        box["env"] = e = env_of(inputs)
        return e
    ex._env = env
    external = set(plan.graph.input_slots) | set(plan.constants)

    def root(a):
        while isinstance(a, np.ndarray) and a.base is not None:
            a = a.base
        return a

    class Hook:
        def after_op(self, call):
            bufs = {id(root(v)): root(v).nbytes for s, v in enumerate(box["env"])
                    if v is not None and s not in external and isinstance(v, np.ndarray)}
            peaks.append(sum(bufs.values()))
            accounted.append(call.live_bytes)
    with ex.hooked(Hook()):
        ex.run(*inputs)
    return max(peaks), max(accounted)


def test_memory_plan_peak_is_known_before_the_run_and_is_what_the_run_measures():
    _, inputs, graph, _ = captured("demo:gpt")
    plan = compile_plan(graph, backends.resolve("numpy"), passes="memplan")
    mp = plan.memory_plan
    planned = plan.peak_bytes
    assert mp["peak_bytes"] == planned and mp["reused"] >= 8
    # against a buffer per value (no liveness at all) the plan needs far less than 0.7
    assert planned <= 0.7 * mp["no_reuse_bytes"]
    measured, accounted = _measured_peak(plan, inputs)
    assert measured == planned == accounted
    log = plan.pass_log[0]["changes"][0]
    assert f"planned peak {planned} bytes" in log


def test_memory_plan_writes_outputs_into_dying_inputs():
    _, inputs, graph, _ = captured("demo:cnn")
    plan = compile_plan(graph, backends.resolve("numpy"), passes="memplan")
    reusing = [st for st in plan.steps if getattr(st.kernel, "reuse", None)]
    assert len(reusing) == plan.memory_plan["reused"] >= 8
    seen = {}

    class Hook:
        def before_op(self, call):
            seen[call.seq] = call.inputs

        def after_op(self, call):
            st = plan.steps[call.seq]
            for k, j in (getattr(st.kernel, "reuse", None) or {}).items():
                assert call.outputs is seen[call.seq][j]      # the same buffer, not a copy
    with Executor(plan).hooked(Hook()) as ex:
        ex.run(*inputs)


def test_layout_pass_keeps_cnn_in_nhwc_with_two_transposes():
    _, inputs, graph, ref = captured("demo:cnn")
    b = backends.resolve("sim:npu-a1")                     # preferred_layout = "nhwc"
    plan = compile_plan(graph, b, passes="layout")
    relayouts = [n for n in plan.graph.nodes if n.op == "relayout"]
    convs = [n for n in plan.graph.nodes if n.op == "conv2d"]
    assert len(relayouts) == 2 and all(n.attrs["layout"] == "nhwc" for n in convs)
    assert "1 transpose(s) in, 1 out" in plan.pass_log[0]["changes"][0]
    assert compare(Executor(plan).run_host(*inputs), ref)["max_abs"] <= 1e-4
    # a chip that prefers NCHW is left alone
    assert compile_plan(graph, backends.resolve("numpy"), passes="layout").pass_log[0]["changes"] == []


def test_description_switches_passes_on_and_off(tmp_path):
    from opscope.runtime.backends import BUNDLED
    text = (BUNDLED / "npu-a1.toml").read_text() + "\n[passes]\nfuse = true\nmemplan = false\n"
    (tmp_path / "chip.toml").write_text(text)
    b = backends.resolve(str(tmp_path / "chip.toml"))
    assert b.description.passes == {"fuse": True, "memplan": False}
    _, _, graph, _ = captured("demo:gpt")
    assert compile_plan(graph, b).passes == ["fuse"]                  # the description's choice
    assert compile_plan(graph, b, passes="none").passes == []          # --passes overrides it
    (tmp_path / "bad.toml").write_text(text.replace("fuse = true", "fuse = 1"))
    with pytest.raises(UsageError, match=r"passes\.fuse: expected true to run the fuse pass"):
        backends.resolve(str(tmp_path / "bad.toml"))
    (tmp_path / "bad2.toml").write_text(text.replace("fuse = true", "fusion = true"))
    with pytest.raises(UsageError, match=r"passes\.fusion: unknown key; expected one of dce, fold"):
        backends.resolve(str(tmp_path / "bad2.toml"))


def test_training_graph_passes_keep_losses_and_phases():
    from opscope.runtime.train.step import OptimizerSpec, Trainer, build_train_graph
    from opscope.runtime.train.joint import capture_joint
    model, inputs = models.load_train("demo:mlp")
    b = backends.resolve("numpy")
    losses = {}
    for passes in ("none", "all"):
        m, ins = models.load_train("demo:mlp")
        tg = build_train_graph(capture_joint(m, ins, "demo:mlp"), OptimizerSpec("sgd", lr=0.05))
        t = Trainer(tg, b, ins)
        t.plan = compile_plan(tg.graph, b, carry=tg.carry, passes=passes)
        t.executor = Executor(t.plan)
        losses[passes] = [t.step() for _ in range(3)]
        if passes == "all":
            fused = [n for n in t.plan.graph.nodes if n.op == "fused"]
            assert all(len({m.attrs.get("phase") for m in members(n)}) == 1 for n in fused)
    assert np.allclose(losses["none"], losses["all"], atol=1e-5)
    assert losses["all"][-1] < losses["all"][0]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_profiled_fused_nodes_name_their_members_in_chrome_export_op_table_and_timeline(cli, tmp_path):
    """Issue 19 point 2: a run on a chip with fusion on keeps each fused node's members -- op, module
    path, source line -- and the Chrome export, the op table and the timeline's details show them."""
    import json
    import re

    from opscope.app.web.server import create_app
    from opscope.profiler.export.chrome import load_chrome, write_chrome
    from opscope.profiler.stats import fused_members
    from opscope.profiler.store import RunStore
    from opscope.runtime.passes.advice import backend_with_passes
    from opscope.runtime.passes.fuse import fused_members as plan_members
    from test_web_security import _callback_body, _server_callbacks

    spec = backend_with_passes("sim:npu-a1", ["fuse"])
    r = cli("profile", "demo:gpt", "-b", spec, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    rid = json.loads(r.stdout)["run_id"]
    store = RunStore()
    _, _, graph, _ = captured("demo:gpt")
    want = plan_members(st.node for st in compile_plan(graph, backends.resolve(spec)).steps)
    assert fused_members(store.get_run(rid)) == want and len(want) == 9      # recorded by the runner
    first = want["fused[add+layer_norm]"]
    assert [m["op"] for m in first] == ["add", "layer_norm"] and first[1]["module"] == "h.0.ln_1"
    assert all(re.search(r"gpt\.py:\d+$", m["source"]) for m in first)

    # Chrome export: every fused X event carries args.members
    out = tmp_path / "t.json"
    write_chrome(store, rid, out)
    fused_ev = [e for e in load_chrome(out)["traceEvents"] if e.get("ph") == "X" and e["name"] == "fused"]
    assert fused_ev and all(e["args"]["members"] == want[e["args"]["node"]] for e in fused_ev)

    # op table: by node, the fused node's member ops; by op, the chains of the `fused` row
    by_node = {s["key"]: s for s in store.op_stats(rid, by="node")}
    assert by_node["fused[add+layer_norm]"]["members"] == "add -> layer_norm"
    assert "members" not in by_node["embedding"]
    fused_row = next(s for s in store.op_stats(rid) if s["key"] == "fused")
    assert "add -> layer_norm (" in fused_row["members"]

    # the web op table grouped by node: a "fused members" column, filled on the fused rows
    app = create_app(store=store)
    c = app.server.test_client()
    status = {"run": rid, "status": "ok", "events": 1, "dropped": 0}
    key, cb = next((k, cb) for k, cb in _server_callbacks(app).items() if "ops-table.rowData" in k)
    resp = c.post("/_dash-update-component", json=_callback_body(key, cb, [status, "node", None]))
    assert resp.status_code == 200, resp.get_data(as_text=True)[-500:]
    table = json.loads(resp.get_data(as_text=True))["response"]["ops-table"]
    assert {"field": "members", "headerName": "fused members"}.items() <= \
        next(col for col in table["columnDefs"] if col.get("field") == "members").items()
    assert {r["key"]: r["members"] for r in table["rowData"]}["fused[add_1+layer_norm_1]"] == "add -> layer_norm"

    # the timeline's details for a fused span list its members with module path and source line
    ev = store.query("SELECT step, seq FROM events WHERE run_id = ? AND node = 'fused[add+layer_norm]' LIMIT 1",
                     [rid])[0]
    key, cb = next((k, cb) for k, cb in _server_callbacks(app).items() if "timeline-details" in k)
    resp = c.post("/_dash-update-component", json=_callback_body(key, cb, [[int(ev[0]), int(ev[1]), 1.0], status]))
    assert resp.status_code == 200, resp.get_data(as_text=True)[-500:]
    body = json.dumps(json.loads(resp.get_data(as_text=True)), ensure_ascii=False)
    assert "member 1: add" in body and "member 2: layer_norm" in body
    assert f"h.0.ln_1 · {first[1]['source']}" in body and first[0]["source"] in body
