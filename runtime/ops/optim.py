"""Optimizer updates as ops: `sgd` and `adamw`, one node per parameter.

Each op takes a parameter, its gradient and its state, and returns the new parameter and new
state (functional: the executor carries them into the next step on the device). The formulas are
torch.optim's single-tensor ones (CPU default), in the same order of float32 operations, so a
run matches eager PyTorch step for step. The torch implementations below are what the torch
backend runs (on dense CPU tensors through torch's fused SGD / AdamW kernels: the same formulas in
one pass over memory, SGD bit-identical, AdamW within an ulp or two); the numpy ones are the reference.
"""
from __future__ import annotations

import math
import operator
from typing import Optional

import numpy as np
import torch

from ..samples import SAMPLES, F, Sample
from .registry import FLOATS, define

# Hyperparameters each op takes, with torch.optim's defaults.
SGD_DEFAULTS = {"lr": 1e-3, "momentum": 0.0, "weight_decay": 0.0, "nesterov": False}
ADAMW_DEFAULTS = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 1e-2}


def _n(n):
    return n.input_meta[0].numel


# --- torch implementations: custom ops `opscope::sgd` / `opscope::adamw` (the torch backend
# runs a node's target, and conformance compares the numpy kernels with these in float64) ---
def _sgd(param, grad, momentum_buffer, lr, momentum, weight_decay, nesterov, in_place):
    state = [momentum_buffer] if momentum else []
    if all(t is not None for t in state) and _fusable(param, grad, *state):
        p, buf = (param, momentum_buffer) if in_place else \
            (param.clone(), momentum_buffer.clone() if momentum else None)
        # one pass (SGD(fused=True)'s kernel); bit-identical to the ops below here. The buffers start at zero, so
        # every step is a momentum step (not is_first_step's buf = grad: the same numbers)
        torch._fused_sgd_([p], [grad.contiguous()], [buf] if momentum else [], weight_decay=weight_decay,
                          momentum=momentum, lr=lr, dampening=0.0, nesterov=nesterov, maximize=False,
                          is_first_step=False)
        return [p, buf] if momentum else [p]
    d = grad.add(param, alpha=weight_decay) if weight_decay else grad
    if momentum:
        buf = (momentum_buffer.mul_(momentum) if in_place else momentum_buffer.mul(momentum)).add_(d)
        d = d.add(buf, alpha=momentum) if nesterov else buf
        return [param.add_(d, alpha=-lr) if in_place else param.add(d, alpha=-lr), buf]
    return [param.add_(d, alpha=-lr) if in_place else param.add(d, alpha=-lr)]


def _adamw(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, in_place):
    if _fusable(param, grad, exp_avg, exp_avg_sq):
        return _fused_adamw(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, in_place)
    t = float(step)
    if in_place:
        p = param.mul_(1 - lr * weight_decay) if weight_decay else param
        m = exp_avg.lerp_(grad, 1 - beta1)
        v = exp_avg_sq.mul_(beta2)
    else:                                   # new tensors; the ops on them below may then work in place
        p = param.mul(1 - lr * weight_decay)
        m = exp_avg.lerp(grad, 1 - beta1)
        v = exp_avg_sq.mul(beta2)
    v.addcmul_(grad, grad, value=1 - beta2)
    denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(eps)
    return [p.addcdiv_(m, denom, value=-(lr / (1 - beta1 ** t))), m, v]


def _fusable(param, grad, *state) -> bool:
    """torch's fused CPU kernels read raw data pointers: every tensor must be dense, of one dtype and shape (a
    gradient AOTAutograd returns as a transposed view is made contiguous first, below)."""
    return param.device.type == "cpu" and param.dtype in _FUSED_DTYPES and \
        all(t.is_contiguous() and t.dtype == param.dtype and t.shape == param.shape for t in (param, *state)) and \
        grad.dtype == param.dtype and grad.shape == param.shape


_FUSED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _fused_adamw(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, in_place):
    """The update in one pass over memory (torch's fused AdamW kernel: what AdamW(fused=True) runs) instead of
    eight: the single-tensor form was 1.6x eager AdamW(foreach=True) on ResNet-18's parameters. The same formula
    as the ops in _adamw, vectorized, so within an ulp or two of it; functional, it updates copies."""
    p, m, v = (param, exp_avg, exp_avg_sq) if in_place else (param.clone(), exp_avg.clone(), exp_avg_sq.clone())
    torch._fused_adamw_([p], [grad.contiguous()], [m], [v], [], [step], lr=lr, beta1=beta1, beta2=beta2,
                        weight_decay=weight_decay, eps=eps, amsgrad=False, maximize=False)
    return [p, m, v]


@torch.library.custom_op("opscope::sgd", mutates_args=())
def sgd_torch(param: torch.Tensor, grad: torch.Tensor, momentum_buffer: Optional[torch.Tensor], lr: float,
              momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False) -> list[torch.Tensor]:
    return _sgd(param, grad, momentum_buffer, lr, momentum, weight_decay, nesterov, in_place=False)


@sgd_torch.register_fake
def _(param, grad, momentum_buffer, lr, momentum=0.0, weight_decay=0.0, nesterov=False):
    return [torch.empty_like(param)] + ([torch.empty_like(param)] if momentum else [])


@torch.library.custom_op("opscope::adamw", mutates_args=())
def adamw_torch(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                step: torch.Tensor, lr: float, beta1: float, beta2: float, eps: float,
                weight_decay: float) -> list[torch.Tensor]:
    return _adamw(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, in_place=False)


