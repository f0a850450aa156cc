"""opscope as a torch.compile backend: regions between graph breaks run on any opscope backend."""
import copy
import textwrap

import pytest
import torch
from torch import nn

from opscope.runtime import dynamo
from opscope.runtime.capture import capture
from opscope.runtime.errors import ModelError, UsageError


class Breaky(nn.Module):
    """Two explicit graph breaks: `.item()` and `print`."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.norm(self.a(x)))
        if h.sum().item() > -1e9:
            h = h * 2
        print("python between regions")
        return torch.softmax(self.b(h), -1)


class Expert(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.up = nn.Linear(dim, 32)
        self.down = nn.Linear(32, dim)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


class LoopMoE(nn.Module):
    """A data-dependent expert loop (`for idx in mask.nonzero()`): torch.export cannot capture it.
    TorchDynamo breaks at `.nonzero()`; each expert's own frame is a region, compiled again with
    symbolic shapes once a second token count shows up."""

    def __init__(self, dim=16, experts=4):
        super().__init__()
        self.gate = nn.Linear(dim, experts)
        self.experts = nn.ModuleList(Expert(dim) for _ in range(experts))

    def forward(self, x):
        weights = self.gate(x).softmax(-1)
        top = weights.argmax(-1)
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(top, len(self.experts)).sum(0) > 0
        for idx in mask.nonzero():
            e = int(idx)
            rows = (top == e).nonzero().squeeze(1)
            out[rows] = self.experts[e](x[rows]) * weights[rows, e, None]
        return out


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()          # each test compiles from a clean cache (recompile limits are per code object)
    yield
    torch._dynamo.reset()


def _seeded(cls, *args):
    torch.manual_seed(0)
    return cls(*args).eval()


def test_torch_compile_finds_opscope_by_name_and_counts_regions(capsys):
    m, x = _seeded(Breaky), torch.randn(3, 8)
    opts = {"backend": "numpy"}
    compiled = torch.compile(m, backend="opscope", options=opts)
    with torch.no_grad():
        out, ref = compiled(x), m(x)
    assert (out - ref).abs().max() <= 1e-5
    stats = opts["run"].stats()       # the backend leaves its record in the options it was given
    assert stats["regions"] == 3 and stats["graph_breaks"] == 2 and stats["region_calls"] == 3
    assert len(stats["break_reasons"]) == 2 and any("item()" in r for r in stats["break_reasons"])
    assert set(stats["placement"]["nodes_per_backend"]) == {"numpy"} and stats["nodes"] > 0
    assert capsys.readouterr().out.count("python between regions") == 2   # Python ran what lies between


def test_sim_chip_falls_back_inside_a_region():
    # npu-a1 marks gelu unsupported: that one op runs on numpy, the rest of the region on the chip
    m, x = _seeded(Breaky), torch.randn(3, 8)
    dm = dynamo.compile(m, "sim:npu-a1")
    with torch.no_grad():
        out, ref = dm(x), m(x)
    assert (out - ref).abs().max() <= 1e-5
    place = dm.stats()["placement"]
    fell = {f["op"]: f for f in place["fallback_ops"]}
    assert set(fell) == {"gelu"} and fell["gelu"]["backend"] == "numpy"
    assert place["nodes_per_backend"]["sim:npu-a1"] > place["nodes_per_backend"]["numpy"] and place["transfers"] >= 2


class OpLog:
    def __init__(self):
        self.ops, self.runs = [], []

    def on_run_start(self, info):
        self.runs.append(info.plan.graph.model_name)

    def after_op(self, call):
        self.ops.append((call.op, call.node.module_path, call.backend.name))


def test_hooks_see_every_region_op():
    m, x = _seeded(Breaky), torch.randn(3, 8)
    log, own = OpLog(), OpLog()
    opts = {"backend": "sim:npu-a1", "hooks": [own]}
    compiled = torch.compile(m, backend="opscope", options=opts)
    with torch.no_grad(), dynamo.hooked(log):
        compiled(x)
    run = opts["run"]
    expected = [(st.node.op, st.node.module_path, st.backend.name) for p in run.plans for st in p.steps]
    assert log.ops == expected == own.ops
    assert len(log.runs) == 3 and all("region" in r for r in log.runs)
    assert ("addmm", "a", "sim:npu-a1") in log.ops and ("gelu", "", "numpy") in log.ops
    with torch.no_grad():
        compiled(x)                    # outside the context: only the run's own hooks
    assert len(log.runs) == 3 and len(own.runs) == 6


def test_data_dependent_loop_runs_region_by_region():
    m, x = _seeded(LoopMoE), torch.randn(12, 16)
    with pytest.raises(ModelError, match="capture failed"):
        capture(m, (x,))
    dm = dynamo.compile(m, "sim:npu-a1")
    with torch.no_grad():
        ref = m(x)
        out = dm(x)
        out2 = dm(x + 1)               # other routing: other token counts per expert
        ref2 = m(x + 1)
    assert (out - ref).abs().max() <= 1e-5 and (out2 - ref2).abs().max() <= 1e-5
    stats = dm.stats()
    assert stats["regions"] > 2 and stats["graph_breaks"] == stats["regions"] - 1
    symbolic = [g for g in dm.dynamo.graphs if g.symbolic]   # an expert saw several token counts
    assert symbolic and all(n.module_path.startswith("experts.") and n.source_line
                            for g in symbolic for ex in g.executors for n in ex.plan.graph.nodes)
    paths = {n.module_path for p in dm.dynamo.plans for n in p.graph.nodes}
    hit = {f"experts.{int(e)}.up" for e in torch.cat([m.gate(x).argmax(-1), m.gate(x + 1).argmax(-1)]).unique()}
    assert {"gate"} | hit <= paths


def test_compile_without_options_runs_on_numpy():
    m, x = _seeded(Breaky), torch.randn(3, 8)
    compiled = torch.compile(m, backend="opscope")
    with torch.no_grad():
        assert (compiled(x) - m(x)).abs().max() <= 1e-5
    run = dynamo.last_run()
    assert run.backend.name == "numpy" and run.stats()["regions"] == 3    # one run for all regions


def test_unknown_option_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown option"):
        dynamo.opscope_backend(None, [], options={"backend": "numpy", "colour": "red"})
    with pytest.raises(UsageError, match="unknown backend"):
        dynamo.DynamoRun("nope")


def test_training_step_through_compile_matches_eager():
    # the inference path and the training path are one: AOTAutograd hands over forward and backward
    m = _seeded(Breaky)
    m2 = copy.deepcopy(m)
    m.train(), m2.train()
    x = torch.randn(3, 8)
    dm = dynamo.compile(m2, "numpy")
    opt, opt2 = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(m2.parameters(), lr=0.1)
    log = OpLog()
    for _ in range(3):
        loss = m(x).pow(2).sum()
        loss.backward()
        opt.step(), opt.zero_grad()
        with dm.hooked(log):
            loss2 = dm(x).pow(2).sum()
            loss2.backward()
        opt2.step(), opt2.zero_grad()
        assert abs(loss.item() - loss2.item()) <= 1e-5
    for p, q in zip(m.parameters(), m2.parameters()):
        assert (p - q).abs().max() <= 1e-5
    from opscope.runtime.train.joint import forward_of, phase_of

    back = [n for g in dm.dynamo.graphs if g.kind == "backward" for n in g.graph.nodes]
    assert back and all(phase_of(n) == "backward" for n in back)
    assert all(phase_of(n) == "forward" for g in dm.dynamo.graphs if g.kind == "forward" for n in g.graph.nodes)
    gelu_bw = [n for n in back if n.op == "gelu_backward"]
    assert gelu_bw and forward_of(gelu_bw[0]) == "gelu" and gelu_bw[0].source_line.startswith("h = ")


MODEL_FILE = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)

        def forward(self, x):
            y = self.lin(x).relu()
            if int(y.argmax()) % 2 == 0:     # a data-dependent branch: a graph break
                y = y + 1
            return self.lin(y)

    def factory():
        torch.manual_seed(0)
        return Net().eval(), (torch.randn(4, 6),)
""")


