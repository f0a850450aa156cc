"""PyTorch's OpInfo suite on any backend: PyTorch's own sample inputs and tolerances, not ours.

Each OpInfo sample (float32 unless asked for another dtype, the first three per OpInfo) becomes a one-op
`nn.Module`, is captured the way a user's model is (torch.export), placed on the backend and run; the
result is compared with the op's eager output by `torch.testing.assert_close` at its default tolerances
for the dtype. An OpInfo counts when opscope claims every op its capture contains ("claimed"); the rest
are listed as unclaimed or not capturable -- and "not capturable" means torch.export itself refused the
sample: opscope failing to translate what torch exported is a crash of opscope's capture.

A bfloat16 result comes back from numpy as float32 values; it must already be bfloat16 values (each one
exactly representable), never rounded here -- rounding it here would hide a kernel that skipped it.
Random ops (dropout, bernoulli, rand*) are compared by distribution: five draws on each side, a
two-sample Kolmogorov-Smirnov test (a permutation: the same multiset of values).

    from opscope.runtime.opinfo import check_opinfo
    report = check_opinfo(resolve("numpy"), names=["add", "nn.functional.conv2d"])
    report.counts()    # {"pass": .., "fallback": .., "refused": .., "wrong": .., "crash": .., ...}

A node the backend refuses runs on its fallback (torch:cpu when the backend names none), so a
"fallback" result is a correct answer with some nodes refused; "crash" is a kernel that was
claimed and then raised, or opscope's capture raising on what torch exported -- the things that must
never happen. On a compiler stack (`check_opinfo(backend, spec=SPEC)`, what `backend check --opinfo` does) each
OpInfo runs in a worker process (runtime/opinfo_worker.py): a stack dying by a signal or hanging inside its own
C++ is a "crash" of that OpInfo, naming the signal, and the check goes on.
"""
from __future__ import annotations

import contextlib
import io
import logging
import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils import _pytree as pytree

from .dtypes import name_of, round_to_bfloat16, to_torch
from .errors import UsageError, first_line
from .uninitialised import UNINITIALISED

SAMPLES_PER_OP = 3
STATUSES = ("pass", "fallback", "refused", "wrong", "crash", "uncapturable", "unclaimed")
# Worse first: an OpInfo's status is the worst over its claimed samples. "refused": no backend in
# the fallback chain took a node (a clean refusal, not a crash).
_RANK = {"crash": 0, "wrong": 1, "refused": 2, "fallback": 3, "pass": 4}
# OpInfos whose values are undefined (UNINITIALISED): compare shape and dtype only. Random ops are
# found by running them (see _random_draws), not listed.


@dataclass
class OpInfoResult:
    """One OpInfo on one backend."""

    name: str
    status: str                         # one of STATUSES
    ops: list[str] = field(default_factory=list)       # opscope ops its samples captured to
    samples: int = 0                    # claimed samples that ran
    message: str = ""                   # the first failure, or why not claimed
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"opinfo": self.name, "status": self.status, "ops": self.ops, "samples": self.samples,
                "message": self.message, "seconds": round(self.seconds, 4)}


