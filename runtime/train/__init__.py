"""Training: a whole step (forward, loss, backward, optimizer) as one opscope graph.

    model, inputs = models.load_train("demo:gpt")          # the model returns its loss
    t = Trainer.create(model, inputs, backends.resolve("sim:npu-a1"), OptimizerSpec("adamw", lr=1e-3))
    losses = [t.step() for _ in range(10)]                   # parameters stay on the backend, updated in
                                                             # place unless a hook reads op inputs afterwards
    t.parameters(); t.memory()                               # host copies; bytes by category
    report = compare_with_eager("demo:gpt", "numpy", steps=10, optimizer=OptimizerSpec("sgd"))

Every node carries attrs["phase"] (forward / backward / optimizer); a backward node
attrs["fwd_node"], the forward node it differentiates, and that node's module path and source.
"""
from ..ops import backward as _backward, optim as _optim  # noqa: F401  (registration)
from .compare import compare_with_eager, eager_steps
from .joint import JointGraph, LossOf, capture_joint, forward_of, loss_of, phase_of
from .step import DEFAULT_LR, OPTIMIZERS, OptimizerSpec, Trainer, TrainGraph, build_train_graph

__all__ = ["DEFAULT_LR", "JointGraph", "LossOf", "OPTIMIZERS", "OptimizerSpec", "TrainGraph", "Trainer", "build_train_graph",
           "capture_joint", "compare_with_eager", "eager_steps", "forward_of", "loss_of", "phase_of"]
