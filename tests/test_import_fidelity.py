"""Import fidelity (issue 15, point 4): a torch.profiler trace recorded here with everything switched on
(record_shapes, with_stack, profile_memory, a schedule and record_function around each step) imports with
what torch.profiler, TensorBoard and Perfetto show of it -- and what it does not keep is listed by kind."""
import inspect
import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from opscope.profiler.importers import import_trace
from opscope.profiler.store import RunStore

STEPS = 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)
        self.norm = torch.nn.LayerNorm(32)
        self.conv = torch.nn.Conv1d(1, 4, 3, stride=2, padding=1)

    def forward(self, x):
        h = self.norm(self.fc1(x))
        y = self.fc2(torch.nn.functional.gelu(h))
        mixed = attention(y)
        return self.conv(mixed.reshape(-1, 1, 8)).sum()


def attention(y):
    scores = torch.bmm(y[None], y.t()[None])
    return torch.matmul(scores, y[None])


def _line(fn) -> int:
    """torch.profiler's Python frames name a function by the line it starts on (its `def`)."""
    return inspect.getsourcelines(fn)[1]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("fidelity") / "bert_like.pt.trace.json"
    torch.manual_seed(0)
    model, x = Net(), torch.randn(8, 16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                with_stack=True, profile_memory=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=STEPS, repeat=1)) as prof:
        for _ in range(STEPS + 1):
            with torch.profiler.record_function("train_step"):
                model(x)
            prof.step()
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def doc(trace):
    return json.loads(trace.read_text())


def _kind(e):
    cat = e.get("cat")
    return cat if isinstance(cat, str) and cat else f"ph:{e.get('ph')}"