@dataclass
class OpInfoReport:
    backend: str
    results: list[OpInfoResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def claimed(self) -> list[OpInfoResult]:
        return [r for r in self.results if r.status in _RANK]

    @property
    def failed(self) -> list[OpInfoResult]:
        return [r for r in self.results if r.status in ("wrong", "crash")]

    def counts(self) -> dict:
        out = dict.fromkeys(STATUSES, 0)
        for r in self.results:
            out[r.status] += 1
        return out

    def as_dict(self) -> dict:
        return {"backend": self.backend, "summary": self.counts(), "ok": not self.failed,
                "seconds": self.seconds, "results": [r.as_dict() for r in self.results]}


def op_db() -> list:
    try:
        from torch.testing._internal.common_methods_invocations import op_db as db
    except ImportError as e:       # expecttest is what is usually missing
        raise UsageError(f"PyTorch's OpInfo database does not import here ({e}); `pip install expecttest`") from e
    return db


def select(names=None, dtype: str = "float32") -> list:
    """OpInfos defined for `dtype` on the CPU, optionally only `names` (OpInfo name or name.variant)."""
    want = to_torch(dtype)
    db = [o for o in op_db() if want in o.supported_dtypes("cpu")]
    if not names:
        return db
    by = {_full_name(o): o for o in db}
    unknown = [n for n in names if n not in by]
    if unknown:
        raise UsageError(f"no {dtype} OpInfo named {', '.join(unknown)} (names look like add, nn.functional.conv2d, "
                         "max.reduction_with_dim)")
    return [by[n] for n in names]


def check_opinfo(backend, names=None, progress=None, samples_per_op: int = SAMPLES_PER_OP,
                 dtype: str = "float32", *, on_result=None) -> OpInfoReport:
    """Run the OpInfo samples (of `dtype`) of every selected OpInfo on `backend`, in this process; `progress(name)`
    before each, `on_result(result)` after each. A compiler stack's check runs in worker processes instead:
    runtime/opinfo_worker.py `check` decides."""
    import time

    from .backends import resolve
    if backend.fallback is None and not backend.name.startswith("torch"):
        backend.fallback = resolve("torch:cpu")      # refused nodes still run, so their answer is checked
    report = OpInfoReport(backend.name)
    t0 = time.perf_counter()
    with _quiet(), np.errstate(all="ignore"):
        for info in select(names, dtype):
            if progress:
                progress(_full_name(info))
            t = time.perf_counter()
            result = _check_one(backend, info, samples_per_op, to_torch(dtype))
            result.seconds = time.perf_counter() - t
            report.results.append(result)
            if on_result:
                on_result(result)
    report.seconds = time.perf_counter() - t0
    return report


def _full_name(info) -> str:
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


@contextlib.contextmanager
def _quiet():
    # torch.export and OpInfo sample generators warn on almost every call; the report says what matters.
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), _no_test_search():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _no_test_search():
    """OpInfo's samples drawn without looking for the unittest.TestCase they are drawn in.

    NOTE: every sample_inputs() call runs torch's extract_test_fn twice: inspect.stack() reads the source line of
    every frame, and for a frame of no module (<string>: xdist's workers, runpy) inspect.getmodule scans all of
    sys.modules -- ~0.1 s of CPU per OpInfo in a pytest-xdist worker (6.4 s for 68 first samples, 0.1 s without),
    most of a whole-suite check on torch:cpu. opscope's checks run in no TestCase, so the search finds none and the
    seed is torch's SEED: answering "none" at once gives the same samples, and a caller that is a TestCase no
    longer reseeds them with its name."""
    try:
        from torch.testing._internal import common_utils
        from torch.testing._internal.opinfo import core
    except ImportError:               # (op_db() says what is missing)
        yield
        return
    saved = common_utils.extract_test_fn, core.extract_test_fn
    common_utils.extract_test_fn = core.extract_test_fn = _no_test
    try:
        yield
    finally:
        common_utils.extract_test_fn, core.extract_test_fn = saved


def _no_test():
    return None


def _check_one(backend, info, n, dtype=torch.float32) -> OpInfoResult:
    name = _full_name(info)
    result = OpInfoResult(name, "uncapturable")
    try:
        samples = list(_first(info.sample_inputs("cpu", dtype, requires_grad=False), n))
    except Exception as e:  # a sample generator that needs something this machine lacks
        result.message = f"no samples: {type(e).__name__}: {first_line(e)[:160]}"
        return result
    statuses, ops = [], set()
    unclaimed = uncapturable = ""
    for i, sample in enumerate(samples):
        status, why, sample_ops = _check_sample(backend, info, sample)
        ops.update(sample_ops)
        if status == "uncapturable":
            uncapturable = uncapturable or f"sample {i}: {why}"
        elif status == "unclaimed":
            unclaimed = unclaimed or f"sample {i}: {why}"
        else:
            statuses.append(status)
            if status in ("wrong", "crash") and not result.message:
                result.message = f"sample {i}: {why}"
    result.ops = sorted(ops)
    if statuses:
        result.status = min(statuses, key=_RANK.__getitem__)
        result.samples = len(statuses)
    elif unclaimed:
        result.status, result.message = "unclaimed", unclaimed
    else:
        result.message = uncapturable or f"no {name_of(dtype)} samples"
    return result


def _first(it, n):
    for i, x in enumerate(it):
        if i >= n:
            return
        yield x


class _OneOp(torch.nn.Module):
    """The sample's op as a model: its tensors are the model's inputs, everything else is fixed."""

    def __init__(self, fn, spec, consts):
        super().__init__()
        self.fn, self.spec, self.consts = fn, spec, consts

    def forward(self, *tensors):
        it = iter(tensors)
        leaves = [next(it) if c is _TENSOR else c for c in self.consts]
        inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.fn(inp, *args, **kwargs)


_TENSOR = object()


def replica(t: torch.Tensor) -> torch.Tensor:
    """A copy of a sample tensor as OpInfo built it: its whole storage copied, the same size, strides and storage
    offset over it. NOTE: not `clone()` -- a clone is a fresh contiguous tensor, which removes what a partial-view
    sample (as_strided over a view with a storage_offset) tests. Each run gets its own, so in-place ops never leak."""
    if t.layout != torch.strided:
        return t.clone()
    storage = t.untyped_storage().clone()
    out = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.size(), t.stride())
    if t.is_conj():                    # the storage holds the values before the lazy conjugation
        out = out.conj()
    if t.is_neg():
        out = torch._neg_view(out)
    return out


