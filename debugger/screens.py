"""The debugger's pop-up screens: the keys (`?`) and the advisor (`A`), whose advice is computed in a thread."""
from __future__ import annotations

import textwrap

from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from .view import fmt_seconds, lines_of, say

HELP = """\
[b]opscope debug[/]: step through a model one op at a time

  [b]n[/]  next op                     [b]c[/]  continue to the next breakpoint
  [b]p[/]  back: the op before, as it was  ([b]n[/] forward again, [b]l[/] the live op)
  [b]s[/]  step to the next module     [b]f[/]  finish the current module
  [b]e[/]  run to the next op that makes a NaN/Inf          [b]r[/]  restart the run
  [b]b[/]  toggle a breakpoint on the op selected in the graph (enter on an op that ran: show it)
  [b]a[/]  add a breakpoint: linear | layers.0.* | nan | new-nan | max_abs > 1e4 | attn.* if inf
  [b]w[/]  add a watch: out.mean() | inputs[0].std() | np.abs(out).max()
  [b]x[/]  delete: the breakpoint under the cursor (breakpoints table), else a watch by number
  [b]R[/]  the accuracy report (with --reference)    [b]A[/]  the advisor
  [b]m[/]  a region's ops, each against the reference (a compiler stack's region, with --reference)
  [b]\\[[/] and [b]][/]  page up / page down through the selected tensor's values
  [b]g[/]  show the graph on a narrow terminal         [b]tab[/]  next panel
  [b]ctrl+p[/]  command palette      [b]?[/]  this help      [b]q[/]  quit

Every stop is after an op ran: its inputs and outputs are shown. With --reference, each op
also runs on the reference backend: "this op" is the error it adds on the same inputs,
"err" the error against a whole-graph reference run. With --train, a run is one training step
(forward, backward, optimizer; r runs the next) and watches see grad: the gradient an op made
or applies, e.g. np.linalg.norm(grad).

[dim]escape closes this help[/]"""