@adamw_torch.register_fake
def _(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    return [torch.empty_like(param), torch.empty_like(param), torch.empty_like(param)]


def sgd_in_place(param, grad, momentum_buffer=None, lr=1e-3, momentum=0.0, weight_decay=0.0, nesterov=False):
    return _sgd(param, grad, momentum_buffer, lr, momentum, weight_decay, nesterov, in_place=True)


def adamw_in_place(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    return _adamw(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, in_place=True)


# The same updates writing the new parameter and state into the old tensors (and returning them), as
# torch.optim does: what a trainer runs when nothing but the next step reads the old values. Same
# float operations in the same order, so the same numbers as the functional ops above.
UPDATE_IN_PLACE = {"sgd": sgd_in_place, "adamw": adamw_in_place}


# --- specs and numpy reference kernels ------------------------------------------------------
@define("sgd", "elementwise", flops=lambda n: 4 * _n(n), dtypes=FLOATS,
        doc="SGD update (momentum, weight decay): returns the new parameter (and momentum buffer)")
def sgd(param, grad, momentum_buffer=None, lr=1e-3, momentum=0.0, weight_decay=0.0, nesterov=False):
    return _sgd_numpy(param, grad, momentum_buffer, lr, momentum, weight_decay, nesterov, in_place=False)


@define("adamw", "elementwise", flops=lambda n: 12 * _n(n), dtypes=FLOATS,
        doc="AdamW update: returns the new parameter, first and second moments")
def adamw(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    return _adamw_numpy(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, in_place=False)


# The numpy updates, functional (new arrays: the reference kernels) or in place (written into the parameter and
# state, a parameter-sized temporary or two per call: what `train --hybrid` runs on the host, runtime/dist/split.py,
# so each rank keeps one copy of its parameters and optimizer state). One sequence of float operations for both:
# an augmented operation on a fresh array gives the same numbers as the expression, so in place is bit-identical.
# Functional sgd takes jax arrays too (xla_lowering traces it): there, operators only, no numpy `out=`.
def _sgd_numpy(param, grad, momentum_buffer, lr, momentum, weight_decay, nesterov, in_place):
    dt = param.dtype.type
    mul, sub = (operator.imul, operator.isub) if in_place else (operator.mul, operator.sub)
    d = grad + param * dt(weight_decay) if weight_decay else grad
    if momentum:
        buf = mul(momentum_buffer, dt(momentum))
        buf += d                                   # the state itself, or the fresh product (jax: a new array)
        d = d + buf * dt(momentum) if nesterov else buf
    out = [sub(param, d * dt(lr))] + ([buf] if momentum else [])
    return out if in_place else [a.astype(param.dtype) for a in out]


def _adamw_numpy(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, in_place):
    dt = param.dtype.type
    t = float(np.asarray(step))
    into = (lambda a: a) if in_place else (lambda a: None)
    p = np.multiply(param, dt(1 - lr * weight_decay), out=into(param))
    tmp = np.asarray(grad - exp_avg)               # lerp, as torch computes it for weight < 0.5 (an array
    #                                               even for a 0-d parameter: the ops below write into it)
    tmp *= dt(1 - beta1)
    m = np.add(exp_avg, tmp, out=into(exp_avg))
    v = np.multiply(exp_avg_sq, dt(beta2), out=into(exp_avg_sq))
    np.multiply(grad, grad, out=tmp)
    tmp *= dt(1 - beta2)
    v += tmp
    np.sqrt(v, out=tmp)                            # the denominator
    tmp /= dt(math.sqrt(1 - beta2 ** t))
    tmp += dt(eps)
    np.divide(m, tmp, out=tmp)
    tmp *= dt(lr / (1 - beta1 ** t))
    p -= tmp
    return [p, m, v] if in_place else [p.astype(param.dtype), m.astype(param.dtype), v.astype(param.dtype)]


OPTIM_SAMPLES = {
    "sgd": Sample(torch.ops.opscope.sgd.default, [(F(4, 5), F(4, 5), None, 0.1),
                                                  (F(4, 5), F(4, 5), F(4, 5), 0.1, 0.9, 0.01),
                                                  (F(4, 5), F(4, 5), F(4, 5), 0.1, 0.9, 0.0, True)], ("float32", "float64")),
    "adamw": Sample(torch.ops.opscope.adamw.default, [(F(4, 5), F(4, 5), F(4, 5), F(4, 5, lo=0.0, hi=1.0), F(lo=1.0, hi=5.0),
                                                      1e-3, 0.9, 0.999, 1e-8, 0.01)], ("float32", "float64")),
}
SAMPLES.update(OPTIM_SAMPLES)       # NOTE: conformance reads SAMPLES; new op modules add their own entries


# Used only where every array has the parameter's dtype (split.py checks).
def sgd_numpy_in_place(param, grad, momentum_buffer=None, lr=1e-3, momentum=0.0, weight_decay=0.0, nesterov=False):
    return _sgd_numpy(param, grad, momentum_buffer, lr, momentum, weight_decay, nesterov, in_place=True)


def adamw_numpy_in_place(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    return _adamw_numpy(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay, in_place=True)


NUMPY_IN_PLACE = {"sgd": sgd_numpy_in_place, "adamw": adamw_numpy_in_place}   # for the numpy backend's kernels