def _check_sample(backend, info, sample) -> tuple[str, str, set]:
    from .capture import ExportRefused, export, translate_export
    from .errors import UnsupportedOpError
    from .executor import Executor, compile_plan
    from .ops import OPS

    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    consts = [_TENSOR if isinstance(x, torch.Tensor) else x for x in leaves]
    model = _OneOp(info.op, spec, consts)
    sparse = sorted({str(t.layout) for t in tensors if t.layout != torch.strided})
    if sparse:                  # opscope's graphs hold strided tensors: it claims nothing of a sparse sample
        return "unclaimed", f"sparse input ({', '.join(sparse)}): opscope takes strided tensors", set()
    try:
        expected = model(*[replica(t) for t in tensors])
        draws = None if info.name in UNINITIALISED else _random_draws(info, model, tensors)
    except Exception as e:
        return "uncapturable", f"eager: {type(e).__name__}: {first_line(e)[:160]}", set()
    try:
        ep = export(model, tuple(replica(t) for t in tensors), name=info.name)
    except ExportRefused as e:          # torch.export's own refusal: not ours to count
        return "uncapturable", first_line(e)[:200], set()
    try:
        graph = translate_export(ep, info.name)
    except Exception as e:  # torch exported it and opscope could not take it: opscope's capture crashed
        return "crash", f"capture: {type(e).__name__}: {first_line(e)[:200]}", set()
    ops = {n.op for n in graph.nodes}
    claims = set(backend.ops.ops())
    missing = sorted(o for o in ops if o not in OPS or o not in claims)
    if missing:
        return "unclaimed", f"no opscope op claimed for {', '.join(missing)}", ops
    try:
        plan = compile_plan(graph, backend, allow_fallback=True)
    except UnsupportedOpError as e:
        return "refused", first_line(e)[:200], ops
    except Exception as e:  # a compiler stack that cannot compile the op's region: that OpInfo crashed, not the check
        return "crash", f"{type(e).__name__}: {first_line(e)[:200]}", ops
    try:
        fell_back = any(getattr(node, "fallback", False) for node, _ in plan.placement.assignments)
        executor = Executor(plan)
        actual = executor.run_host(*[replica(t) for t in tensors])
        if draws:
            block = _block(graph)
            if block > 1:                # few independent draws per run: draw more runs, on both sides
                units = max(1, sum(np.size(a) for a in actual) // block)
                draws = _random_draws(info, model, tensors, min(_MAX_DRAWS, max(len(draws), -(-_UNITS // units))))
            why = _compare(actual, expected, shape_only=True) or _same_distribution(
                [actual] + [executor.run_host(*[replica(t) for t in tensors]) for _ in range(len(draws) - 1)], draws,
                block=block)
        else:
            why = _compare(actual, expected, shape_only=info.name in UNINITIALISED)
    except Exception as e:  # claimed, then raised: what the check exists to catch
        return "crash", f"{type(e).__name__}: {first_line(e)[:200]}", ops
    if why:
        return "wrong", why, ops
    return ("fallback" if fell_back else "pass"), "", ops


# A per-channel dropout of 5 channels decides 25 things in five runs, too few to tell a keep rate of 0.75 from
# 0.5: such ops run until each side has made about _UNITS independent draws (a keep rate of 0.75 for 0.5 then lands
# near p=1e-12; values, not masks, are compared, and the kept half of them dilutes the difference).
_UNITS, _MAX_DRAWS = 2000, 500


def _random_draws(info, model, tensors, n: int = 5) -> list | None:
    """n draws (five unless asked) of the sample's outputs under different seeds when its values depend on the random
    stream (dropout with p > 0, rand_like...), else None.

    OpInfo wraps such ops in `wrapper_set_seed`, which reseeds torch before every call so that eager
    runs agree; the run on a backend cannot follow torch's stream. Run the op under different seeds
    without the reseeding: different answers mean a random op, and the draws are the distribution the
    backend's answers are compared with."""
    code = getattr(info.op, "__code__", None)
    if code is None or "wrapper_set_seed" not in code.co_names:
        return None
    module = info.op.__globals__
    saved = module["wrapper_set_seed"]
    module["wrapper_set_seed"] = lambda op, *args, **kwargs: op(*args, **kwargs)
    try:
        outs = []
        for seed in range(1, n + 1):     # five draws: a few-element sample rarely repeats by chance
            torch.manual_seed(seed)
            outs.append([x for x in pytree.tree_leaves(model(*[replica(t) for t in tensors]))
                         if isinstance(x, torch.Tensor)])
    finally:
        module["wrapper_set_seed"] = saved
    first = outs[0]
    random = any(not torch.equal(a, b) for other in outs[1:] for a, b in zip(first, other)
                 if not (a.is_floating_point() and a.isnan().any()))
    return outs if random else None


# Ops whose one random draw covers a whole channel: (N, C, *) keeps or drops each (n, c) slice as one.
_PER_CHANNEL = ("feature_dropout", "feature_alpha_dropout")


def _block(graph) -> int:
    """How many output values one random draw decides: a channel's size for the per-channel dropouts, else 1."""
    block = 1
    for node in graph.nodes:
        if node.op in _PER_CHANNEL and node.input_meta and len(node.input_meta[0].shape) > 2:
            block = max(block, math.prod(node.input_meta[0].shape[2:]))
    return block


def _same_distribution(actual_draws: list, eager_draws: list, block: int = 1) -> str:
    """'' when the backend's draws could come from the distribution eager's came from, else why not.

    `block` values share one random draw (a dropped channel is `block` zeros): the test then counts draws,
    not values -- a KS p over correlated values calls an honest dropout3d wrong about one run in three."""
    from scipy.stats import ks_2samp, kstwobign

    for i in range(len(eager_draws[0])):
        want = [np.asarray(d[i].detach().double().numpy()).ravel() for d in eager_draws]
        got = [np.asarray(np.asarray(d[i], dtype=np.float64)).ravel() for d in actual_draws]
        if all(np.array_equal(np.sort(g), np.sort(want[0])) for g in got):
            continue                     # a permutation of the same values (randperm, shuffles), or equal
        # a seeded generator (opscope's dropout mask) draws the same every run: those are one draw, not five
        # (only when every run drew the same: five channels repeat a pattern by chance, and dropping repeats skews)
        if all(np.array_equal(x, got[0], equal_nan=True) for x in got[1:]):
            got = got[:1]
        w, g = np.concatenate(want), np.concatenate(got)
        w, g = w[~np.isnan(w)], g[~np.isnan(g)]
        if len(w) < 20 or len(g) < 20:
            continue                     # too few values to tell two distributions apart
        if block == 1:
            p = ks_2samp(g, w).pvalue
        else:                            # the same statistic, its p from the number of independent draws
            n, m = len(g) / block, len(w) / block
            p = float(kstwobign.sf(ks_2samp(g, w).statistic * math.sqrt(n * m / (n + m))))
        # values within a draw need not be independent beyond `block` (rand's float bits, a shuffled index), so the
        # test is held to a strict p: a wrong distribution (a shifted normal, a wrong keep rate) still lands far below
        if p < 1e-6:
            return (f"output {i}: values do not follow eager's distribution (KS p={p:.1e}; mean {g.mean():.4g} "
                    f"vs {w.mean():.4g}, std {g.std():.4g} vs {w.std():.4g})")
    return ""


def _compare(actual: list, expected, shape_only: bool) -> str:
    """'' when equal at assert_close's float32 tolerances, else what differs."""
    want = [x for x in pytree.tree_leaves(expected)]
    if len(actual) != len(want):
        return f"{len(actual)} outputs, want {len(want)}"
    for i, (a, e) in enumerate(zip(actual, want)):
        if not isinstance(e, torch.Tensor):
            if isinstance(e, (int, float, bool)) and not (isinstance(e, float) and math.isnan(e)):
                if not np.allclose(np.asarray(a, dtype=np.float64), float(e), rtol=1.3e-6, atol=1e-5):
                    return f"output {i}: {a!r}, want {e!r}"
            continue
        got = torch.from_numpy(np.array(a)) if not isinstance(a, torch.Tensor) else a   # np.array keeps 0-d
        if e.layout != torch.strided:
            e = e.to_dense()                  # a backend hands sparse results back dense
        if e.dtype == torch.complex32 and got.dtype == torch.complex64:
            e = e.to(torch.complex64)         # exact: numpy holds complex32 values as complex64
        if e.dtype == torch.bfloat16 and got.dtype == torch.float32:
            # numpy holds bfloat16 in float32: the values must already be bfloat16 ones (never rounded here)
            held = got.numpy()
            off = int((~np.isnan(held) & (round_to_bfloat16(held) != held)).sum())
            if off:
                return f"output {i}: {off} of {held.size} values are not bfloat16 values (a kernel did not round)"
            got = got.to(torch.bfloat16)      # exact: every value is a bfloat16
        if tuple(got.shape) != tuple(e.shape):
            return f"output {i}: shape {tuple(got.shape)}, want {tuple(e.shape)}"
        if got.dtype != e.dtype:
            return f"output {i}: dtype {got.dtype}, want {e.dtype}"
        if shape_only:
            continue
        try:
            torch.testing.assert_close(got, e.detach(), equal_nan=True, check_device=False, check_stride=False)
        except AssertionError as err:
            lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
            return f"output {i}: " + "; ".join(lines[:3])[:200]
    return ""