def test_steps_annotations_and_every_kind_accounted_for(trace, doc, cli):
    r = cli("trace", "import", trace, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rid = out["run_id"]
    store = RunStore()
    run = store.get_run(rid)
    assert run["steps"] == STEPS
    assert set(store.events_frame(rid, columns=["step"])["step"].tolist()) == set(range(STEPS))

    # ProfilerStep#N and the record_function spans are spans of their own, one per step, never ops
    sp = store.spans_frame(rid)
    names = Counter(n for k, n in zip(sp["kind"].tolist(), sp["name"].tolist()) if k == "user_annotation")
    assert names["train_step"] == STEPS
    assert sum(c for n, c in names.items() if n.startswith("ProfilerStep#")) == STEPS
    assert sorted(store.query("SELECT DISTINCT step FROM spans WHERE run_id = ? AND name = 'train_step'", [rid])) \
        == [(s,) for s in range(STEPS)]
    ops = {r["key"] for r in store.op_stats(rid, by="node")}
    assert "train_step" not in ops and not any(k.startswith("ProfilerStep#") for k in ops)

    # no kind silently dropped: each one in the file is kept (and says where) or listed, with its count
    total = Counter(_kind(e) for e in doc["traceEvents"])
    acc = run["config"]["import"]
    kept, dropped = Counter(acc["kinds_kept"]), Counter(acc["kinds_dropped"])
    assert kept + dropped == total
    for kind in ("cpu_op", "python_function", "user_annotation", "cpu_instant_event"):
        assert kind in kept and kind not in dropped, kind
    assert set(acc["stored_as"]["python_function"]) == {"stacks"}
    assert set(acc["stored_as"]["cpu_instant_event"]) == {"memory"}
    assert out["skipped"] == acc["kinds_dropped"]          # what `trace import --json` prints


def test_python_stacks_sources_and_modules(trace, doc):
    rid = import_trace(trace)
    store = RunStore()
    st = store.stacks_frame(rid)
    n_py = sum(e.get("cat") == "python_function" for e in doc["traceEvents"])
    assert len(st["frame"]) == n_py
    here = Path(__file__).name
    frames = set(st["frame"].tolist())
    assert f"forward ({here}:{_line(Net.forward)})" in frames and f"attention ({here}:{_line(attention)})" in frames
    assert "nn.Module: Linear_0" in frames and max(st["depth"].tolist()) >= 3

    rows = store.query("SELECT node, source, module FROM events WHERE run_id = ? AND depth = 0 AND node IN "
                       "('aten::linear', 'aten::bmm', 'aten::conv1d', 'aten::layer_norm')", [rid])
    by_node: dict = {}
    for node, source, module in rows:
        by_node.setdefault(node, set()).add((source, module))
    # the innermost frame of the user's own code (not torch/nn/modules/linear.py) is the source line
    assert {s for s, _ in by_node["aten::linear"]} == {f"{here}:{_line(Net.forward)}"}
    assert {s for s, _ in by_node["aten::bmm"]} == {f"{here}:{_line(attention)}"}
    # the module path is the chain of nn.Module frames around the op
    assert {m for _, m in by_node["aten::linear"]} == {"Net_0.Linear_0", "Net_0.Linear_1"}
    assert {m for _, m in by_node["aten::conv1d"]} == {"Net_0.Conv1d_0"}
    assert {m for _, m in by_node["aten::bmm"]} == {"Net_0"}


def test_memory_samples_at_the_op_that_allocated(trace, doc):
    rid = import_trace(trace)
    store = RunStore()
    mem = [e for e in doc["traceEvents"] if e.get("name") == "[memory]"]
    assert mem
    m = store.memory_frame(rid)
    assert len(m["t_ns"]) == len(mem)
    assert sorted(m["live_bytes"].tolist()) == sorted(e["args"]["Total Allocated"] for e in mem)
    assert set(m["backend"].tolist()) == {"torch:cpu"}
    assert sum(m["alloc_bytes"].tolist()) == sum(e["args"]["Bytes"] for e in mem if e["args"]["Bytes"] > 0)
    joined = store.query("SELECT e.node FROM memory m JOIN events e ON e.run_id = m.run_id AND e.step = m.step "
                         "AND e.seq = m.seq WHERE m.run_id = ?", [rid])
    # a sample inside an op belongs to the innermost op around it (frees outside every op belong to none)
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    inside = [e for e in mem if any(o["tid"] == e["tid"] and o["ts"] <= e["ts"] <= o["ts"] + o["dur"] for o in ops)]
    assert len(joined) == len(inside) > 0 and "aten::empty" in {n for n, in joined}


def test_flops_and_bytes_of_the_matmul_family_from_recorded_shapes(trace):
    rid = import_trace(trace)
    store = RunStore()
    got = {}
    for node, flops, nbytes in store.query("SELECT node, flops, bytes FROM events WHERE run_id = ? AND step = 0 "
                                           "AND flops IS NOT NULL", [rid]):
        got.setdefault(node, []).append((flops, nbytes))
    linear = sorted(got["aten::linear"])
    assert linear == sorted([(2 * 8 * 16 * 32 + 8 * 32, 4 * (8 * 16 + 32 * 16 + 32 + 8 * 32)),
                             (2 * 8 * 32 * 8 + 8 * 8, 4 * (8 * 32 + 8 * 32 + 8 + 8 * 8))])
    assert got["aten::bmm"] == [(2 * 1 * 8 * 8 * 8, 4 * (64 + 64 + 64))]
    assert got["aten::matmul"] == [(2 * 1 * 8 * 8 * 8, 4 * (64 + 64 + 64))]
    # conv1d: 8 rows of length 8, 4 filters of 3 taps, stride 2 and padding 1 -> 8 x 4 x 4 out
    assert got["aten::conv1d"][0][0] == 2 * (8 * 4 * 4) * (1 * 3)
    # counted once per nest: the addmm inside linear, the bmm inside matmul, the convolutions inside conv1d
    nested = store.query("SELECT count(*) FROM events WHERE run_id = ? AND flops IS NOT NULL AND depth > 0 AND node "
                         "IN ('aten::addmm', 'aten::convolution', 'aten::_convolution')", [rid])[0][0]
    assert nested == 0
    # so the roofline has points: ops with FLOPs and bytes
    assert any(r["flops"] and r["bytes"] for r in store.op_stats(rid))
