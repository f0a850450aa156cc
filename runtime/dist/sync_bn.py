"""BatchNorm statistics over every rank's rows (`train --hybrid --sync-bn`), as torch's SyncBatchNorm computes them.

    hook = SyncBatchNorm(weight=rows / total_rows, all_reduce=lambda t: trainer._collective(..., t))
    with gradient_step.executor.hooked(hook):
        loss, grads = gradient_step.run(local)    # every training-mode BatchNorm normalizes with the whole batch

Without it each rank normalizes with its own rows (DDP without SyncBatchNorm), and a BatchNorm model cannot match
one process on the whole batch. The captured graph is left as it is: an executor hook sees each BatchNorm op the
moment it ends, on every rank in the same order (one graph), and puts the whole batch's result into its outputs
in place, before any later op reads them.

- forward (native_batch_norm, training): per channel, sum(x), sum(x^2) and the count all-reduced (float64, one
  collective); y, the saved mean and 1/std, and the new running mean and (unbiased) variance recomputed with them.
  The saved statistics are the whole batch's, so the backward op's gradients of weight and bias are this rank's
  part of the whole batch's (the trainer's weighted gradient sum adds them up).
- backward (native_batch_norm_backward, training): grad_input needs the whole batch's sum(dy) and sum(dy * x_hat).
  Rank r's backward starts from its own rows' mean loss while the job's loss is sum_r w_r L_r (w_r: its share of
  the rows), so those sums are all-reduced weighted by w_r and, as the trainer scales this rank's gradients by w_r
  afterwards, divided by n_r = w_r * N (its own element count per channel):
  dx_r = gamma * invstd * (dy_r - A / n_r - x_hat_r * B / n_r), A = sum_r w_r sum(dy_r), B = sum_r w_r sum(dy_r x_hat_r).
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import ModelError


# the captured forms of a training-mode BatchNorm: with running statistics (functional), and without them
FORWARD = ("native_batch_norm", "native_batch_norm_legit")


def has_batch_norm(plan) -> bool:
    """Does the plan run a training-mode BatchNorm? Without one the hook is not installed: it would see every op
    of every step for nothing (compiler stacks leave BatchNorm to the fallback, so it is an op of its own)."""
    return any(st.node.op in FORWARD and st.node.attrs.get("training") for st in plan.steps)


class SyncBatchNorm:
    def __init__(self, weight: float, all_reduce):
        """weight: this rank's share of the batch's rows; all_reduce(tensor): a sum over the ranks, in place."""
        self.weight = float(weight)
        self.all_reduce = all_reduce
        self.synced: set[str] = set()         # forward nodes whose statistics were the whole batch's

    def after_op(self, call) -> None:
        op = call.node.op
        if op in FORWARD and call.node.attrs.get("training"):
            self._forward(call)
            self.synced.add(call.node.name)
        elif op == "batch_norm_backward" and call.node.attrs.get("fwd_node") in self.synced:
            self._backward(call)

    def _forward(self, call) -> None:
        # (x, weight, bias, running_mean, running_var, training, momentum, eps), or without the running pair
        x, gamma, beta = call.inputs[:3]
        rm, rv = call.inputs[3:5] if len(call.inputs) >= 8 else (None, None)
        momentum, eps = call.inputs[-2:]
        x, y = _host(x, call), _host(call.outputs[0], call)
        dims = _dims(x)
        xd = x.double()
        count = torch.tensor([x.numel() / x.shape[1]], dtype=torch.float64, device=x.device)
        stats = self._summed(torch.cat([xd.sum(dims), (xd * xd).sum(dims), count]))
        c = x.shape[1]
        n = stats[-1]
        mean = stats[:c] / n
        var = (stats[c:2 * c] / n - mean * mean).clamp_min(0)
        invstd = (var + eps).rsqrt()
        out = (xd - _bc(mean, x)) * _bc(invstd, x)
        if gamma is not None:
            out = out * _bc(_host(gamma, call).double(), x)
        if beta is not None:
            out = out + _bc(_host(beta, call).double(), x)
        y.copy_(out)
        outs = call.outputs
        _host(outs[1], call).copy_(mean)
        _host(outs[2], call).copy_(invstd)
        if rm is not None and len(outs) >= 5 and outs[3] is not None:
            _host(outs[3], call).copy_((1 - momentum) * _host(rm, call).double() + momentum * mean)
            unbiased = var * n / (n - 1) if n > 1 else var
            _host(outs[4], call).copy_((1 - momentum) * _host(rv, call).double() + momentum * unbiased)

    def _backward(self, call) -> None:
        dy, x, gamma, _, _, save_mean, save_invstd = call.inputs[:7]
        dx = call.outputs[0]
        if dx is None:         # no input gradient asked (the same on every rank: one graph): no collective
            return
        dy, x = _host(dy, call).double(), _host(x, call).double()
        dims = _dims(x)
        invstd = _bc(_host(save_invstd, call).double(), x)
        xhat = (x - _bc(_host(save_mean, call).double(), x)) * invstd
        sums = self._summed(torch.cat([dy.sum(dims), (dy * xhat).sum(dims)]) * self.weight)
        c, n = x.shape[1], x.numel() / x.shape[1]
        scale = invstd * (_bc(_host(gamma, call).double(), x) if gamma is not None else 1.0)
        _host(dx, call).copy_(scale * (dy - _bc(sums[:c], x) / n - xhat * _bc(sums[c:], x) / n))

    def _summed(self, t: torch.Tensor) -> torch.Tensor:
        """t summed over the ranks. The collective takes host tensors: a torch:cuda rank's sums go there and
        back (its statistics were concatenated on its device, beside a host count they could not be)."""
        host = t.cpu()
        self.all_reduce(host)
        return host.to(t.device)


def _dims(x: torch.Tensor) -> list[int]:
    return [0] + list(range(2, x.dim()))


def _bc(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel vector shaped to broadcast over x (N, C, ...)."""
    return v.view(1, -1, *([1] * (x.dim() - 2)))


def _host(v, call) -> torch.Tensor:
    """The op's value as a torch tensor viewing the same memory (torch backends' tensors, numpy arrays)."""
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, np.ndarray):
        return torch.from_numpy(v)
    raise ModelError(f"--sync-bn: {call.backend.name} holds {call.node.name}'s values as {type(v).__name__}, not "
                     "host arrays: BatchNorm statistics are synchronised on host backends (torch:cpu, numpy)")
