"""Training on any backend: a whole step (forward, loss, backward, optimizer) captured once, run on
numpy / torch:cpu / sim:npu-a1 with parameters resident on the backend, matching eager PyTorch."""
import json
import textwrap

import numpy as np
import pytest

from opscope.runtime import backends, models
from opscope.runtime.train import OptimizerSpec, Trainer, compare_with_eager, forward_of, phase_of

TOL = 1e-4


def _assert_matches(r):
    for a, e in zip(r["losses"], r["eager_losses"]):
        assert abs(a - e) <= TOL * max(1.0, abs(e)), (r["losses"], r["eager_losses"])
    assert r["parameter_error"]["max_abs"] <= TOL, r["parameter_error"]
    assert len(r["parameters"]) > 0 and r["losses"][-1] < r["losses"][0]      # it really trained


def _opt(name):
    return OptimizerSpec(name, lr=1e-2 if name == "sgd" else 1e-3, weight_decay=0.01)


@pytest.mark.parametrize("backend", ["numpy", "torch:cpu", "sim:npu-a1"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_mlp_trains_like_eager(backend, optimizer):
    _assert_matches(compare_with_eager("demo:mlp", backend, steps=10, optimizer=_opt(optimizer)))


@pytest.mark.slow
@pytest.mark.parametrize("backend,optimizer", [("numpy", "sgd"), ("torch:cpu", "adamw"), ("sim:npu-a1", "adamw")])
def test_cnn_trains_like_eager(backend, optimizer):
    r = compare_with_eager("demo:cnn", backend, steps=10, optimizer=_opt(optimizer))
    _assert_matches(r)
    assert r["memory"]["buffers"] > 0          # batch-norm running stats are carried too


@pytest.mark.slow
@pytest.mark.parametrize("backend,optimizer", [("numpy", "adamw"), ("torch:cpu", "sgd"), ("sim:npu-a1", "sgd")])
def test_gpt_trains_like_eager(backend, optimizer):
    _assert_matches(compare_with_eager("demo:gpt", backend, steps=10, optimizer=_opt(optimizer)))


def test_backward_nodes_name_the_forward_op_they_differentiate():
    model, inputs = models.load_train("demo:mlp")
    t = Trainer.create(model, inputs, backends.resolve("numpy"), OptimizerSpec("sgd"))
    nodes = t.train.graph.nodes
    by_name = {n.name: n for n in nodes}
    assert {phase_of(n) for n in nodes} == {"forward", "backward", "optimizer"}
    relu_bw = [n for n in nodes if n.op == "threshold_backward"]
    assert len(relu_bw) == 2
    for n in relu_bw:
        fwd = by_name[forward_of(n)]
        assert fwd.op == "relu" and phase_of(fwd) == "forward"
        assert n.module_path == fwd.module_path and n.module_path.endswith(("1", "3"))    # model.1 / model.3 ReLU
    assert all(phase_of(n) == "optimizer" for n in nodes if n.op in ("sgd", "adamw"))
    # phases come in order: the whole forward, then the backward, then the optimizer
    order = [phase_of(n) for n in nodes]
    assert order == sorted(order, key=["forward", "backward", "optimizer"].index)


def test_parameters_stay_on_the_backend_between_steps():
    model, inputs = models.load_train("demo:mlp")
    backend = backends.resolve("torch:cpu")
    t = Trainer.create(model, inputs, backend, OptimizerSpec("adamw"))
    t.step()
    calls = []
    real = backend.memory.to_device
    backend.memory.to_device = lambda v: calls.append(v) or real(v)
    t.step()
    t.step()
    assert len(calls) == 2 * len(inputs)        # only the user inputs cross, once per step
    mem = t.memory()
    assert mem["parameters"] == mem["gradients"] > 0 and mem["optimizer_state"] == 2 * mem["parameters"]
    assert mem["activations"] > 0


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_unwatched_steps_update_in_place_and_match_watched_ones(optimizer):
    """Without hooks the optimizer writes into the old parameter and state (as torch.optim does); under a
    hook it stays functional, so the hook still sees an op's inputs as they were. Same numbers either way."""
    model, inputs = models.load_train("demo:mlp")
    fast, watched = (Trainer.create(model, inputs, backends.resolve("torch:cpu"), _opt(optimizer)) for _ in range(2))

    class KeepsInputs:
        def before_op(self, call):
            self.before = [v.clone() if hasattr(v, "clone") else v for v in call.inputs]

        def after_op(self, call):
            if call.node.op == optimizer:
                assert all((a == b).all() for a, b in zip(call.inputs, self.before) if hasattr(a, "clone"))

    slot = next(iter(fast.train.joint.param_slots.values()))
    losses = [fast.step()]
    before = fast.plan.constants[slot]
    losses += [fast.step() for _ in range(3)]
    assert fast.plan.constants[slot] is before             # written in place, step after step
    with watched.executor.hooked(KeepsInputs()):
        assert [watched.step() for _ in range(4)] == losses
    a, b = fast.parameters(), watched.parameters()
    assert all((a[k] == b[k]).all() for k in a)

    class TimesOnly:                                        # a hook that never reads inputs after an op
        reads_inputs_after_op = False

        def after_op(self, call):
            pass
    with fast.executor.hooked(TimesOnly()):
        fast.step()
    assert fast.plan.constants[slot] is before


def test_an_unsupported_backward_op_falls_back_for_exactly_that_op(tmp_path):
    desc = tmp_path / "nobw.toml"
    desc.write_text(textwrap.dedent("""
        [backend]
        name = "nobw"
        implementation = "sim"
        fallback = "numpy"
        [hardware]
        peak_flops = { float32 = 1.0e13 }
        memory_bandwidth = 1.0e12
        memory_capacity = 1.0e10
        launch_overhead = 5.0e-6
        [operators]
        unsupported = ["threshold_backward"]
    """))
    r = compare_with_eager("demo:mlp", str(desc), steps=3, optimizer=_opt("sgd"))
    fell = r["placement"]["fallback_ops"]
    assert [f["op"] for f in fell] == ["threshold_backward"] and fell[0]["nodes"] == 2
    assert r["placement"]["transfers"] > 0
    _assert_matches(r)


def test_cli_train_prints_losses_side_by_side(cli):
    res = cli("train", "demo:mlp", "--backend", "numpy", "--steps", "3", "--optimizer", "adamw")
    assert res.returncode == 0, res.stderr
    assert "eager PyTorch" in res.stdout and "within" in res.stdout and "optimizer state" in res.stdout


def test_cli_train_json(cli):
    res = cli("train", "demo:mlp", "--backend", "sim:npu-a1", "--steps", "10", "--optimizer", "sgd", "--lr", "0.05",
              "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["within_tolerance"] is True and len(doc["losses"]) == 10 == len(doc["eager_losses"])
    assert doc["optimizer"]["name"] == "sgd" and doc["optimizer"]["lr"] == 0.05
    assert set(doc["phases"]) == {"forward", "backward", "optimizer"}
    assert {"parameters", "gradients", "optimizer_state", "activations"} <= set(doc["memory"])
    assert doc["placement"]["transfer_bytes"] == 0


def test_cli_unknown_optimizer_exits_2(cli):
    res = cli("train", "demo:mlp", "--optimizer", "lion")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "unknown optimizer" in res.stderr


def test_cli_model_without_scalar_loss_exits_2(cli, tmp_path):
    f = tmp_path / "logits.py"
    f.write_text("import torch\n\ndef make():\n    torch.manual_seed(0)\n"
                 "    return torch.nn.Linear(4, 3), (torch.randn(2, 4),)\n")
    res = cli("train", f"{f}:make", "--backend", "numpy", "--steps", "1")
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "scalar loss" in res.stderr and "Traceback" not in res.stderr


def test_user_model_returning_a_tuple_with_the_loss(tmp_path):
    f = tmp_path / "tupleloss.py"
    f.write_text(textwrap.dedent("""
        import torch
        import torch.nn.functional as F

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(6, 4)

            def forward(self, x, y):
                logits = self.fc(torch.tanh(x))
                return F.cross_entropy(logits, y), logits.detach()

        def make():
            torch.manual_seed(0)
            return M(), (torch.randn(5, 6), torch.randint(0, 4, (5,)))
    """))
    r = compare_with_eager(f"{f}:make", "numpy", steps=5, optimizer=_opt("sgd"))
    _assert_matches(r)
    assert np.isfinite(r["losses"]).all()


@pytest.mark.parametrize("backend", ["numpy", "torch:cpu"])
def test_backward_and_optimizer_ops_pass_conformance(backend):
    from opscope.runtime.conformance import check
    from opscope.runtime.ops.backward import BACKWARD_SAMPLES
    from opscope.runtime.ops.optim import OPTIM_SAMPLES

    report = check(backends.resolve(backend), ops=list(BACKWARD_SAMPLES) + list(OPTIM_SAMPLES))
    assert not report.failed, [(c.op, c.dtype, c.message) for c in report.failed]
    assert report.counts()["untested"] == 0 and report.counts()["unsupported"] == 0


def test_tied_weights_train_as_one_parameter(tmp_path):
    """Regression (BERT's decoder bias, GPT-2's lm_head): a tensor under two names is one input, one
    gradient (summed over its uses), one update -- gradients were paired with the wrong parameters."""
    f = tmp_path / "tied.py"
    f.write_text(textwrap.dedent("""
        import torch
        import torch.nn.functional as F

        class Tied(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(10, 6)
                self.unused = torch.nn.Linear(6, 6)          # no gradient: must not shift the pairing
                self.mid = torch.nn.Linear(6, 6)
                self.head = torch.nn.Linear(6, 10)
                self.head.weight = self.emb.weight

            def forward(self, ids, y):
                return F.cross_entropy(self.head(torch.tanh(self.mid(self.emb(ids)))), y)

        def make():
            torch.manual_seed(0)
            return Tied(), (torch.randint(0, 10, (7,)), torch.randint(0, 10, (7,)))
    """))
    model_spec = f"{f}:make"
    r = compare_with_eager(model_spec, "numpy", steps=5, optimizer=_opt("adamw"))
    _assert_matches(r)
    model, inputs = models.load_train(model_spec)
    t = Trainer.create(model, inputs, backends.resolve("numpy"), _opt("sgd"))
    assert t.train.joint.aliases == {"head.weight": "emb.weight"}
    assert [n.attrs["param"] for n in t.train.graph.nodes if n.op == "sgd"].count("emb.weight") == 1
    t.step()
    p = t.parameters()
    assert (p["head.weight"] == p["emb.weight"]).all()


def test_capture_tells_the_model_it_is_traced():
    """Regression (transformers 5 GPT-2): code that skips a data-dependent check while traced
    (`torch.compiler.is_compiling()`) is captured without calling .item() on a fake tensor."""
    import torch

    class Checks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 1)

        def forward(self, x):
            if not torch.compiler.is_compiling() and bool((x > 100).all()):    # eager only: needs values
                x = x * 0
            return self.fc(x).pow(2).mean()

    torch.manual_seed(0)
    r = compare_with_eager("checks", "numpy", steps=3, optimizer=_opt("sgd"), model=Checks(),
                           inputs=(torch.randn(4, 3),))
    _assert_matches(r)
    assert not torch.compiler.is_compiling()              # the flag is put back after the capture
