"""The pass pipeline on models people actually use (issue 19: "every pass keeps outputs within 1e-4
of eager PyTorch ... on GPT-2, BERT and a ResNet-18 from their usual packages, on numpy, torch:cpu
and a sim backend; the pass log says what changed").

The models are test_runtime_models.py's (transformers, small random configs, no download). Each is
captured once per module; every backend runs it with all passes on, numpy runs each pass alone,
and a pass whose graph edit is visible must have said so in the log."""
from __future__ import annotations

import pytest

from opscope.runtime import backends, models
from opscope.runtime.capture import capture
from opscope.runtime.executor import Executor, compile_plan
from opscope.runtime.passes import NAMES, optimize
from opscope.runtime.passes.fuse import members
from opscope.runtime.session import compare, eager_outputs

from test_runtime_models import FACTORIES

pytestmark = pytest.mark.slow
MODELS = ["gpt2", "bert", "resnet18"]
# layout acts only where a chip prefers NHWC: ask for it on every backend, so every backend runs it
OPTIONS = {"layout": "nhwc"}
_CACHE: dict = {}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    pytest.importorskip("transformers")
    p = tmp_path_factory.mktemp("models") / "zoo.py"
    p.write_text(FACTORIES)

    def get(factory):
        if factory not in _CACHE:
            spec = f"{p}:{factory}"
            model, inputs = models.load(spec)
            _CACHE[factory] = (inputs, capture(model, inputs, spec), eager_outputs(model, inputs))
        return _CACHE[factory]
    return get


def _run(plan, inputs):
    """Outputs, and the (op, backend) of every executed node."""
    seen = []

    class Hook:
        def after_op(self, call):
            seen.append((call.node.op, call.backend.name))

    with Executor(plan).hooked(Hook()) as ex:
        ex.run(*inputs)
    return Executor(plan).run_host(*inputs), seen


def _signature(graph):
    """What a pass may change: the nodes (op, name, slots, layout) and which slots are constants."""
    return ([(n.op, n.name, tuple(n.inputs), tuple(n.outputs), n.attrs.get("layout")) for n in graph.nodes],
            sorted(graph.constant_slots))


@pytest.mark.parametrize("backend", ["numpy", "torch:cpu", "sim:npu-a1"])
@pytest.mark.parametrize("factory", MODELS)
def test_all_passes_keep_library_models_within_1e4_of_eager(zoo, factory, backend):
    inputs, graph, ref = zoo(factory)
    b = backends.resolve(backend)
    plan = compile_plan(graph, b, passes="all", pass_options=OPTIONS)
    out, seen = _run(plan, inputs)
    assert compare(out, ref)["max_abs"] <= 1e-4
    assert [e["pass"] for e in plan.pass_log] == list(NAMES)
    # the passes did act: fused kernels ran on the backend itself (not a fallback), fewer nodes ran
    fused = [bk for op, bk in seen if op == "fused"]
    assert fused and set(fused) == {b.name}
    assert len(plan.graph.nodes) < len(graph.nodes)
    if factory == "resnet18":
        assert any(op == "relayout" for op, _ in seen)
        assert any(n.attrs.get("layout") == "nhwc" for n in plan.graph.nodes)


@pytest.mark.parametrize("name", list(NAMES))
@pytest.mark.parametrize("factory", MODELS)
def test_each_pass_alone_keeps_library_models_within_1e4_of_eager(zoo, factory, name):
    inputs, graph, ref = zoo(factory)
    plan = compile_plan(graph, backends.resolve("numpy"), passes=name, pass_options=OPTIONS)
    out, _ = _run(plan, inputs)
    assert compare(out, ref)["max_abs"] <= 1e-4
    assert [e["pass"] for e in plan.pass_log] == [name]


@pytest.mark.parametrize("factory", MODELS)
def test_pass_log_says_what_changed_on_library_models(zoo, factory):
    """Pass by pass through the pipeline: a pass that changed the graph logged at least one line,
    and one that logged nothing left the graph as it was."""
    _, graph, _ = zoo(factory)
    b = backends.resolve("numpy")
    g = graph
    changed = {}
    for name in NAMES:
        new, log = optimize(g, b, [name], options=OPTIONS)
        (entry,) = log.entries
        changed[name] = _signature(new) != _signature(g)
        if changed[name]:
            assert entry["changes"], f"{name} changed {factory}'s graph but its log is empty"
        elif name != "memplan":          # memplan plans buffers and always reports its peak
            assert not entry["changes"], f"{name} logged {entry['changes'][:2]} but changed nothing"
        g = new
    # what each model gives the passes to do
    assert changed["fuse"]
    assert changed["layout"] == (factory == "resnet18")
    if factory != "resnet18":
        assert changed["fold"] and changed["dce"]        # position ids, masks and casts are constants / no-ops
    fused = [n for n in g.nodes if n.op == "fused"]
    # each fused node still names its members: op, module path, source line
    assert all(len(members(n)) >= 2 and all(m.source_line for m in members(n)) for n in fused)
    assert all(any(m.module_path for m in members(n)) for n in fused)
