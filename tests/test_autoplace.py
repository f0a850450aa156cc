"""-b auto (runtime/autoplace): each region on the stack that runs it fastest, found by measuring candidates and a
dynamic program over the graph's order; the choice goes into a plan (and a cache), so a second run measures nothing.
Real stacks, real models with random weights: the placement matches eager within 1e-4 on demo:gpt and transformers'
GPT-2, BERT, Llama, T5 and ViT, a stack that fails a region during the search is left out there with its reason,
and bad input is one line, exit 2."""
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from opscope.runtime.session import compare, open_session

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
import autoplace_models  # noqa: E402

MODELS = HERE / "autoplace_models.py"


@pytest.mark.parametrize("argv, says", [
    (["-b", "auto:onnxrutime"], "'onnxrutime' is not a stack auto can choose"),
    (["-b", "auto:onnxruntime,sim:npu-a1"], "'sim:npu-a1' is not a stack auto can choose"),
    (["-b", "auto:onnxruntime,,xla"], "comma-separated list of stacks"),
    (["-b", "auto:torch:cpu,numpy"], "name one per-op backend"),
    (["-b", "auto", "--budget", "0"], "--budget: 0: give 1 or more"),
    (["-b", "torch:cpu", "--budget", "3"], "--budget bounds the search of -b auto"),
])
def test_bad_auto_input_is_one_line_and_exit_2(cli, argv, says):
    r = cli("run", "demo:mlp", *argv)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("damage", ["nan step", "negative seconds", "runner not a dict", "runner's time a string"])
def test_a_damaged_choice_in_a_plan_or_the_cache_is_one_line_and_the_cache_ignores_it(damage, tmp_path, monkeypatch):
    # the report prints and divides these numbers: a plan's or cache file's choice is checked when read
    from opscope.runtime.autoplace import cache
    from opscope.runtime.autoplace.choice import Choice
    from opscope.runtime.errors import UsageError
    seg = {"backend": "torch:cpu", "first": "a", "last": "b", "nodes": 2, "seconds": 1e-3,
           "runners_up": [{"backend": "onnxruntime", "seconds": 2e-3, "how": "measured", "reason": ""}]}
    doc = {"segments": [seg], "step_seconds": 1e-3, "single": {"torch:cpu": 1e-3}, "search": {}}
    assert Choice.from_doc(json.loads(json.dumps(doc)), "x").segments[0].runners_up == seg["runners_up"]
    if damage == "nan step":
        doc["step_seconds"] = float("nan")
    elif damage == "negative seconds":
        seg["seconds"] = -1.0
    elif damage == "runner not a dict":
        seg["runners_up"] = ["onnxruntime"]
    else:
        seg["runners_up"][0]["seconds"] = "fast"
    with pytest.raises(UsageError) as e:
        Choice.from_doc(json.loads(json.dumps(doc)), "plan x.opsplan")
    assert "plan x.opsplan: corrupted" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("OPSCOPE_HOME", str(tmp_path))
    (tmp_path / "autoplace").mkdir()
    (tmp_path / "autoplace" / "k.json").write_text(json.dumps(doc))
    (tmp_path / "autoplace" / "deep.json").write_text("[" * 100_000 + "]" * 100_000)

    class Reg:
        backends = {"torch:cpu": None}
    assert cache.load("k", Reg()) is None and cache.load("deep", Reg()) is None


HIDE_STACKS = textwrap.dedent("""
    # the compiler stacks' packages are not found: as on a machine where none is installed
    import sys
    from importlib.machinery import PathFinder

    class Hidden:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"onnxruntime", "openvino", "jax", "jaxlib", "iree"}:
                return None
            return PathFinder.find_spec(name, path, target)

        def __getattr__(self, attr):
            return getattr(PathFinder, attr)

    sys.meta_path[:] = [Hidden() if f is PathFinder else f for f in sys.meta_path]
""")


