"""Hostile rule packs (issue 11): bounded expressions, one line naming the file, the rule and the key.

Rule packs are data people share. None of these may hang `opscope advise` or crash it with a
traceback: each is exit 2 and one line on stderr, from a check before the work is done."""
import json
import math
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opscope.profiler.advisor import evaluate, load_pack
from opscope.profiler.advisor.expr import MAX_DEPTH, Expr, ExprError, Template, budget
from opscope.runtime.errors import UsageError

# (what, the rule key, its value): every way into `advise` the issue found, and more
HOSTILE = [
    ("huge power", "condition", "9**9**9 > 0"),
    ("huge power of a float", "gain", "2.0 ** 10**6"),
    ("round to -1e8 digits", "condition", "round(1, -10**8) == 0"),
    ("huge precision", "message", "{time.seconds:.999999999f}"),
    ("huge width", "title", "{time.seconds:>999999999}"),
    ("huge string", "condition", "len('a' * 10**9) > 0"),
    ("huge list", "condition", "len([0] * 10**9) > 0"),
    ("nested huge list", "condition", "len([[0] * 1000] * 1000) > 0"),
    ("huge product", "condition", "10**300 * 10**300 > 0"),
    ("float overflow", "gain", "1e308 * 10"),
    ("deep parentheses", "condition", "(" * 10_000 + "1" + ")" * 10_000),
    ("deep nesting", "condition", "1" + "+1" * 4000),
    ("deep unary", "condition", "-" * 5000 + "1"),
    ("dunder attribute", "condition", "time.__class__ == 1"),
    ("missing attribute", "condition", "time.seconds.real > 0"),
    ("%-format", "message", "{'%999999999d' % 1}"),
    ("join bomb", "message", "{join('a' * 90000, 'b' * 9000)}"),
    ("complex result", "gain", "(-8) ** 0.5"),
    ("a function as a value", "evidence.f", "min"),
    ("a call outside the language", "condition", "time.seconds.hex() != ''"),
]


def _pack(key, value) -> str:
    rule = {"id": "hostile", "title": "t", "message": "m", "condition": "time.seconds >= 0"}
    if "." in key:
        table, name = key.split(".")
        return _toml(rule) + f"{table} = {{ {name} = {json.dumps(value)} }}\n"
    rule[key] = value
    return _toml(rule)


def _toml(rule) -> str:
    return "[[rule]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in rule.items())


def _analyses():
    return {"run": {"model": "m", "backend": "numpy"}, "hw": {"kind": "cpu"}, "time": {"seconds": 0.01}}


@pytest.mark.parametrize("what, key, value", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_rule_is_one_error_naming_the_file_the_rule_and_the_key(tmp_path, what, key, value):
    path = tmp_path / "hostile.toml"
    path.write_text(_pack(key, value))
    with pytest.raises(UsageError) as e:
        evaluate(load_pack(path), _analyses())          # load refuses some, evaluation the rest
    msg = str(e.value)
    assert str(path) in msg and "'hostile'" in msg and key in msg, msg
    assert "\n" not in msg and len(msg) < 600


@pytest.mark.parametrize("text, says", [
    ("9**9**9", "past 1000 bits"), ("2**1001", "past 1000 bits"), ("round(1, -10**8)", "at most 100 digits"),
    ("'a' * 10**9", "repeating a str"), ("[0] * 10**9", "repeating a list"), ("[[0] * 1000] * 1000", "repeating a list"),
    ("1e308 * 10", "overflows a float"), ("2.0 ** 10000", "overflows a float"), ("1e999", "not a finite number"),
    ("(-8) ** 0.5", "not a real number"), ("'%s' % 1", "%-formatting"), ("round(1e308)", "past 1000 bits"),
    ("1" + "+1" * 200, f"deeper than {MAX_DEPTH}"), ("x" * 20_000, "at most 10,000"),
])
def test_each_bound_says_what_it_refused(text, says):
    with pytest.raises(ExprError, match=says.replace("(", r"\(").replace("*", r"\*")):
        Expr(text).evaluate({})


def test_bounds_leave_ordinary_arithmetic_alone():
    assert Expr("2**999 > 0 and 10**-400 == 0 and 'ab' * 3 == 'ababab' and [1] * 3 == [1, 1, 1]").evaluate({})
    assert Expr("round(1234.5678, 2) + round(1234, -2)").evaluate({}) == pytest.approx(2434.57)
    assert Template("{x:>10.3f}|{x:.1%}").render({"x": 0.25}) == "     0.250|25.0%"


def test_format_specs_are_checked_when_the_pack_loads():
    for spec in (".999999999f", ">999999999", "{x}", "q"):
        with pytest.raises(ExprError):
            Template("{x:" + spec + "}")


def test_the_time_budget_is_shared_by_what_runs_inside_it():
    e = Expr("1 + 1")
    assert e.evaluate({}) == 2                 # outside a budget, each evaluation has its own
    with budget(-1, "this test"):              # already spent: the first node stops it
        with pytest.raises(ExprError, match="time budget of this test"):
            e.evaluate({})
    with budget(-1, "the pack"), budget(60, "one rule"):   # nested: the earlier deadline wins
        with pytest.raises(ExprError, match="the pack"):
            e.evaluate({})


def test_a_pack_too_big_or_too_deep_is_one_line(tmp_path):
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 << 20))
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 100_000 + "]" * 100_000)
    for path, says in ((big, "at most"), (deep, "nested too deeply")):
        with pytest.raises(UsageError, match=says) as e:
            load_pack(path)
        assert str(path) in str(e.value) and "\n" not in str(e.value)


# --- through the command line --------------------------------------------------------------------

