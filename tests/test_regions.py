"""Regions (runtime/regions.py): runs of claimed nodes become one node each; per-op backends see nothing new."""
import torch

from opscope.runtime.backends import resolve
from opscope.runtime.capture import capture
from opscope.runtime.demos.gpt import GPT
from opscope.runtime.placement import place
from opscope.runtime.regions import group, region_node


def one_block():
    torch.manual_seed(0)
    return GPT(layers=1).eval(), (torch.randint(0, 2048, (2, 16)),)


def test_a_refused_op_in_the_middle_splits_the_block_into_two_regions_joined_by_its_values():
    g = capture(*one_block(), name="block")
    (gelu,) = [n for n in g.nodes if n.op == "gelu"]
    regions = group(g, [n.op != "gelu" for n in g.nodes])
    assert len(regions) == 2
    first, second = regions
    assert gelu.inputs[0] in first.outputs                  # what gelu reads leaves the first region
    assert gelu.outputs[0] in second.inputs                 # and what it makes enters the second
    assert sum(len(r.members) for r in regions) == len(g.nodes) - 1
    # parameters are compiled in, not passed per run; the graph's own output leaves the last region
    assert not set(first.inputs) & set(g.constant_slots) and first.constants
    assert g.output_refs[0].slot in second.outputs
    node = region_node(second, "stack")
    assert node.op == "region" and node.multi_output and node.inputs == second.inputs
    assert node.flops == sum(m.flops for m in second.members) > 0


def test_a_constant_a_training_step_replaces_stays_a_region_input():
    g = capture(*one_block(), name="block")
    weight = next(iter(group(g, [True] * len(g.nodes))[0].constants))
    (region,) = group(g, [True] * len(g.nodes), volatile={weight})
    assert weight in region.inputs and weight not in region.constants


def test_a_per_op_backend_places_as_before_with_no_regions_in_its_report():
    g = capture(*one_block(), name="block")
    p = place(g, resolve("sim:npu-a1"))
    rep = p.report()
    assert "regions" not in rep and not any(n.op == "region" for n, _ in p.assignments)
    assert sum(rep["nodes_per_backend"].values()) == len(g.nodes)