@pytest.mark.multiprocess
def test_auto_with_no_stack_installed_runs_every_op_per_op_and_says_so(cli, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(HIDE_STACKS)
    r = cli("run", "demo:mlp", "-b", "auto", "--json", env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    auto = doc["placement"]["auto"]
    assert "no compiler stack is installed here" in auto["note"] and "torch:cpu" in auto["note"]
    assert "not installed" in auto["not_candidates"]["onnxruntime"]
    assert not auto["searched"] and doc["placement"]["nodes_per_backend"] == {"torch:cpu": doc["nodes"]}
    assert doc["max_abs_err"] < 1e-4


def test_the_placement_report_names_each_segments_stack_time_runners_up_and_gains(cli):
    pytest.importorskip("onnxruntime")
    r = cli("run", "demo:mlp", "-b", "auto:onnxruntime,torch:cpu", "--budget", "2")
    assert r.returncode == 0, r.stderr
    assert "-b auto: segments" in r.stdout and "runners-up" in r.stdout
    assert "candidates measured); each backend alone: onnxruntime" in r.stdout.replace("\n", " ")
    r = cli("run", "demo:mlp", "-b", "auto:onnxruntime,torch:cpu")          # the same graph: the cache's choice
    assert r.returncode == 0 and "chosen by an earlier search (from the cache), nothing measured" in r.stdout


@pytest.mark.slow
@pytest.mark.multiprocess
def test_auto_on_demo_gpt_matches_eager_and_its_plan_runs_again_without_searching(cli, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("jax")
    plan = tmp_path / "gpt.opsplan"
    spec = "auto:onnxruntime,xla,torch:cpu"
    r = cli("compile", "demo:gpt", "-b", spec, "--budget", "4", "-o", str(plan), "--json")
    assert r.returncode == 0, r.stderr
    auto = json.loads(r.stdout)["auto"]
    assert auto["searched"] and auto["search"]["candidates_measured"] <= 4
    assert set(auto["single"]) == {"onnxruntime", "xla", "torch:cpu"}
    # the choice is the fastest of what ran end to end: each backend alone gains at least 1x over it
    assert all(g >= 1.0 for g in auto["gain"].values()), auto["gain"]
    assert sum(s["nodes"] for s in auto["segments"]) == json.loads(r.stdout)["nodes"]
    assert all(s["runners_up"] for s in auto["segments"])
    r = cli("run", "demo:gpt", "--plan", str(plan), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["max_abs_err"] < 1e-4
    again = doc["placement"]["auto"]
    assert not again["searched"] and again["source"] == "plan" and "candidates_measured" in again["search"]
    assert [s["backend"] for s in again["segments"]] == [s["backend"] for s in auto["segments"]]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(autoplace_models.TRANSFORMERS))
def test_auto_on_a_transformers_model_matches_eager_and_a_second_session_does_not_search(name, monkeypatch):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("OPSCOPE_AUTO_BUDGET", "3")
    model, inputs = autoplace_models.TRANSFORMERS[name]()
    s = open_session(name, "auto:onnxruntime,torch:cpu", model=model, inputs=inputs)
    auto = s.plan.placement.report()["auto"]
    assert auto["searched"] and 1 <= auto["search"]["candidates_measured"] <= 3
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4
    s2 = open_session(name, "auto:onnxruntime,torch:cpu", model=model, inputs=inputs)
    again = s2.plan.placement.report()["auto"]
    assert not again["searched"] and again["source"] == "cache"
    assert again["segments"] == auto["segments"]
    assert compare(s2.run_host(), s2.eager())["max_abs"] < 1e-4


# NOTE: multiprocess: OpenVINO's converter starts processes of its own
@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_stack_that_fails_a_region_during_the_search_is_left_out_there_with_its_reason(cli):
    pytest.importorskip("openvino")
    r = cli("run", f"{MODELS}:scan", "-b", "auto:openvino,torch:cpu", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    auto = doc["placement"]["auto"]
    failed = auto["search"]["failed"]
    assert failed and all(f["backend"] == "openvino" for f in failed)
    assert any("logcumsumexp" in f["reason"] for f in failed), failed
    assert doc["max_abs_err"] < 1e-4
    # where openvino failed, the segment's runner-up says why
    where = [s for s in auto["segments"] for u in s["runners_up"] if u["backend"] == "openvino" and u["seconds"] is None]
    assert all("logcumsumexp" in u["reason"] for s in where for u in s["runners_up"] if u["backend"] == "openvino")


class Flat(torch.nn.Module):
    """Ops with no submodule: one segment, so the search's finalists are single backends only (no mix)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return ((x @ self.w).relu() * 2 + 1).softmax(-1)


def _steps(plan) -> list[tuple]:
    """What a step does each call: its op, its backend, the nodes it runs."""
    return [(st.node.op, st.backend.name, [m.name for m in st.node.attrs.get("members", [])] or st.node.name)
            for st in plan.steps]


def _same_as_alone(auto_plan, stack: str, model, inputs) -> None:
    from opscope.runtime.backends import resolve
    from opscope.runtime.capture import capture
    from opscope.runtime.executor import compile_plan
    alone = compile_plan(capture(model, inputs, name="flat"), resolve(stack))
    assert _steps(auto_plan) == _steps(alone)
    assert auto_plan.placement.transfers == alone.placement.transfers == 0
    # the inputs go straight to the stack's memory, as -b STACK puts them
    assert type(auto_plan.backend.memory.to_device.__self__) is type(alone.backend.memory)
    programs = [[st.kernel.artifact() for st in p.steps if st.node.op == "region"] for p in (auto_plan, alone)]
    assert programs[0] == programs[1]         # the same compiled program (the same ONNX model)


def test_an_auto_choice_of_one_stack_runs_as_that_stack_alone_with_no_transfer_of_its_inputs(monkeypatch, tmp_path):
    # regression: placement read auto's home (where the inputs go) before auto had chosen, so a choice of ONNX
    # Runtime's whole graph put the inputs on torch:cpu and every call paid a transfer step -b onnxruntime has not
    pytest.importorskip("onnxruntime")
    from opscope.runtime import autoplace
    from opscope.runtime.backends import resolve
    from opscope.runtime.capture import capture
    from opscope.runtime.executor import compile_plan
    monkeypatch.setenv("OPSCOPE_HOME", str(tmp_path))
    torch.manual_seed(0)
    model, inputs = Flat().eval(), (torch.randn(4, 8),)
    graph = capture(model, inputs, name="flat")
    backend = resolve("auto:onnxruntime,torch:cpu")
    autoplace.arm(backend, {"segments": [{"backend": "onnxruntime", "first": graph.nodes[0].name,
                                          "last": graph.nodes[-1].name, "nodes": len(graph.nodes)}]}, "test")
    _same_as_alone(compile_plan(graph, backend), "onnxruntime", model, inputs)
    # the search's own session: whichever single backend its end-to-end check kept, the session runs as it alone,
    # with nothing of the search left on it
    monkeypatch.setenv("OPSCOPE_AUTO_BUDGET", "2")
    s = open_session("flat", "auto:onnxruntime,torch:cpu", model=model, inputs=inputs)
    auto = s.plan.placement.report()["auto"]
    assert auto["searched"] and auto["search"]["winner"] in ("onnxruntime", "torch:cpu")
    assert not s.executor.hooks
    _same_as_alone(s.plan, auto["search"]["winner"], model, inputs)
    assert compare(s.run_host(), s.eager())["max_abs"] < 1e-4


def test_the_end_to_end_check_keeps_a_mix_only_when_it_beats_the_best_single_backend_by_the_margin():
    from opscope.runtime.autoplace.search import MIX_MARGIN, keep
    assert keep({"torch:cpu": 2.0, "onnxruntime": 1.0, "openvino": 0.99}) == "openvino"
    assert keep({"torch:cpu": 2.0, "onnxruntime": 1.0, "auto": 1.0 - MIX_MARGIN / 2}) == "onnxruntime"
    assert keep({"torch:cpu": 2.0, "onnxruntime": 1.0, "auto": 1.0 - 2 * MIX_MARGIN}) == "auto"
    assert keep({"auto": 1.0}) == "auto"


def test_the_search_leaves_no_compiled_program_alive_but_the_ones_its_session_runs(monkeypatch, tmp_path):
    # regression: a compiled program sits in reference cycles, so the candidates the search did not keep (their
    # sessions, arenas, executables) lived on until some later collection freed them mid-step
    import gc
    import weakref
    pytest.importorskip("onnxruntime")
    from opscope.runtime.regions import RegionProgram
    monkeypatch.setenv("OPSCOPE_HOME", str(tmp_path))
    torch.manual_seed(0)
    model, inputs = torch.nn.Sequential(Flat(), Flat()).eval(), (torch.randn(4, 8),)
    before = weakref.WeakSet(o for o in gc.get_objects() if isinstance(o, RegionProgram))
    s = open_session("two", "auto:onnxruntime,torch:cpu", model=model, inputs=inputs)
    search = s.plan.placement.report()["auto"]["search"]
    assert search["segments"] == 2 and search["candidates_measured"] >= 2    # the whole graph and its parts
    alive = {id(o) for o in gc.get_objects() if isinstance(o, RegionProgram) and o not in before}
    assert alive == {id(st.kernel) for st in s.plan.steps if isinstance(st.kernel, RegionProgram)}