@pytest.fixture(scope="module")
def run_home(tmp_path_factory):
    """One profiled run in a store of its own, shared by the CLI tests below."""
    import os

    from opscope.profiler import profile
    from opscope.runtime import models
    home = tmp_path_factory.mktemp("opscope-home")
    old = os.environ.get("OPSCOPE_HOME")
    os.environ["OPSCOPE_HOME"] = str(home)
    try:
        model, inputs = models.load("demo:mlp")
        run_id = profile("demo:mlp", "numpy", model=model, inputs=inputs)
    finally:
        if old is None:
            os.environ.pop("OPSCOPE_HOME")
        else:
            os.environ["OPSCOPE_HOME"] = old
    return home, run_id


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.parametrize("what, key, value", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_advise_with_a_hostile_pack_exits_2_with_one_line(tmp_path, monkeypatch, capsys, run_home, what, key, value):
    from opscope.app.cli import main
    home, run_id = run_home
    monkeypatch.setenv("OPSCOPE_HOME", str(home))
    path = tmp_path / "hostile.toml"
    path.write_text(_pack(key, value))
    with pytest.raises(SystemExit) as e:
        main(["advise", run_id, "--rules", str(path), "--json"])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and str(path) in err and "'hostile'" in err and key in err, err


@pytest.mark.multiprocess
@pytest.mark.slow
def test_advise_in_a_subprocess_refuses_the_hangs_the_issue_found(tmp_path, run_home, cli):
    home, run_id = run_home
    for key, value in (("condition", "9**9**9 > 0"), ("condition", "round(1, -10**8) == 0"),
                       ("message", "{time.seconds:.999999999f}")):
        path = tmp_path / "hang.toml"
        path.write_text(_pack(key, value))
        r = cli("advise", run_id, "--rules", path, timeout=120, env={"OPSCOPE_HOME": str(home)})
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert str(path) in r.stderr and "'hostile'" in r.stderr and key in r.stderr


# --- fuzzing -------------------------------------------------------------------------------------

NS = {"a": {"b": 2, "s": "text", "items": [1, 2.5, "x"], "d": {"k": -1}}, "time": {"seconds": 0.01}}
ATOMS = st.sampled_from(["a", "a.b", "a.s", "a.items", "a.d", "a.d.k", "a.nope", "time.seconds", "zz", "true",
                         "None", "0", "1", "-1", "2", "9", "10**8", "1e308", "0.5", "'s'", "''", "[]", "[0]",
                         "a.__class__", "a.items[0]", "a.items[9]", "a['b']", "min", "1j", "...", "x.y.z"])
BINOPS = st.sampled_from(["+", "-", "*", "/", "//", "%", "**", " and ", " or ", " < ", " == ", " in ", " not in "])
FUNCS = st.sampled_from(["min", "max", "abs", "len", "round", "ms", "pct", "size", "join", "float", "__import__"])


def _exprs():
    return st.recursive(ATOMS, lambda inner: st.one_of(
        st.tuples(inner, BINOPS, inner).map(lambda t: f"({t[0]}{t[1]}{t[2]})"),
        st.tuples(st.sampled_from(["-", "not ", "+"]), inner).map("".join),
        st.tuples(FUNCS, st.lists(inner, max_size=3)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
        st.lists(inner, max_size=4).map(lambda xs: f"[{', '.join(xs)}]"),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
    ), max_leaves=12)


def _only_expr_errors(evaluate_it):
    try:
        with budget(1.0, "the fuzz case"):
            evaluate_it()
    except ExprError:
        pass


FUZZ = settings(max_examples=300, deadline=10_000, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(alphabet=string.printable + "αλ∞\x00", max_size=80))
def test_fuzz_arbitrary_text_only_raises_the_language_error(text):
    _only_expr_errors(lambda: Expr(text).evaluate(NS))
    _only_expr_errors(lambda: Template(text).render(NS))


@FUZZ
@given(_exprs(), st.sampled_from(["", ".2f", ">8", ".1%", ",", "c", "x", "e"]))
def test_fuzz_small_expressions_only_raise_the_language_error(text, spec):
    _only_expr_errors(lambda: Expr(text).evaluate(NS))
    _only_expr_errors(lambda: Template("{" + text + (":" + spec if spec else "") + "}").render(NS))


@FUZZ
@given(_exprs())
def test_fuzz_results_stay_within_bounds(text):
    try:
        with budget(1.0, "the fuzz case"):
            v = Expr(text).evaluate(NS)
    except ExprError:
        return
    if isinstance(v, int):
        assert math.isfinite(float(v))       # every int converts: the engine's float(gain) cannot overflow
    assert not isinstance(v, complex) and not callable(v)


def test_each_rule_has_a_time_budget_however_many_items_its_for_each_has(tmp_path, monkeypatch):
    """The budget covers a whole rule (its for_each items, evidence and message), not one expression."""
    from opscope.profiler.advisor import expr
    path = tmp_path / "many.toml"
    path.write_text(_toml({"id": "many", "title": "t", "message": "{item.op}", "condition": "item.calls >= 0",
                           "gain": "0", "for_each": "fallback.ops"}))
    pack = load_pack(path)
    analyses = {**_analyses(), "fallback": {"ops": [{"op": f"op{i}", "calls": i} for i in range(50)]}}
    assert len(evaluate(pack, analyses)) == 50
    monkeypatch.setattr(expr, "SECONDS", 0.0)          # a rule that cannot finish in its budget
    with pytest.raises(UsageError, match="one rule") as e:
        evaluate(pack, analyses)
    assert str(path) in str(e.value) and "'many'" in str(e.value)
