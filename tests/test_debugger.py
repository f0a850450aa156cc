"""The stepping controller, breakpoints, watches, lockstep and run-to-NaN, without the UI."""
import math

import numpy as np
import pytest

from opscope.debugger import breakpoints as bps
from opscope.debugger.controller import Controller, Failed, Finished, Stop
from opscope.debugger.stats import page, sparkline, summarize
from opscope.debugger.watches import Watches
from opscope.runtime import open_session
from opscope.runtime.errors import UsageError

from debugger_models import (LOW_PRECISION_TOML, LOW_SOFTMAX_TOML, NAN_WEIGHT, NUMERICS, PLANTED_NAN, RAISES,
                             RAISE_IN_FORWARD, SOFTMAX, TWO_NANS, write)


@pytest.fixture(scope="module")
def mlp():
    return open_session("demo:mlp", "numpy")


@pytest.fixture
def ctl_of():
    made = []

    def make(session, **kw):
        c = Controller(session, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.quit()


def test_step_stops_after_every_op_in_order(mlp, ctl_of):
    c = ctl_of(mlp)
    seen = []
    for _ in range(len(mlp.plan.steps)):
        assert c.step()
        ev = c.wait()
        assert isinstance(ev, Stop) and ev.reason == "step"
        seen.append(ev.node.name)
        assert ev.output_stats[0].shape == tuple(ev.node.output_meta[0].shape)
    assert seen == [st.node.name for st in mlp.plan.steps]
    c.step()
    assert isinstance(c.wait(), Finished)
    assert not c.step()                      # finished: only restart runs again
    c.restart()
    ev = c.wait()
    assert isinstance(ev, Stop) and ev.seq == 0


def test_stop_shows_inputs_and_outputs_of_the_op(mlp, ctl_of):
    c = ctl_of(mlp)
    c.step()
    ev = c.wait()                             # linear(x, weight, bias)
    # parameters are named after the model's own attribute paths
    assert [s.name for s in ev.input_stats] == ["in0", "in1 0.weight", "in2 0.bias"]
    x = mlp.inputs[0].numpy()
    assert ev.input_stats[0].mean == pytest.approx(float(x.mean()), rel=1e-6)
    w, b = mlp.model[0].weight.detach().numpy(), mlp.model[0].bias.detach().numpy()
    np.testing.assert_allclose(ev.outputs[0][1], x @ w.T + b, rtol=1e-5, atol=1e-5)


def test_breakpoint_on_op_type_and_path(mlp, ctl_of):
    c = ctl_of(mlp, breakpoints=["relu"])
    c.cont()
    ev = c.wait()
    assert ev.node.name == "relu" and "relu" in ev.reason
    c.cont()
    assert c.wait().node.name == "relu_1"
    c.cont()
    assert isinstance(c.wait(), Finished)
    c2 = ctl_of(mlp, breakpoints=["node:linear_2"])
    c2.cont()
    assert c2.wait().node.name == "linear_2"
    c2.quit()                                 # one controller per session at a time
    c3 = ctl_of(mlp, breakpoints=["2"])       # module path glob: the second Linear is module "2"
    c3.cont()
    assert c3.wait().node.name == "linear_1"


def test_conditional_breakpoint_on_output_stat(mlp, ctl_of):
    # relu outputs are >= 0, linears are not: `min < 0` skips nothing but relus
    c = ctl_of(mlp, breakpoints=["relu* if max_abs > 0"])
    c.cont()
    assert c.wait().node.name == "relu"
    c.quit()
    never = ctl_of(mlp, breakpoints=["max_abs > 1e30"])
    never.cont()
    assert isinstance(never.wait(), Finished)


def test_breakpoint_specs_parse_and_reject():
    assert bps.parse("linear").op == "linear"
    assert bps.parse("layers.0.*").glob == "layers.0.*"
    assert bps.parse("nan").cond == "nan"
    assert bps.parse("err > 1e-3").cond == "err > 0.001"
    b = bps.parse("attn.* if inf")
    assert (b.glob, b.cond) == ("attn.*", "inf")
    with pytest.raises(UsageError, match="condition"):
        bps.parse("x if max_abs >> 3")
    with pytest.raises(UsageError, match="neither a place nor a condition"):
        bps.parse("max_abs >> 3")
    with pytest.raises(UsageError, match="unknown op"):
        bps.parse("op:nosuchop")


def test_finish_and_step_into_follow_the_module_tree():
    s = open_session("demo:gpt", "numpy")
    c = Controller(s, breakpoints=["node:split"])        # the first op of h.0.attn itself
    try:
        c.cont()
        assert c.wait().node.module_path == "h.0.attn"
        c.finish()
        ev = c.wait()                                   # the last op inside h.0.attn (its proj linear)
        assert (ev.node.name, ev.node.module_path, ev.reason) == ("linear_1", "h.0.attn.proj", "end of module")
        c.finish()                                      # proj is done: finishing goes up to h.0
        assert c.wait().node.name == "add_2"
        c.step_into()                                   # the next module's first op
        ev = c.wait()
        assert (ev.node.name, ev.node.module_path) == ("layer_norm_2", "h.1.ln_1")
    finally:
        c.quit()


def test_watches_evaluate_at_every_stop_with_history(mlp, ctl_of):
    c = ctl_of(mlp)
    c.add_watch("out.mean()")
    c.add_watch("inputs[0].std()")
    c.add_watch("inputs[5].std()")            # fails on every op: shown, not fatal
    for _ in range(3):
        c.step()
        ev = c.wait()
    mean, std, bad = c.watches.items
    assert len(mean.history) == 3
    assert mean.history[-1][2] == pytest.approx(float(ev.outputs[0][1].mean()), rel=1e-5)
    assert std.history[-1][2] == pytest.approx(float(ev.inputs[0][1].std()), rel=1e-5)
    assert "IndexError" in bad.last


def test_watch_sandbox_refuses_escapes():
    w = Watches()
    for expr in ("().__class__", "__import__('os')", "lambda: 1", "out +"):
        with pytest.raises(UsageError):
            w.add(expr)
    w.add("open")                              # not a builtin here: evaluates to an error
    w.update("0", np.ones(2), [np.ones(2)], [])
    assert "NameError" in w.items[0].last


def test_run_to_nan_stops_at_the_planted_log(tmp_path, ctl_of):
    s = open_session(write(tmp_path, "planted.py", PLANTED_NAN) + ":factory", "numpy")
    c = ctl_of(s)
    c.step()
    c.wait()
    c.run_to_nan()
    ev = c.wait()
    assert isinstance(ev, Stop)
    assert ev.node.op == "log"
    assert ev.output_stats[0].nan > 0
    assert all(st.nan == 0 for st in ev.input_stats)
    assert ev.nan_origin.startswith("introduced here") and "in0[" in ev.nan_origin


def test_break_on_nan_flag_stops_at_the_same_op(tmp_path, ctl_of):
    s = open_session(write(tmp_path, "planted.py", PLANTED_NAN) + ":factory", "numpy")
    c = ctl_of(s, break_on_nan=True)
    c.cont()
    ev = c.wait()
    assert ev.node.op == "log"
    c.cont()
    # tanh(NaN) is NaN, and so is every op after it: --break-on-nan stops only where NaN is made
    assert isinstance(c.wait(), Finished)


def test_lockstep_on_numpy_is_exact(mlp, ctl_of):
    c = ctl_of(mlp, reference="numpy")
    c.cont()
    assert isinstance(c.wait(), Finished)      # no op exceeds the tolerance
    c.restart()
    ev = c.wait()
    assert ev.diff.err == 0 and ev.diff.local == 0 and ev.diff.cosine == pytest.approx(1.0)


def test_lockstep_stops_at_the_low_precision_op_and_not_before(tmp_path, ctl_of):
    chip = write(tmp_path, "lowp.toml", LOW_PRECISION_TOML)
    s = open_session(write(tmp_path, "numerics.py", NUMERICS) + ":factory", chip)
    c = ctl_of(s, reference="numpy", tolerance=1e-5)
    c.cont()
    ev = c.wait()
    assert isinstance(ev, Stop)
    assert ev.node.op == "linear" and ev.node.module_path == "fc1"
    assert ev.diff.introduced and ev.diff.local > 1e-5
    assert "introduced" in ev.diff.verdict()
    c.cont()
    ev2 = c.wait()                             # relu inherits the error but adds none: no stop there
    assert ev2.node.op == "linear" and ev2.node.module_path == "fc2"
    # stepping shows the relu in between: its error is inherited
    c.restart()
    c.wait()
    ops = []
    while True:
        c.step()
        e = c.wait()
        if not isinstance(e, Stop):
            break
        ops.append(e)
    relu = next(e for e in ops if e.node.op == "relu")
    assert relu.diff.exceeds and not relu.diff.introduced
    before = [e for e in ops if e.seq < ev.seq]
    assert before and all(e.diff is None or e.diff.err == 0 for e in before)


def test_a_model_that_raises_reports_the_op_and_restart_works(tmp_path, ctl_of):
    s = open_session(write(tmp_path, "raises.py", RAISES) + ":factory", "numpy")
    c = ctl_of(s)
    c.cont()
    ev = c.wait()
    assert isinstance(ev, Failed)
    assert ev.node.op == "dbg_test_explode"
    assert "refused its input" in ev.message and ev.input_stats
    c.restart()
    again = c.wait()
    assert isinstance(again, Stop) and again.seq == 0


def test_stats_of_a_big_tensor_sample_the_histogram():
    a = np.random.default_rng(0).standard_normal(4_000_000).astype(np.float32)
    a[7] = np.nan
    a[9] = np.inf
    s = summarize("x", a)
    assert (s.nan, s.inf) == (1, 1)
    assert s.note == "histogram sampled" and len(s.hist) == 16
    assert abs(s.mean) < 0.01 and s.std == pytest.approx(1.0, abs=0.01)
    assert len(sparkline(s.hist)) == 16


def test_page_renders_only_the_window():
    a = np.arange(10_000 * 64, dtype=np.float32).reshape(100, 100, 64)
    text, total = page(a, start=9_998, rows=5, cols=4)
    assert total == 10_000
    assert text.count("\n") == 1               # only the last two rows exist from there
    assert text.startswith("[99,98]")
    assert math.isclose(float(text.split()[1]), 9_998 * 64, rel_tol=1e-3)


# --- the advisor on a debug session ---------------------------------------------------------------

def test_session_advice_matches_the_advisor_on_a_stored_run_of_the_same_model(ctl_of):
    """sim times are roofline estimates: the debugger's own records and a profiled run must agree."""
    from opscope.debugger.advice import advise_session
    from opscope.profiler import profile
    from opscope.profiler.advisor import advise

    s = open_session("demo:gpt", "sim:edge-gpu")
    c = ctl_of(s)
    c.step()
    assert isinstance(c.wait(), Stop)
    partial = advise_session(c)
    assert not partial.complete and partial.ops == 1 and "run so far" in partial.notes[0]
    c.cont()
    assert isinstance(c.wait(), Finished)
    mine = advise_session(c)
    assert mine.complete and mine.ops == len(s.plan.steps) and mine.simulated
    run_id = profile("demo:gpt", "sim:edge-gpu", model=s.model, inputs=s.inputs)
    stored = advise(run_id)
    assert [a.id for a in mine.advice] == [a.id for a in stored]
    assert any(a.rule == "reduced-precision" for a in mine.advice)
    for a, b in zip(mine.advice, stored):
        # the estimate is rescaled to measured times, which the store keeps as whole ns: ~1e-6 apart from the session's
        assert a.estimated_gain["seconds"] == pytest.approx(b.estimated_gain["seconds"], rel=1e-5)


def test_session_advice_on_a_fallback_op_names_the_op_to_implement(ctl_of):
    """npu-a1's description marks gelu unsupported: it falls back, and implementing it comes first."""
    from opscope.debugger.advice import advise_session

    s = open_session("demo:gpt", "sim:npu-a1")
    c = ctl_of(s)
    c.cont()
    assert isinstance(c.wait(), Finished)
    first = advise_session(c).advice[0]
    assert first.rule == "implement-fallback-op" and "gelu" in first.title
    assert first.evidence["transfer_bytes"] > 0


# --- second pass: NaN origins, dead breakpoints, history, the Python side, lockstep cost --------------

def test_second_e_goes_to_the_next_op_that_makes_a_nan_not_one_that_carries_it(tmp_path, ctl_of):
    s = open_session(write(tmp_path, "two.py", TWO_NANS) + ":factory", "numpy")
    c = ctl_of(s)
    c.run_to_nan()
    first = c.wait()
    assert first.node.op == "log" and first.reason == "NaN made here"
    c.run_to_nan()
    second = c.wait()                   # tanh and add carry NaN #1: skipped; sqrt makes NaN #2
    assert second.node.op == "sqrt", second.node.name
    assert second.nan_origin.startswith("introduced here")
    c.run_to_nan()
    assert isinstance(c.wait(), Finished)


def test_break_on_nan_stops_only_where_a_nan_is_made(tmp_path, ctl_of):
    s = open_session(write(tmp_path, "two.py", TWO_NANS) + ":factory", "numpy")
    c = ctl_of(s, break_on_nan=True)
    made = []
    while True:
        c.cont()
        ev = c.wait()
        if not isinstance(ev, Stop):
            break
        made.append(ev.node.op)
    assert made == ["log", "sqrt"]
    c.restart()
    c.wait()
    carried = []                                # stepping shows the ops that only carry it, said so
    while True:
        c.step()
        ev = c.wait()
        if not isinstance(ev, Stop):
            break
        if ev.node.op == "tanh":
            carried.append(ev.nan_origin)
    assert carried and "inherited from an earlier op (first made by" in carried[0] and "log" in carried[0]


def test_a_nan_in_a_weight_names_the_parameter(tmp_path, ctl_of):
    s = open_session(write(tmp_path, "w.py", NAN_WEIGHT) + ":factory", "numpy")
    c = ctl_of(s)
    c.run_to_nan()
    ev = c.wait()
    assert ev.node.module_path == "head" and ev.node.op == "linear"
    assert "parameter head.weight" in ev.nan_origin and "no op made it" in ev.nan_origin
    assert any(st.name == "in1 head.weight" and st.nan == 1 for st in ev.input_stats)


def test_dead_breakpoints_are_found_with_the_nearest_names(mlp):
    nodes = [st.node for st in mlp.plan.steps]
    typo = bps.dead(bps.parse("lienar"), nodes)
    assert typo and "matches no op" in typo and "linear" in typo
    absent = bps.dead(bps.parse("conv2d"), nodes)
    assert "no conv2d op" in absent and "linear" in absent
    assert bps.dead(bps.parse("linear"), nodes) is None and bps.dead(bps.parse("2"), nodes) is None
    assert bps.dead(bps.parse("nan"), nodes) is None


def test_a_glob_missing_the_models_prefix_suggests_the_real_paths():
    s = open_session("demo:gpt", "numpy")
    nodes = [st.node for st in s.plan.steps]
    msg = bps.dead(bps.parse("attn.*"), nodes)
    assert "*attn.*" in msg and "h.0.attn" in msg
    c = Controller(s, breakpoints=["attn.*", "linear"])
    try:
        assert len(c.breakpoints.dead(nodes)) == 1
    finally:
        c.quit()


def test_std_of_a_mask_near_the_dtype_limit_is_finite():
    mask = np.zeros((8, 8), np.float32)
    mask[np.triu_indices(8, 1)] = np.finfo(np.float32).min      # an attention mask
    s = summarize("mask", mask)
    assert s.inf == 0 and math.isfinite(s.std)
    assert s.std == pytest.approx(float(mask.astype(np.float64).std()), rel=1e-9)
    half = np.full(100, 60000, np.float16)
    half[0] = -60000
    assert summarize("h", half).std == pytest.approx(float(half.astype(np.float64).std()), rel=1e-9)


def test_a_raise_in_forward_names_the_users_file_and_line(tmp_path):
    from opscope.debugger.pystack import open_debug_session
    from opscope.runtime.errors import ModelError

    path = write(tmp_path, "raising.py", RAISE_IN_FORWARD)
    with pytest.raises(ModelError) as e:
        open_debug_session(path + ":factory", "numpy")
    assert f"{path}:14" in str(e.value) and 'raise ValueError("this model refuses width 8")' in str(e.value)


def test_ops_in_a_helper_get_their_own_source_line_and_stack(tmp_path):
    from opscope.debugger.pystack import open_debug_session

    path = write(tmp_path, "soft.py", SOFTMAX)
    s = open_debug_session(path + ":factory", "numpy")
    node = next(n for n in s.graph.nodes if n.op == "softmax")
    assert node.source == f"{path}:8"                # inside attend(), not forward's call of it
    c = Controller(s, breakpoints=["softmax"])
    try:
        c.cont()
        ev = c.wait()
        assert [f.function for f in ev.stack[:2]] == ["attend", "forward"]
        assert ev.stack[1].where == f"{path}:19" and "attend(h * 8.0)" in ev.stack[1].code
        assert not any("opscope" in f.path or "/torch/" in f.path for f in ev.stack)
    finally:
        c.quit()


def test_history_shows_an_earlier_op_as_it_was_within_the_budget(mlp, ctl_of):
    c = ctl_of(mlp)
    stops = []
    for _ in range(4):
        c.step()
        stops.append(c.wait())
    back = c.history_stop(1)                     # relu, two ops before the current one
    assert back.node.name == "relu" and "looking back" in back.history
    np.testing.assert_array_equal(back.outputs[0][1], stops[1].outputs[0][1])
    assert back.output_stats[0].mean == stops[1].output_stats[0].mean
    # a budget smaller than one op: older ops keep their stats, not their values
    small = ctl_of(mlp, history_mb=0.01)
    c.quit()
    small.step()
    first = small.wait()
    small.cont()
    small.wait()
    assert len(small.history) == len(mlp.plan.steps)
    old = small.history_stop(0)
    assert old.dropped and all(v is None for _, v in old.outputs)
    assert old.output_stats[0].mean == first.output_stats[0].mean      # summarised, as it was
    never = small.history_stop(2)                # never shown and dropped: what is known, no values
    assert never.dropped and never.node.name == "linear_1"


def test_progress_counts_the_ops_of_a_long_continue(mlp, ctl_of):
    c = ctl_of(mlp)
    c.step()
    c.wait()
    c.cont()
    assert isinstance(c.wait(), Finished)
    assert c.progress[0] == len(mlp.plan.steps) - 1


def test_lockstep_runs_each_reference_kernel_once_while_the_runs_agree(tmp_path, ctl_of):
    from opscope.debugger.report import run_report

    s = open_session(write(tmp_path, "soft.py", SOFTMAX) + ":factory", "numpy")
    rep = run_report(s, "numpy")
    assert rep.summary()["first_failing"] is None
    from opscope.debugger.lockstep import Lockstep
    lock = Lockstep(s.plan, s.inputs, "numpy")
    from opscope.debugger.report import AccuracyReport, ReportHook
    lock.start()
    with s.executor.hooked(ReportHook(lock, AccuracyReport("m", "numpy", "numpy"))):
        s.executor.run(*s.inputs)
    assert lock.kernel_calls == len(s.plan.steps)          # once per op: inputs never diverged
    chip = write(tmp_path, "lows.toml", LOW_SOFTMAX_TOML)
    low = open_session(write(tmp_path, "soft.py", SOFTMAX) + ":factory", chip)
    lock = Lockstep(low.plan, low.inputs, "numpy")
    lock.start()
    rep = AccuracyReport("m", chip, "numpy")
    with low.executor.hooked(ReportHook(lock, rep)):
        low.executor.run(*low.inputs)
    after = sum(1 for r in rep.rows if r.seq > next(r.seq for r in rep.rows if r.op == "softmax"))
    assert lock.kernel_calls == len(low.plan.steps) + after     # twice only downstream of the softmax


def test_compare_is_exact_and_reports_nan_on_both_sides():
    from opscope.debugger.lockstep import compare_arrays

    rng = np.random.default_rng(1)
    a = rng.standard_normal(200_003).astype(np.float32)
    e = (a + rng.standard_normal(a.size).astype(np.float32) * 1e-3).astype(np.float32)
    c = compare_arrays([a], [e])
    d = np.abs(a.astype(np.float64) - e.astype(np.float64))
    assert c.max_abs == float(d.max())
    assert c.max_rel == float((d / np.maximum(np.abs(e.astype(np.float64)), 1e-6)).max())
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    assert c.cosine == pytest.approx(float(a64 @ e64 / np.linalg.norm(a64) / np.linalg.norm(e64)), abs=1e-12)
    a[[5, 70_000]] = np.nan
    e[[5, 70_000]] = np.nan
    both = compare_arrays([a], [e])
    assert both.both_bad == 2 and both.mismatch == 0 and math.isfinite(both.err)
    e[9] = np.nan
    assert compare_arrays([a], [e]).mismatch == 1 and compare_arrays([a], [e]).err == math.inf


def test_lockstep_reports_nan_on_both_sides_as_such(tmp_path, ctl_of):
    s = open_session(write(tmp_path, "planted.py", PLANTED_NAN) + ":factory", "numpy")
    c = ctl_of(s, reference="numpy")
    c.run_to_nan()
    ev = c.wait()
    assert ev.node.op == "log"
    assert ev.diff.status == "nan" and ev.diff.nan_both > 0
    assert "NaN/Inf on both sides" in ev.diff.verdict() and "within tolerance" not in ev.diff.verdict()


def test_restart_from_a_pause_then_continue_ends_the_run_and_starts_no_other(mlp, ctl_of):
    """Regression: restart set the worker's wake-up while it was paused; the run after it then
    started a third run by itself as soon as it finished, and the UI never stayed on 'finished'."""
    import queue
    ctl = ctl_of(mlp)
    ctl.step()
    assert isinstance(ctl.wait(), Stop)
    ctl.step()
    assert ctl.wait().seq == 1
    ctl.restart()
    assert ctl.wait().seq == 0
    ctl.cont()
    assert isinstance(ctl.wait(), Finished)
    with pytest.raises(queue.Empty):
        ctl.wait(timeout=1.0)
    assert ctl.state == "finished"