class HelpScreen(ModalScreen):
    """The keys, on top of the debugger."""

    BINDINGS = [("escape", "dismiss", "close"), ("question_mark", "dismiss", "close"), ("q", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: 100; max-width: 100%; height: auto; max-height: 100%; border: round $accent; padding: 1 2; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        yield Static(HELP)


_SEVERITY = {"high": "b red", "medium": "b yellow", "low": "cyan", "info": "dim"}


def advice_text(result, width: int = 100) -> Content:
    """The advisor pane's text for a debugger.advice.SessionAdvice."""
    head = say(f"[b]{len(result.advice)} recommendation{'s' if len(result.advice) != 1 else ''}[/] "
               f"[dim]from {result.ops} ops, {fmt_seconds(result.seconds)} of op time"
               f"{' (simulated: roofline estimates)' if result.simulated else ''}[/]")
    lines = [head]
    lines += [say("[yellow]$note[/]", note=n) for n in result.notes]
    if not result.advice:
        lines.append(say("\n[green]no rule fired[/]: nothing to change on this backend that the rules know of"))
    for i, a in enumerate(result.advice, 1):
        gain = a.estimated_gain or {}
        secs, frac = float(gain.get("seconds") or 0.0), float(gain.get("fraction") or 0.0)
        est = f"est. gain {fmt_seconds(secs)} per step ({frac:.0%})" if secs > 0 else "no gain estimate"
        style = _SEVERITY.get(a.severity, "")
        lines.append(Content(""))
        lines.append(say(f"[b]{i}.[/] [{style}]$severity[/] [b]$title[/]", severity=a.severity, title=a.title))
        lines.append(say("   [cyan]$est[/]  [dim]$id[/]", est=est, id=a.id))
        lines += [Content(f"   {t}") for t in textwrap.wrap(a.message, max(20, width - 4))]   # hanging indent
    return lines_of(lines)


class AdvisorScreen(ModalScreen):
    """The advisor's recommendations for this debug session, computed in a worker thread."""

    BINDINGS = [("escape", "dismiss", "close"), ("A", "dismiss", "close"), ("q", "dismiss", "close")]
    DEFAULT_CSS = """
    AdvisorScreen { align: center middle; }
    AdvisorScreen > VerticalScroll { width: 90%; height: 80%; border: round $accent; padding: 0 2;
                                     background: $surface; }
    """

    def __init__(self, controller, model: str = ""):
        super().__init__()
        self.ctl = controller
        self.model_name = model
        self.result = None           # the SessionAdvice once the worker is done (tests read it)
        self.error = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="advice-box"):
            yield Static("[dim]running the advisor's analyses and rules over the ops seen so far...[/]",
                         id="advice")

    def on_mount(self) -> None:
        box = self.query_one("#advice-box")
        box.border_title = "advisor"
        box.border_subtitle = "escape closes"
        self.analyse()

    @work(thread=True, exclusive=True)
    def analyse(self) -> None:
        from .advice import advise_session
        try:
            result = advise_session(self.ctl, self.model_name)
        except Exception as e:        # a rule pack or analysis that broke: say it, keep the debugger
            self.app.call_from_thread(self._show_error, f"{type(e).__name__}: {e}")
            return
        self.app.call_from_thread(self._show, result)

    def _show(self, result) -> None:
        self.result = result
        width = self.query_one("#advice-box").content_region.width or 100
        self.query_one("#advice", Static).update(advice_text(result, width))

    def _show_error(self, message: str) -> None:
        self.error = message
        self.query_one("#advice", Static).update(say("[red]the advisor failed[/]: $message", message=message))


class ReportScreen(ModalScreen):
    """The accuracy report so far: one line per compared op, failing ones first in colour."""

    BINDINGS = [("escape", "dismiss", "close"), ("R", "dismiss", "close"), ("m", "dismiss", "close"),
                ("q", "dismiss", "close")]
    DEFAULT_CSS = """
    ReportScreen { align: center middle; }
    ReportScreen > VerticalScroll { width: 95%; height: 90%; border: round $accent; padding: 0 1;
                                    background: $surface; }
    """

    def __init__(self, report, title: str = ""):
        super().__init__()
        self.report = report
        self.title_text = title

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="report-box"):
            yield Static(report_text(self.report), id="report")

    def on_mount(self) -> None:
        box = self.query_one("#report-box")
        box.border_title = say(self.title_text or "accuracy vs $reference", reference=self.report.reference)
        box.border_subtitle = "escape closes; --report FILE.csv|.json writes it"


_STATUS = {"pass": "green", "fail": "b red", "nan": "b magenta", "skip": "dim"}


def report_text(report) -> Content:
    from .stats import fmt
    s = report.summary()
    c = s["counts"]
    lines = [say("[b]$line[/]", line=s["line"]),
             say(f"[dim]{s['ops']} ops{'' if report.complete else ' so far'}: {c['pass']} pass, {c['fail']} fail, "
                 f"{c['nan']} NaN on both sides, {c['skip']} not compared; tolerance $tolerance[/]",
                 tolerance=report.tolerance), Content("")]
    head = f"{'#':>5} {'node':<24} {'op':<14} {'status':<6} {'err':>10} {'this op':>10} {'cosine':>9} {'max abs':>10}  module"
    lines.append(Content(head).stylize("bold"))
    for r in report.rows:
        cos = f"{r.cosine:.6f}" if r.cosine == r.cosine else "-"
        text = (f"{r.number:>5} {r.node[:24]:<24} {r.op[:14]:<14} {r.status:<6} {fmt(r.err):>10} "
                f"{fmt(r.local_err):>10} {cos:>9} {fmt(r.max_abs):>10}  {r.module}")
        style = _STATUS.get(r.status, "")
        lines.append(Content(text).stylize(style) if r.status != "pass" and style else Content(text))
    return lines_of(lines)
