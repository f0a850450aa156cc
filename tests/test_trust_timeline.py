"""The timeline's "In this window" table reads a share of the window's length (issue 27's screenshot review: on a
torch.profiler step, ProfilerStep#2 -- the whole step -- read 20.4 %, a share of the rows' sum, which counts a
nested op once per level)."""
from opscope.app.web import timeline as lod


def test_a_span_covering_the_window_reads_100_percent_and_nested_ones_their_own_part():
    # one thread: step 0-1000 > forward 0-600 > linear 100-500 > addmm 150-450
    s = lod.build([0, 0, 100, 150], [1000, 600, 500, 450], [0, 0, 0, 0], ["cpu"], [0, 1, 2, 3],
                  ["ProfilerStep#2", "forward", "aten::linear", "aten::addmm"], [0, 0, 0, 0], [0, 1, 2, 3])
    top = lod.in_window(s, 0, 1000)
    share = {s.names[k]: t / top["window"] for k, t in zip(top["label"], top["total"])}
    assert top["window"] == 1000.0
    assert share == {"ProfilerStep#2": 1.0, "forward": 0.6, "aten::linear": 0.4, "aten::addmm": 0.3}


def test_the_window_is_cut_to_the_run():
    # a whole-run view reaches past the last span (timeline.window adds a margin): the share is of the run's part
    s = lod.build([0], [800], [0], ["cpu"], [0], ["add"], [0], [0])
    top = lod.in_window(s, -100, 1200)
    assert top["window"] == 800.0 and top["total"] == [800.0]


def test_an_op_on_two_lanes_reads_its_share_per_lane():
    # two ranks' communication lanes, each in all_reduce for half the window (one after the other): 50 %, not 100 %
    s = lod.build([0, 500], [500, 1000], [0, 1], ["rank 0 · communication", "rank 1 · communication"], [0, 0],
                  ["all_reduce"], [0, 0], [0, 1])
    top = lod.in_window(s, 0, 1000)
    assert top["lanes"] == [2] and top["total"] == [1000.0]
    assert top["total"][0] / (top["window"] * top["lanes"][0]) == 0.5
