"""`opscope debug --train`: step through forward, backward and the optimizer of a training step."""
import numpy as np
import pytest

from opscope.debugger.app import DebuggerApp
from opscope.debugger.controller import Controller, Finished, Stop
from opscope.debugger.train import open_train_session
from opscope.runtime.train import OptimizerSpec

from debugger_models import until, write

# A custom autograd Function whose backward divides by (x - x): the first Inf is made in a
# gradient, by a backward op of `mul` (Scale.forward), while the forward pass stays finite.
GRAD_NAN = '''
import torch
from torch import nn


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2.0

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2.0 / (x - x)


class GradNaN(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 1)

    def forward(self, x, y):
        h = torch.relu(self.a(x))
        h = Scale.apply(h)
        return torch.nn.functional.mse_loss(self.b(h), y)


def factory():
    torch.manual_seed(0)
    return GradNaN(), (torch.randn(4, 8), torch.randn(4, 1))
'''

SIZE = (150, 45)


@pytest.fixture(scope="module")
def grad_nan(tmp_path_factory):
    return write(tmp_path_factory.mktemp("train"), "grad_nan.py", GRAD_NAN) + ":factory"



async def test_break_on_nan_stops_at_the_backward_op_that_made_it_and_names_its_forward_op(grad_nan):
    s = open_train_session(grad_nan, "numpy", OptimizerSpec("sgd"))
    app = DebuggerApp(Controller(s, break_on_nan=True), model=grad_nan)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq == 0)
        assert "forward" in str(app.query_one("#op").render())       # the phase of the current op
        await pilot.press("c")
        ev = await until(pilot, app, lambda e: isinstance(e, Stop) and e.seq > 0)
        # exactly the div of Scale.backward: the first op whose output holds an Inf
        assert (ev.node.op, ev.phase) == ("div", "backward")
        assert [st.node.op for st in app.ctl.steps[:ev.seq]].count("div") == 0
        assert ev.output_stats[0].inf or ev.output_stats[0].nan
        assert all(not (st.nan or st.inf) for st in ev.input_stats)
        op = str(app.query_one("#op").render())
        assert "backward" in op and "stopped: breakpoint" in op
        assert "backward of mul (mul at" in op and "grad_nan.py:" in op   # the forward op, with its line
        assert "it read in0 (from relu)" in op                           # the input its gradient is for
        assert "introduced here" in op and "in1[0, 0] = 0" in op           # the input that carried it: x - x
        labels = [str(n.label) for n in app.query_one("#graph").root.children]
        assert labels == ["forward", "backward", "optimizer"]


def test_lockstep_compares_gradients_and_updated_parameters_across_steps(grad_nan):
    """demo:mlp trains on the sim chip with numpy as the reference: every backward and optimizer op
    is compared, and in step 2 too -- the reference carries its own updated parameters."""
    s = open_train_session("demo:mlp", "sim:npu-a1", OptimizerSpec("adamw", lr=1e-2))
    ctl = Controller(s, reference="numpy")
    before = {k: v.copy() for k, v in s.trainer.parameters().items()}
    try:
        for step in range(2):
            if step:
                ctl.restart()
                assert isinstance(ctl.wait(), Stop)
            ctl.cont()
            ev = ctl.wait()
            assert isinstance(ev, Finished), ev
            ops = {row.op for row in ctl.report.rows}
            assert {"adamw"} <= ops and any(op.endswith("_backward") or op == "matmul" for op in ops)
            line = ctl.report.summary()["line"]
            assert line.startswith("all ") and "within tolerance" in line, line
        after = s.trainer.parameters()
        assert any(not np.array_equal(before[k], after[k]) for k in before)     # the parameters did move
    finally:
        ctl.quit()


def test_watch_grad_is_the_gradient_an_optimizer_op_applies():
    s = open_train_session("demo:mlp", "numpy", OptimizerSpec("sgd"))
    ctl = Controller(s, breakpoints=["sgd"])
    w = ctl.add_watch("np.linalg.norm(grad)")
    try:
        ctl.cont()
        ev = ctl.wait()
        assert isinstance(ev, Stop) and ev.phase == "optimizer"
        grad = dict(ev.inputs)[next(lab for lab, _ in ev.inputs if lab.startswith("in1"))]
        assert w.history[-1][2] == pytest.approx(float(np.linalg.norm(grad)), rel=1e-6)
        assert w.history[-1][2] > 0
    finally:
        ctl.quit()


def test_gradient_outputs_say_whose_gradient_they_are():
    s = open_train_session("demo:mlp", "numpy", OptimizerSpec("sgd"))
    grads = set(s.extra["grad_of"].values())
    ctl = Controller(s)
    seen = set()
    try:
        ctl.cont()
        assert isinstance(ctl.wait(), Finished)
        for i in range(len(ctl.history)):
            for lab, _ in ctl.history_stop(i).outputs:
                if " grad " in lab:
                    seen.add(lab.split(" grad ", 1)[1])
    finally:
        ctl.quit()
    assert seen == grads and grads


def test_cli_refuses_optimizer_flags_without_train(cli):
    r = cli("debug", "demo:mlp", "--backend", "numpy", "--lr", "0.1")
    assert r.returncode == 2 and "--train" in r.stderr and "Traceback" not in r.stderr
    r = cli("debug", "demo:mlp", "--backend", "numpy", "--train", "--optimizer", "lion")
    assert r.returncode == 2 and "lion" in r.stderr and "Traceback" not in r.stderr
