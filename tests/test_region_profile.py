"""`opscope profile -b onnxruntime|openvino|xla` stores a region's per-op spans from the stack's own profiler as
child events of the region's event: ops, module paths, FLOPs, a parent and the stack's clock; at least 90% of the
region's nodes are covered, the children's time is the region's time (within 10%: an accounting check, the spans
are laid inside the region's), and `show --json` counts them."""
import json

import pytest

from opscope.profiler.store import RunStore

# the module a stack needs, and the clock its spans must name
STACKS = {"onnxruntime": ("onnxruntime", "onnxruntime profiler"), "openvino": ("openvino", "openvino PERF_COUNT"),
          "xla": ("jax", "xla profiler")}


def profile(cli, backend: str, steps: int = 3) -> tuple[str, RunStore, dict]:
    r = cli("profile", "demo:gpt", "-b", backend, "--steps", str(steps), "--json")
    assert r.returncode == 0, r.stderr
    run_id = json.loads(r.stdout)["run_id"]
    store = RunStore()
    (config,) = store.query("SELECT config FROM runs WHERE run_id = ?", [run_id])[0]
    return run_id, store, json.loads(config)["placement"]


def events(store, run_id, depth):
    cols = ["step", "seq", "op", "node", "module", "flops", "parent", "clock", "start_ns", "end_ns", "source"]
    rows = store.query(f"SELECT {', '.join(cols)} FROM events WHERE run_id = ? AND depth = ? ORDER BY step, seq",
                       [run_id, depth])
    return [dict(zip(cols, r)) for r in rows]


