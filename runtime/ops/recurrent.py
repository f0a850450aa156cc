"""Recurrent layers as ops: LSTM, GRU and Elman RNN (tanh / relu), what torch.export keeps nn.LSTM,
nn.GRU and nn.RNN as (`aten.lstm.input`, `aten.gru.input`, `aten.rnn_tanh.input`).

ATen's flat parameter list holds, per layer and direction, w_ih, w_hh, then b_ih, b_hh when the
layer has biases, then w_hr for an LSTM with a projection. Inputs are (T, N, F), or (N, T, F)
with batch_first, or unbatched (T, F). Kernels compute in float64 and cast back.
"""
from __future__ import annotations

import numpy as np

from .registry import FLOATS, arg, define


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _lstm_cell(x, state, w_ih, w_hh, b_ih, b_hh, w_hr):
    h, c = state
    gates = x @ w_ih.T + h @ w_hh.T
    if b_ih is not None:
        gates = gates + b_ih + b_hh
    i, f, g, o = np.split(gates, 4, axis=-1)
    c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    h = _sigmoid(o) * np.tanh(c)
    if w_hr is not None:
        h = h @ w_hr.T
    return h, (h, c)


def _gru_cell(x, state, w_ih, w_hh, b_ih, b_hh, _):
    h = state[0]
    gi, gh = x @ w_ih.T, h @ w_hh.T
    if b_ih is not None:
        gi, gh = gi + b_ih, gh + b_hh
    ir, iz, in_ = np.split(gi, 3, axis=-1)
    hr, hz, hn = np.split(gh, 3, axis=-1)
    r, z = _sigmoid(ir + hr), _sigmoid(iz + hz)
    n = np.tanh(in_ + r * hn)
    h = (1 - z) * n + z * h
    return h, (h,)


def _rnn_cell(act):
    def cell(x, state, w_ih, w_hh, b_ih, b_hh, _):
        pre = x @ w_ih.T + state[0] @ w_hh.T
        if b_ih is not None:
            pre = pre + b_ih + b_hh
        h = act(pre)
        return h, (h,)
    return cell


def _run(cell, x, hx, params, has_biases, num_layers, bidirectional, batch_first):
    """Stack `num_layers` layers (each one or two directions) over the sequence; returns output, final states."""
    dtype = x.dtype
    unbatched = x.ndim == 2
    x = x.astype(np.float64)
    hx = [h.astype(np.float64) for h in hx]
    if unbatched:
        x, hx = x[:, None], [h[:, None] for h in hx]
    elif batch_first:
        x = np.swapaxes(x, 0, 1)
    dirs = 2 if bidirectional else 1
    per = len(params) // (num_layers * dirs)
    finals = [[] for _ in hx]
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            p = [w.astype(np.float64) for w in params[k * per:(k + 1) * per]]
            w_ih, w_hh = p[0], p[1]
            b_ih, b_hh = (p[2], p[3]) if has_biases else (None, None)
            w_hr = p[4 if has_biases else 2] if len(p) > (4 if has_biases else 2) else None
            state = tuple(h[k] for h in hx)
            steps = range(x.shape[0] - 1, -1, -1) if d else range(x.shape[0])
            ys = [None] * x.shape[0]
            for t in steps:
                ys[t], state = cell(x[t], state, w_ih, w_hh, b_ih, b_hh, w_hr)
            outs.append(np.stack(ys))
            for f, s in zip(finals, state):
                f.append(s)
        x = np.concatenate(outs, axis=-1) if dirs == 2 else outs[0]
    out = x[:, 0] if unbatched else (np.swapaxes(x, 0, 1) if batch_first else x)
    states = [np.stack(f)[:, 0] if unbatched else np.stack(f) for f in finals]
    return [out.astype(dtype)] + [s.astype(dtype) for s in states]


def _accepts(node):
    # aten.lstm.data / gru.data take a PackedSequence's data and batch sizes: not supported here
    if getattr(node.target, "_overloadname", "") == "data":
        return f"{node.op}: packed sequences (the .data overload) have no numpy kernel"
    if arg(node, 7, "train", False) and arg(node, 6, "dropout", 0.0):
        return f"{node.op}: dropout between layers in training mode has no numpy kernel"
    return True


def _recurrent_flops(gates):
    def flops(n):
        x = n.input_meta[0].shape
        steps = x[0] * (x[1] if len(x) > 2 else 1)
        weights = sum(m.numel for m in n.input_meta[2:] if len(m.shape) == 2)
        return 2 * steps * weights + gates * n.output_meta[0].numel
    return flops


@define("lstm", "compute", aten=("aten.lstm",), flops=_recurrent_flops(10), dtypes=FLOATS, accepts=_accepts)
def lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """(output, h_n, c_n) of a stacked (bi)directional LSTM; hx = [h_0, c_0]."""
    return _run(_lstm_cell, input, hx, params, has_biases, num_layers, bidirectional, batch_first)


@define("gru", "compute", aten=("aten.gru",), flops=_recurrent_flops(8), dtypes=FLOATS, accepts=_accepts)
def gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """(output, h_n) of a stacked (bi)directional GRU."""
    return _run(_gru_cell, input, [hx], params, has_biases, num_layers, bidirectional, batch_first)


@define("rnn_tanh", "compute", aten=("aten.rnn_tanh",), flops=_recurrent_flops(2), dtypes=FLOATS, accepts=_accepts)
def rnn_tanh(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _run(_rnn_cell(np.tanh), input, [hx], params, has_biases, num_layers, bidirectional, batch_first)


@define("rnn_relu", "compute", aten=("aten.rnn_relu",), flops=_recurrent_flops(1), dtypes=FLOATS, accepts=_accepts)
def rnn_relu(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _run(_rnn_cell(lambda v: np.maximum(v, 0)), input, [hx], params, has_biases, num_layers, bidirectional,
                batch_first)