def test_open_dynamo_session_runs_like_a_session(tmp_path):
    f = tmp_path / "net.py"
    f.write_text(MODEL_FILE)
    log = OpLog()
    s = dynamo.open_dynamo_session(f"{f}:factory", "sim:edge-gpu")
    with s.hooked(log):
        out = s.run_host()
    ref = s.eager()
    assert len(out) == len(ref) == 1 and abs(out[0] - ref[0]).max() <= 1e-5
    assert s.dynamo.stats()["regions"] >= 2 and s.backend.name == "sim:edge-gpu"
    assert {"lin"} <= {p for _, p, _ in log.ops} and s.capture_seconds > 0


def test_bad_backend_spec_fails_before_the_model_loads(tmp_path):
    with pytest.raises(UsageError, match="unknown backend"):
        dynamo.open_dynamo_session(str(tmp_path / "missing.py") + ":factory", "nope")


# --- a real model torch.export cannot capture -----------------------------------------------
def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=64, use_cache=False, experts_implementation="eager")
    return MixtralForCausalLM(cfg).eval(), torch.randint(0, 128, (2, 8))


@pytest.mark.slow
def test_mixtral_export_fails_on_the_expert_loop():
    # transformers 5's eager experts: `for expert_idx in expert_hit` over `.nonzero()`
    m, ids = _mixtral()
    with pytest.raises(ModelError, match="GuardOnDataDependentSymNode|data-dependent"):
        capture(m, (ids,))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "sim:npu-a1", "torch:cpu"])