@pytest.mark.multiprocess
@pytest.mark.parametrize("stack", list(STACKS))
def test_a_stacks_profile_stores_each_regions_ops_beneath_it(cli, stack):
    module, clock = STACKS[stack]
    pytest.importorskip(module)
    run_id, store, placement = profile(cli, stack)
    (region,) = placement["regions"]
    regions, children = events(store, run_id, 0), events(store, run_id, 1)
    assert [(e["step"], e["op"], e["parent"]) for e in regions] == [(k, "region", "") for k in range(3)]
    members, shares = None, []
    for parent in regions:
        mine = [c for c in children if c["step"] == parent["step"]]
        assert {c["parent"] for c in mine} == {"region0"}
        assert len({c["clock"] for c in mine}) == 1 and mine[0]["clock"].startswith(clock)   # the clock is named
        covered = {n for c in mine for n in c["node"].split(",")}
        assert len(covered) >= 0.9 * region["nodes"]      # fused, folded and bitcast nodes included
        members = members or covered
        assert covered == members                         # every step maps the same nodes
        assert all(parent["start_ns"] <= c["start_ns"] <= c["end_ns"] <= parent["end_ns"] for c in mine)
        measured = parent["end_ns"] - parent["start_ns"]
        shares.append(sum(c["end_ns"] - c["start_ns"] for c in mine) / measured)
        assert min(c["seq"] for c in mine) > parent["seq"]        # child seqs follow the plan's
    # the children's time is the region's: never more (spans that overlap would count twice), and within 10 % in
    # a step the host left alone. NOTE: a host loaded far past its cores (eight test runs on two) preempts the
    # stack between kernels -- time no kernel spent -- in any step; a mapping or placement that lost time (an
    # unmapped span, a request's first inference outside its layers: 75 %) loses it in every step
    assert max(shares) <= 1.1 and max(shares) >= 0.9, shares
    if stack in ("openvino", "xla"):
        # their per-op times do not fit the call (OpenVINO's add to 1.05-1.6x it, XLA's thunks left 52% of a step
        # uncovered): scaled to it, and the clock says so -- every step covered, no op that ran given 0 ns
        assert all(0.9 <= x <= 1.1 for x in shares), shares
        assert all(c["end_ns"] > c["start_ns"] for c in children), [c["node"] for c in children
                                                                     if c["end_ns"] <= c["start_ns"]]
        assert "scaled" in children[0]["clock"]
    # op names, module paths and FLOPs from the members each span covers
    assert {"linear", "layer_norm", "scaled_dot_product_attention"} <= {o for c in children for o in c["op"].split("+")}
    qkv = [c for c in children if c["module"] == "h.0.attn.qkv" and "linear" in c["op"].split("+")]
    assert qkv and all(c["flops"] > 0 and c["source"] for c in qkv)
    if stack == "onnxruntime":
        assert qkv[0]["source"].split()[0] in ("Gemm", "MatMul", "FusedMatMul")
    r = cli("show", run_id, "--by", "op", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["ops"]
    # a span the stack fused is one row named by every op it covers (`linear+gelu`)
    assert {"region", "linear", "layer_norm", "scaled_dot_product_attention"} <= \
        {op for row in rows for op in row["op"].split("+")}
    # the region's children are subtracted from its self time: each nanosecond counted once (was region 50 %,
    # linear 48 %: a stack's device was read as a device stream, whose ops never nest)
    (reg,) = [row for row in rows if row["op"] == "region"]
    assert reg["self_ns"] < 0.5 * reg["total_ns"]            # what no kernel spent, not the children again
    assert sum(row["share"] for row in rows) == pytest.approx(1.0)


def _stack_run(store, device: str) -> str:
    """A region (depth 0) on `device` with two stack spans beneath it (depth 1, parent the region's node)."""
    from opscope.profiler.schema import EVENT_COLUMNS
    rid = store.create_run(model="m", backend="onnxruntime", device=device)
    ev = [(0, 0, "region", "region0", 0, 1000, 0, "", ""), (0, 1, "linear", "region0/mm", 100, 700, 1, "region0", "ort"),
          (0, 2, "gelu", "region0/gelu", 700, 900, 1, "region0", "ort"),
          (1, 3, "region", "region0", 2000, 2500, 0, "", ""), (1, 4, "linear", "region0/mm", 2000, 2400, 1, "region0", "ort")]
    cols = {c: [] for c in EVENT_COLUMNS[1:]}
    for step, seq, op, node, start, end, depth, parent, clock in ev:
        row = dict(step=step, seq=seq, op=op, node=node, module="h.0", source="", backend="onnxruntime",
                   device=device, thread=1, depth=depth, start_ns=start, end_ns=end, input_shapes="[]",
                   input_dtypes="[]", output_shapes="[]", output_dtypes="[]", bytes=0, flops=0, fallback=False,
                   live_bytes=0, phase="forward", fwd_node="", rank=0, world_size=1, parent=parent, clock=clock)
        for c in cols:
            cols[c].append(row[c])
    store.add_event_columns(rid, cols)
    return rid


@pytest.mark.parametrize("device", ["onnxruntime:CPUExecutionProvider", "openvino:CPU", "xla:cuda"])
def test_a_stacks_region_self_time_leaves_out_its_children(device):
    from opscope.profiler import stats
    from opscope.runtime import registry
    assert set(stats.HOST_TIMED) >= set(registry.names("regions"))
    store = RunStore()
    rid = _stack_run(store, device)
    for finished in (False, True):                    # live, then from the finished run's cache
        s = {x["key"]: x for x in store.op_stats(rid)}
        assert (s["region"]["total_ns"], s["region"]["self_ns"]) == (1500, 1500 - 800 - 400)
        assert (s["linear"]["self_ns"], s["gelu"]["self_ns"]) == (1000, 200)
        assert s["region"]["share"] == pytest.approx(300 / 1500)
        assert sum(x["share"] for x in s.values()) == pytest.approx(1.0)
        store.finish_run(rid)
    with store.connect(read_only=True) as con:            # the Operators page: a host thread, self shares add to 100 %
        rows = stats.op_breakdown(con, rid)
    assert {r["kind"] for r in rows} == {"host"}
    assert {r["key"]: r["self_pct"] for r in rows}["region"] == pytest.approx(20.0)
    assert sum(r["self_pct"] for r in rows) == pytest.approx(100.0)


def test_a_gpu_stream_is_still_a_device_track():
    from opscope.profiler import stats
    store = RunStore()
    rid = _stack_run(store, "cuda:0")
    with store.connect(read_only=True) as con:
        kinds = {k for (k,) in con.execute(f"SELECT DISTINCT {stats.kind_sql()} FROM events WHERE run_id = ?",
                                           [rid]).fetchall()}
    assert kinds == {"device"}


@pytest.mark.parametrize("device", ["acme:NPU0", "cuda:0"])
def test_a_region_with_children_on_a_track_opscope_does_not_know_counts_each_op_once(device):
    """A vendor's stack (not registered in this process, or device-timed) reporting per-op child spans: the region's
    self time is what its children leave, and self shares add up to 1 -- its time was counted twice (shares 2.0)."""
    store = RunStore()
    rid = _stack_run(store, device)
    for finished in (False, True):
        s = {x["key"]: x for x in store.op_stats(rid)}
        assert (s["region"]["total_ns"], s["region"]["self_ns"]) == (1500, 300)
        assert sum(x["self_ns"] for x in s.values()) <= s["region"]["total_ns"]
        assert sum(x["share"] for x in s.values()) == pytest.approx(1.0)
        store.finish_run(rid)


def test_xla_regions_split_by_a_refused_op_each_map_their_own_spans(tmp_path):
    """Several XLA regions share jax's one profiler session: each must take only the thunks that ran inside its
    own calls (their instructions' names -- fusion.1, ... -- repeat from one compiled program to the next)."""
    pytest.importorskip("jax")
    from opscope.runtime.backends import BUNDLED
    from opscope.runtime.regions import RegionProfile
    from opscope.runtime.session import open_session
    chip = tmp_path / "xla-nogelu.toml"
    chip.write_text((BUNDLED / "xla.toml").read_text().replace('name = "xla"', 'name = "xla-nogelu"')
                    .replace("unsupported = []", 'unsupported = ["gelu"]'))
    s = open_session("demo:gpt", str(chip))
    regions = {st.node.name: st.node for st in s.plan.steps if st.node.op == "region"}
    assert len(regions) >= 2

    class Spans:
        calls: dict = {}

        def after_op(self, call):
            self.calls[call.node.name] = (call.start_ns, call.end_ns)
    prof, spans = RegionProfile(), Spans()
    with s.executor.hooked(prof, spans):
        s.run()
    assert {name for _, name in prof.children} == set(regions)
    shares = []
    for (_, name), children in prof.children.items():
        lo, hi = spans.calls[name]
        members = {m.name for m in regions[name].attrs["members"]}
        assert children and all(lo <= c.start_ns <= c.end_ns <= hi and c.region == name for c in children)
        assert {n for c in children for n in c.nodes} == members          # its own members, all of them
        assert all(c.clock.startswith("xla profiler") for c in children)
        shares.append(sum(c.end_ns - c.start_ns for c in children) / (hi - lo))
    # each region's own thunks fill its call; another region's, moved onto it, would not (the median region: a
    # host that preempted one call for a second must not decide)
    assert sorted(shares)[len(shares) // 2] >= 0.5 and max(shares) <= 1.1, shares


@pytest.mark.parametrize("durations", [[500, 0, 300, 700], [900, 900, 900], [10, 20], [0, 0, 0], [5] * 40])
def test_per_op_durations_that_do_not_fit_the_call_are_scaled_to_it_end_to_end_and_none_is_0_ns(durations):
    from opscope.runtime.regions import RegionProgram
    spans = RegionProgram.fitted(durations, 1_000, 2_000)      # 1.5x the call, 0.03x, zeros: all fit it exactly
    assert spans[0][0] == 1_000 and spans[-1][1] == 2_000
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))          # end to end, in the stack's order
    assert all(e > s for s, e in spans)                                  # an op that ran took time
    if sum(durations):                                                   # the longest op keeps the longest span
        widths = [e - s for s, e in spans]
        assert max(widths) - widths[durations.index(max(durations))] <= 1         # rounding at most


