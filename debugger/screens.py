"""The debugger's pop-up screens: the keys (`?`) and the advisor (`A`), whose advice is computed in a thread."""
from __future__ import annotations

import textwrap

from rich.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from .view import fmt_seconds

HELP = """\
[b]opscope debug[/]: step through a model one op at a time

  [b]n[/]  next op                     [b]c[/]  continue to the next breakpoint
  [b]s[/]  step to the next module     [b]f[/]  finish the current module
  [b]e[/]  run to the first NaN/Inf    [b]r[/]  restart the run
  [b]b[/]  toggle a breakpoint on the op selected in the graph
  [b]a[/]  add a breakpoint: linear | layers.0.* | nan | max_abs > 1e4 | err > 1e-3 | attn.* if inf
  [b]w[/]  add a watch: out.mean() | inputs[0].std() | np.abs(out).max()
  [b]A[/]  the advisor: what to change on this backend, and what it should gain
  [b][[/] [b]][/]  page through the selected tensor's values
  [b]ctrl+p[/]  command palette      [b]?[/]  this help      [b]q[/]  quit

Every stop is after an op ran: its inputs and outputs are shown. With --reference, each op
also runs on the reference backend: "this op" is the error it adds on the same inputs,
"err" the error against a whole-graph reference run.

[dim]escape closes this help[/]"""


class HelpScreen(ModalScreen):
    """The keys, on top of the debugger."""

    BINDINGS = [("escape", "dismiss", "close"), ("question_mark", "dismiss", "close"), ("q", "dismiss", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: 100; height: auto; border: round $accent; padding: 1 2; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        yield Static(HELP)


_SEVERITY = {"high": "b red", "medium": "b yellow", "low": "cyan", "info": "dim"}


def advice_text(result, width: int = 100) -> str:
    """The advisor pane's text for a debugger.advice.SessionAdvice."""
    head = (f"[b]{len(result.advice)} recommendation{'s' if len(result.advice) != 1 else ''}[/] "
            f"[dim]from {result.ops} ops, {fmt_seconds(result.seconds)} of op time"
            f"{' (simulated: roofline estimates)' if result.simulated else ''}[/]")
    lines = [head]
    lines += [f"[yellow]{escape(n)}[/]" for n in result.notes]
    if not result.advice:
        lines.append("\n[green]no rule fired[/]: nothing to change on this backend that the rules know of")
    for i, a in enumerate(result.advice, 1):
        gain = a.estimated_gain or {}
        secs, frac = float(gain.get("seconds") or 0.0), float(gain.get("fraction") or 0.0)
        est = f"est. gain {fmt_seconds(secs)} per step ({frac:.0%})" if secs > 0 else "no gain estimate"
        style = _SEVERITY.get(a.severity, "")
        lines.append("")
        lines.append(f"[b]{i}.[/] [{style}]{escape(a.severity)}[/] [b]{escape(a.title)}[/]")
        lines.append(f"   [cyan]{est}[/]  [dim]{escape(a.id)}[/]")
        lines += [f"   {escape(t)}" for t in textwrap.wrap(a.message, max(20, width - 4))]   # hanging indent
    return "\n".join(lines)


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
        self.query_one("#advice", Static).update(f"[red]the advisor failed[/]: {escape(message)}")