def test_mixtral_runs_through_torch_compile(backend):
    m, ids = _mixtral()
    with torch.no_grad():
        ref = m(ids).logits
    opts = {"backend": backend, "model": m}
    compiled = torch.compile(m, backend="opscope", options=opts)
    with torch.no_grad():
        logits = compiled(ids).logits
    assert (logits - ref).abs().max() <= 1e-4
    stats = opts["run"].stats()
    # per decoder layer: a break at `.nonzero()` and more in the loop over experts
    assert stats["regions"] > 2 and stats["graph_breaks"] > 1
    assert any("modeling_mixtral.py" in r for r in stats["break_reasons"])
    assert stats["placement"]["nodes_per_backend"][backend] > 100
    paths = {n.module_path for p in opts["run"].plans for n in p.graph.nodes}
    assert {"model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.q_proj", "lm_head"} <= paths


# --- opscope run --capture dynamo ------------------------------------------------------------
def _model_file(tmp_path):
    f = tmp_path / "net.py"
    f.write_text(MODEL_FILE.replace("self.lin(x).relu()", "torch.nn.functional.gelu(self.lin(x))"))
    return f"{f}:factory"


def test_cli_run_capture_dynamo_reports_regions(cli, tmp_path):
    import json

    r = cli("run", _model_file(tmp_path), "-b", "sim:npu-a1", "--capture", "dynamo", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["capture"] == "dynamo" and doc["max_abs_err"] <= 1e-4
    assert doc["regions"] == 2 and doc["graph_breaks"] == 1 and len(doc["break_reasons"]) == 1
    assert [f["op"] for f in doc["placement"]["fallback_ops"]] == ["gelu"]
    text = cli("run", _model_file(tmp_path), "-b", "numpy", "--capture", "dynamo")
    assert text.returncode == 0 and "2 regions, 1 graph breaks" in text.stdout


@pytest.mark.parametrize("extra", [["--no-fallback"], ["--hybrid", "numpy=1"]])
def test_cli_run_capture_dynamo_bad_input_is_one_line(cli, tmp_path, extra):
    r = cli("run", _model_file(tmp_path), "-b", "sim:npu-a1", "--capture", "dynamo", *extra)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("opscope: error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert ("gelu" in lines[0]) if extra == ["--no-fallback"] else ("--capture dynamo" in lines[0])
