"""Watch expressions run in the expression language, not `eval` (issue 11): nothing reaches a module.

The old namespace exposed numpy, and `np.ctypeslib.ctypes.CDLL(None).system(...)` ran a shell."""
import math
import string

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opscope.debugger.watches import MAX_ELEMENTS, MAX_ITEMS, Watches
from opscope.runtime.errors import UsageError

OUT = np.array([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]], dtype=np.float32)
X = np.array([[0.5, 0.5, 0.5], [1.0, 1.0, 1.0]], dtype=np.float32)


def _watch(expr, out=OUT, inputs=(X,)):
    w = Watches()
    w.add(expr)
    inputs = list(inputs)
    w.update("0:op", out, [out], inputs)
    return w.items[0].history[-1]          # (label, text, number | None)


@pytest.mark.parametrize("attack", [
    "np.ctypeslib.ctypes.CDLL(None).system('touch {marker}')",
    "__import__('os').system('touch {marker}')",
    "().__class__.__bases__[0].__subclasses__()",
    "getattr(out, '__class__')",
    "out.__class__.__init__.__globals__",
    "[].__class__.__base__",
    "'{{0.__class__}}'.format(out)",
    "np.save('{marker}', out)",
    "out.tofile('{marker}')",
    "out.ctypes.data_as(1)",
    "out.dtype.type(1)",
    "np.lib.format.open_memmap('{marker}')",
    "math.factorial(10**6)",
    "exec('import os')",
    "eval('1')",
    "open('{marker}', 'w')",
    "inputs.append(out)",
    "out.fill(0)",
    "out.sort()",
    "np.abs(out, out=inputs[0])",
    "lambda: 1",
    "[x for x in inputs]",
    "(y := out)",
])
def test_escapes_are_refused_when_the_watch_is_added(tmp_path, attack):
    marker = tmp_path / "pwned"
    with pytest.raises(UsageError, match="^watch ") as e:
        Watches().add(attack.format(marker=marker))
    assert "\n" not in str(e.value)
    assert not marker.exists()


@pytest.mark.parametrize("expr, kind", [
    ("np.ctypeslib", "AttributeError"),           # np is a table of numbers, not numpy
    ("np.abs", "AttributeError"),                 # functions are called, never handed out
    ("out.ctypes", "AttributeError"),
    ("out.base", "AttributeError"),
    ("out.dtype.type", "AttributeError"),
    ("os", "NameError"),
    ("np.abs(out, inputs[0])", "TypeError"),      # numpy's positional out= is not a parameter here
    ("out.sum(0, None, inputs[0])", "TypeError"),
])
def test_what_is_not_there_is_a_watch_error_not_an_object(expr, kind):
    before = X.copy()
    _, text, num = _watch(expr)
    assert text.startswith(kind), text
    assert num is None
    assert np.array_equal(X, before)              # nothing wrote into the op's tensors


@pytest.mark.parametrize("expr, expected", [
    ("out.mean()", float(OUT.mean())),
    ("inputs[0].std()", float(X.std())),
    ("np.abs(out).max()", 6.0),
    ("out.abs().max()", 6.0),
    ("np.linalg.norm(out)", float(np.linalg.norm(OUT))),
    ("out.norm()", float(np.linalg.norm(OUT))),
    ("(out - inputs[0]).max()", float((OUT - X).max())),
    ("out[0, :2].sum()", -1.0),
    ("out[..., -1].min()", -6.0),
    ("out[out > 0].size", 3),
    ("out.shape[1] * len(outs)", 3),
    ("out.numel()", 6),
    ("np.mean(out, axis=0)[1]", 1.5),
    ("out.var(ddof=1)", float(OUT.var(ddof=1))),
    ("np.maximum(out, 0).sum()", 9.0),
    ("np.where(out > 0, out, 0).sum()", 9.0),
    ("math.sqrt(4) + np.pi", 2 + math.pi),
    ("float(out.max()) ** 2", 25.0),
    ("out.astype('float64').sum()", -3.0),
    ("out.reshape(3, 2)[2, 1]", -6.0),
    ("out.T[2, 1]", -6.0),
    ("round(out.mean().item(), 2)", -0.5),
])
def test_legit_watches_give_their_values(expr, expected):
    _, text, num = _watch(expr)
    assert num == pytest.approx(expected, rel=1e-5), text


def test_non_numbers_render_as_text():
    assert _watch("out.shape")[1] == "(2, 3)"
    assert _watch("out.dtype")[1] == "float32"
    assert _watch("out.dtype.name")[1] == "float32"
    assert _watch("out > 0")[1] == "array(2, 3) bool"
    assert _watch("np.isnan(out).any()")[1] == "False"
    assert _watch("np.allclose(out, out)")[1] == "True"


@pytest.mark.parametrize("expr, says", [
    ("9**9**9", "OverflowError"),
    ("[0] * 10**9", "MemoryError"),
    ("'a' * out.size * 10**9", "MemoryError"),
    ("list(big)", "MemoryError"),
    ("big.tolist()", "MemoryError"),
    ("(big[:, None] * big[None, :]).sum()", "MemoryError"),   # an outer product: refused before it is made
    ("np.maximum(big[:, None], big[None, :])", "MemoryError"),
    ("(big[:, None] == big[None, :]).any()", "MemoryError"),
    ("round(1, -10**8)", "ExprError"),
    ("out.astype('V1000000000')", "TypeError"),
    ("out[[0] * 5]", "IndexError"),                # integer-array indexing could multiply the tensor
])
def test_watches_are_bounded_like_rule_expressions(expr, says):
    big = np.zeros(max(math.isqrt(MAX_ELEMENTS), MAX_ITEMS) + 1, dtype=np.float32)
    _, text, num = _watch(expr.replace("big", "inputs[1]"), inputs=(X, big))
    assert text.startswith(says), text


def test_deep_or_long_watches_are_refused_when_added():
    for expr, says in (("(" * 4000 + "out" + ")" * 4000, "nested"), ("out" + "+out" * 500, "deeper than"),
                       ("out" + " " * 10_000, "at most 10,000")):
        with pytest.raises(UsageError, match=says):
            Watches().add(expr)


@settings(max_examples=200, deadline=10_000)
@given(st.text(alphabet=string.ascii_letters + string.digits + "._()[]:,+-*/<>=!%' ", max_size=60))
def test_fuzz_a_watch_is_refused_in_one_line_or_evaluates_to_a_value_or_a_watch_error(text):
    w = Watches()
    try:
        w.add(text)
    except UsageError as e:
        assert "\n" not in str(e)
        return
    w.update("0:op", OUT, [OUT], [X])           # never raises: a failing watch shows its error
    assert len(w.items[0].history) == 1