@pytest.mark.slow
@pytest.mark.multiprocess
def test_openvinos_training_profile_gives_every_region_of_every_step_spans_that_fill_it_none_of_0_ns(cli):
    """`profile --train` on OpenVINO: demo:mlp's step is three regions (the optimizer on the fallback), the middle
    one a lone ones_like that OpenVINO folds to a constant -- no layer of it runs, and its region had no span at all
    in any step. Each region's spans lie end to end inside its call, in every step, none 0 ns. (No timing bound:
    the spans fill the call by construction; what is checked is that no region, step or op is left out.)"""
    pytest.importorskip("openvino")
    r = cli("profile", "demo:mlp", "--train", "-b", "openvino", "--steps", "3", "--json")
    assert r.returncode == 0, r.stderr
    run_id, store = json.loads(r.stdout)["run_id"], RunStore()
    regions, children = events(store, run_id, 0), events(store, run_id, 1)
    regions = [e for e in regions if e["op"] == "region"]
    names = {e["node"] for e in regions}
    assert len(names) > 1 and sorted({e["step"] for e in regions}) == [0, 1, 2]
    for parent in regions:
        mine = [c for c in children if c["step"] == parent["step"] and c["parent"] == parent["node"]]
        assert mine, (parent["step"], parent["node"])
        assert all(c["end_ns"] > c["start_ns"] for c in mine), [c["node"] for c in mine if c["end_ns"] <= c["start_ns"]]
        assert all(parent["start_ns"] <= c["start_ns"] and c["end_ns"] <= parent["end_ns"] for c in mine)
        spans = sorted((c["start_ns"], c["end_ns"]) for c in mine)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))           # end to end: no time counted twice
        assert "scaled" in mine[0]["clock"]
    assert "ones_like" in {o for c in children for o in c["op"].split("+")}      # the folded region's op
