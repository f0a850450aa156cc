"""The Textual debugger: `opscope debug MODEL --backend B`.

The model runs in the controller's worker thread; its events arrive here as messages, so the
UI never waits on an op. Everything a stop needs that is not cheap -- tensor stats, the op
panel's text, the table's cells -- is made in that worker thread before the event is posted;
the UI thread only swaps content in, inside one batch, in widgets whose size does not depend
on their content (so a step repaints a few regions and never re-lays out the screen).
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from rich.text import Span, Text
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widgets import DataTable, Footer, Header, Input, RichLog, Static, Tree

from opscope.runtime.errors import OpscopeError, UsageError, terminal_text

from . import view
from .view import say
from .breakpoints import dead
from .controller import Controller, Failed, Finished, Stop
from .screens import AdvisorScreen, HelpScreen, ReportScreen
from .stats import page
from .table import TensorTable

MAX_QUEUED = 32          # keys pressed while an op runs, done one per stop
RUNNING_AFTER = 0.25      # seconds before "running..." is shown: a quick step never flashes it
PROGRESS_EVERY = 0.5      # seconds between progress lines (op counter, elapsed) while the model runs
VALUE_ROWS = 12
NARROW, MEDIUM, SHORT, TALL = 100, 160, 32, 40     # terminal sizes where panels collapse


@dataclass
class Prepared:
    """A controller event made ready to show (in the worker thread)."""

    op: Content
    table: tuple                # the tensors table: (header, [row], pinned) as view.stats_table makes it
    values: list                # [(label, value)] in table order, for the value pages
    watches: str | None         # watches text, None when unchanged since the last event
    width: int = 0              # the tensors table's width the table was made for (0: not laid out yet)


class ControllerEvent(Message):
    """A Stop, Finished or Failed from the model's worker thread, with its panels prepared."""

    def __init__(self, event, prepared: Prepared | None = None):
        super().__init__()
        self.event = event
        self.prepared = prepared


class DebuggerApp(App):
    """Graph on the left; the current op, its tensors, values, watches and a log on the right."""

    TITLE = "opscope debug"
    CSS = """
    #left { width: 50; }
    #graph { height: 1fr; border: round $primary; overflow-x: hidden; scrollbar-size-vertical: 1;
             scrollbar-background: $panel; scrollbar-color: $primary 60%; }
    #graph > .tree--guides { color: $primary 40%; }
    #breakpoints { height: 9; border: round $primary; scrollbar-size-vertical: 1; }
    #right { width: 1fr; }
    #op { height: 14; border: round $primary; padding: 0 1; }
    #tensors { height: 8; border: round $primary; }
    #lower { height: 1fr; }
    #values-box { width: 3fr; border: round $primary; padding: 0 1; scrollbar-size-vertical: 1; }
    #values { height: 12; text-wrap: nowrap; }     /* VALUE_ROWS: a fixed size never re-lays out */
    #watches { width: 2fr; height: 1fr; border: round $primary; padding: 0 1; }
    #log { height: 7; border: round $primary; scrollbar-size-vertical: 1; }
    #prompt { dock: bottom; display: none; }
    #prompt.shown { display: block; }
    /* errors and warnings also here, at any size: at 80x24 the log is hidden */
    #notice { dock: bottom; height: auto; max-height: 2; display: none; background: $panel; padding: 0 1; }
    #notice.shown { display: block; }
    /* smaller terminals: the graph narrows, then goes (g shows it); the log goes; the op panel
       keeps its first lines (stop reason, verdict, NaN sentence); values and watches share a row */
    DebuggerApp.-medium #left { width: 30; }
    DebuggerApp.-narrow #left { display: none; }
    DebuggerApp.-narrow.-graph #left { display: block; width: 34; }
    DebuggerApp.-compact #op { height: 12; }
    DebuggerApp.-short #op { height: 10; }
    /* as tall as its rows (header, inputs, outputs), within bounds: at 80x24 a linear's in0, in1, in2 and out */
    DebuggerApp.-short #tensors { height: auto; max-height: 9; }
    DebuggerApp.-short #log { display: none; }
    DebuggerApp.-short #breakpoints { height: 5; }
    """
    BINDINGS = [              # the footer shows them in this order: the most used first (80 columns)
        Binding("n", "next", "next"),
        Binding("p", "back", "back"),
        Binding("c", "continue", "continue"),
        Binding("e", "run_to_nan", "to NaN"),
        Binding("a", "add_breakpoint", "add break"),
        Binding("w", "add_watch", "watch"),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit_debugger", "quit"),
        Binding("ctrl+c", "interrupt", "pause / quit", show=False, priority=True),
        Binding("s", "step_into", "next module"),
        Binding("f", "finish", "finish module"),
        Binding("b", "toggle_breakpoint", "break here"),
        Binding("x", "delete", "delete"),
        Binding("R", "report", "report"),
        Binding("m", "region_diff", "region ops", show=False),
        Binding("A", "advisor", "advisor"),
        Binding("r", "restart", "restart"),
        Binding("l", "live", "live", show=False),
        Binding("g", "toggle_graph", "graph", show=False),
        Binding("left_square_bracket", "page(-1)", "page up", show=False),
        Binding("right_square_bracket", "page(1)", "page down", show=False),
    ]

    def __init__(self, controller: Controller | None = None, *, model: str = "", autostart: bool = True,
                 loader=None, report_path: str | None = None, notice: str = "", handle_sigint: bool = False):
        """`loader(progress)` -> Controller runs in a thread while the screen already shows (imports,
        capture); `progress(text)` puts a line on the screen meanwhile. Without it, `controller`."""
        super().__init__()
        self.ctl = controller
        self.loader = loader
        self.model_name = model or (controller.session.spec if controller else "")
        self.autostart = autostart
        self.report_path = report_path
        self.notice = notice             # a line that stays in the title (the debugpy address)
        self.handle_sigint = handle_sigint   # `opscope debug`: a SIGINT (kill -INT) quits with 130
        self.load_error: OpscopeError | None = None
        self.total = 0
        self._leaves = {}            # seq -> tree node
        self._current_leaf = None
        self._shown = []             # [(label, value)] in the tensors table order
        self._page = 0
        self._prompt_for = None
        self._watches_sent = None    # the watches text last prepared (worker thread)
        self._bp_shown = None        # what the breakpoints table shows, to skip unchanged refills
        self._running_timer = None
        self._progress_timer = None
        self._running_what = ""
        self._queued: list = []      # commands typed ahead while the model ran
        self._t_command = None
        self._compact = False        # the op panel without the source snippet (read by the worker)
        self._table_width = 0        # the width the shown tensors table was made for
        self._looking = None         # index into the controller's history while looking back
        self.timings: list[tuple[float, float]] = []   # per stop: (command -> stop handled, -> drawn), s
        self.last_event = None       # for tests and scripts
        self.shown_event = None      # what the panels show now: the last event, or a look back
        self._values_title = None    # the values box's title as last set (the widget hands back markup)

    # --- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal():
            with Vertical(id="left"):
                yield Tree(Text(terminal_text(self.model_name or "model")), id="graph")   # Text: never markup
                yield DataTable(id="breakpoints", cursor_type="row")
            with Vertical(id="right"):
                yield Static("[dim]starting...[/]", id="op")
                yield TensorTable(id="tensors")
                with Horizontal(id="lower"):
                    with VerticalScroll(id="values-box"):
                        yield Static("", id="values")
                    yield Static("", id="watches")
                yield RichLog(id="log", markup=False, wrap=True, max_lines=500)     # lines are say(...) Content
        yield Input(id="prompt")
        yield Static("", id="notice")
        yield Footer()

    def on_mount(self) -> None:
        for wid, title in (("graph", "graph"), ("breakpoints", "breakpoints (x deletes)"), ("op", "op"),
                           ("tensors", "tensors"), ("values-box", "values"), ("watches", "watches"), ("log", "log")):
            self.query_one(f"#{wid}").border_title = title
        self._op = self.query_one("#op", Static)
        self._tensors = self.query_one("#tensors", TensorTable)
        self._values = self.query_one("#values", Static)
        self._values_box = self.query_one("#values-box")
        self._watches = self.query_one("#watches", Static)
        self._tree = self.query_one("#graph", Tree)
        self.query_one("#breakpoints", DataTable).add_columns("on", "breakpoint", "hits")
        self._fit(self.size.width, self.size.height)
        if self.handle_sigint:
            import asyncio
            import signal
            asyncio.get_running_loop().add_signal_handler(signal.SIGINT, self._quit_130)
        if self.ctl is not None:
            self._attach(self.ctl)
        else:
            self._t_load = time.perf_counter()
            self.sub_title = f"{self.model_name}: loading"
            self._op.update(say("[b]opscope debug[/] $model\n[dim]loading: importing torch...[/]", model=self.model_name))
            self._progress_timer = self.set_interval(PROGRESS_EVERY, self._loading_tick)
            self.run_worker(self._load, thread=True, exclusive=True, group="load")

    # --- loading (a worker thread: imports, capture, placement) ------------------------------
    def _load(self) -> None:
        def progress(text: str) -> None:
            self._load_line = text
            self.call_from_thread(self._loading_tick)
        self._load_line = "importing torch..."
        try:
            ctl = self.loader(progress)
        except OpscopeError as e:
            self.load_error = e
            self.call_from_thread(self.exit, None, e.exit_code)
            return
        except Exception as e:       # a bug in a model factory: one line, exit 1, as the CLI does
            self.load_error = OpscopeError(f"{type(e).__name__}: {e}")
            self.call_from_thread(self.exit, None, 1)
            return
        self.call_from_thread(self._attach, ctl)

    def _loading_tick(self) -> None:
        if self.ctl is not None:
            return
        secs = time.perf_counter() - self._t_load
        self._op.update(say(f"[b]opscope debug[/] $model\n[dim]loading ({secs:.1f} s):[/] $line", model=self.model_name,
                            line=getattr(self, "_load_line", "")))

    def _attach(self, controller: Controller) -> None:
        """The model is captured and placed: fill the graph, start the first op."""
        if self._progress_timer is not None:
            self._progress_timer.stop()
            self._progress_timer = None
        self.ctl = controller
        self.ctl.listener = self._from_worker
        self.model_name = self.model_name or controller.session.spec
        self.total = len(controller.steps)
        self._tree.root.set_label(Text(terminal_text(self.model_name)))
        b = self.backend_name = self.ctl.session.backend.name
        ref = self.ctl.lockstep.reference if self.ctl.lockstep else None
        self._where = f"{self.model_name} on {b}" + (f" vs {ref}" if ref else "")
        if self.notice:
            self._where += f"  [{self.notice}]"
            self.log_line(say("[b]$notice[/]", notice=self.notice))
        self.sub_title = self._where
        self._build_tree()
        self._refresh_breakpoints()
        self._refresh_watches()
        self._tree.focus()
        for msg in self.ctl.breakpoints.dead([st.node for st in self.ctl.steps]):
            self.log_line(say("[yellow]$msg[/]", msg=msg))
        # torch, the model and the UI leave ~400k long-lived objects; a full garbage collection that
        # walks them all costs ~250 ms and would land in the middle of some step. Freezing them
        # (after one collection) keeps later collections to what stepping allocates.
        gc.collect()
        gc.freeze()
        if self.autostart:
            self._t_command = time.perf_counter()
            self.ctl.step()
            self.log_line(say(f"running $model on $backend: {self.total} ops; ? shows the keys", model=self.model_name,
                              backend=b))

    def on_resize(self, event) -> None:
        self._fit(event.size.width, event.size.height)

    def _fit(self, width: int, height: int) -> None:
        """Collapse panels for the terminal's size (classes the CSS reads); re-make the op panel."""
        if not width or not height:
            return
        self.set_class(width < NARROW, "-narrow")
        self.set_class(NARROW <= width < MEDIUM, "-medium")
        self.set_class(height < SHORT, "-short")
        self.set_class(height < TALL or width < NARROW, "-compact")
        compact = height < TALL or width < NARROW
        if compact != self._compact:
            self._compact = compact
            ev = self.shown_event
            if isinstance(ev, Stop):
                self._op.update(view.op_panel(ev, self.total, compact))
        self.call_after_refresh(self._refit_table)

    def _refit_table(self) -> None:
        """The tensors table made again for its new width (its columns narrow to fit, view.stats_table)."""
        ev = self.shown_event
        width = self._tensors.content_region.width
        if ev is not None and width != self._table_width:
            self._table_width = width
            stats, _, outputs = self._tensors_of(ev)
            self._tensors.set_rows(*view.stats_table(stats, width or None, outputs))

    def _build_tree(self) -> None:
        tree = self._tree
        tree.guide_depth = 3
        tree.root.expand()
        groups = {"": tree.root}

        def group(path: str):
            if path in groups:
                return groups[path]
            parent = group(path.rsplit(".", 1)[0] if "." in path else "")
            # a module name: not markup, and one line
            node = parent.add(Text(terminal_text(path.rsplit(".", 1)[-1])), data=None, expand=True)
            groups[path] = node
            return node

        for seq, st in enumerate(self.ctl.steps):
            self._leaves[seq] = group(self.ctl.tree_path(seq)).add_leaf(self._leaf_label(st.node, False), data=seq)

    def _leaf_label(self, node, current: bool, failed: bool = False):
        has_bp = self.ctl.breakpoints.on_node(node) is not None
        mark = "✖ " if failed else ("▶ " if current else ("● " if has_bp else "  "))
        t = Text(mark, style="bold red" if (failed or has_bp and not current) else "bold yellow")
        t.append(terminal_text(node.name), style="bold reverse" if current else "not bold")
        if node.name.rstrip("_0123456789") != node.op:     # `linear_1` already says linear
            t.append(f" {terminal_text(node.op)}", style="not bold dim")
        return t

    # --- controller events ----------------------------------------------------------------
    def _from_worker(self, ev) -> None:
        """The controller's listener: runs in the model's thread; formats there, posts to the UI."""
        try:
            prepared = self._prepare(ev)
        except Exception:         # never lose an event over formatting: the UI thread formats instead
            prepared = None
        self.post_message(ControllerEvent(ev, prepared))

    def _prepare(self, ev) -> Prepared:
        if isinstance(ev, Stop):
            op = view.op_panel(ev, self.total, self._compact)
        elif isinstance(ev, Finished):
            op = view.finished_panel(ev)
        else:
            op = view.failed_panel(ev, self.total)
        stats, values, outputs = self._tensors_of(ev)
        watches = view.watches_text(self.ctl.watches)
        if watches == self._watches_sent:
            watches = None
        else:
            self._watches_sent = watches
        # the table's width as last laid out (a resize makes it again: _refit_table)
        width = self._tensors.content_region.width
        return Prepared(op, view.stats_table(stats, width or None, outputs), values, watches, width)

    @staticmethod
    def _tensors_of(ev) -> tuple[list, list, int]:
        """(stats, values, how many of them are outputs) of the tensors an event shows."""
        if isinstance(ev, Stop):
            return ev.input_stats + ev.output_stats, ev.inputs + ev.outputs, len(ev.output_stats)
        if isinstance(ev, Finished):
            return ev.outputs, [], 0
        return ev.input_stats, ev.inputs, 0

    def on_controller_event(self, message: ControllerEvent) -> None:
        ev = message.event
        t_handled = time.perf_counter()
        self.last_event = ev
        p = message.prepared or self._prepare(ev)
        self._stop_timers()
        self._looking = None
        self.shown_event = ev
        with self.batch_update():
            if self._op.border_title != "op":
                self._op.border_title = "op"
            self._op.update(p.op, layout=False)
            self._fill_tensors(p.table, p.values, width=p.width)
            if p.watches is not None:
                self._watches.update(p.watches, layout=False)
            self._refresh_breakpoints()
            if isinstance(ev, Stop):
                self._show_stop(ev)
            elif isinstance(ev, Finished):
                self._mark(None)
                self.log_line(say(f"[green]run finished[/]: {ev.ops} ops"))
                self._status("finished")
                if self.ctl.lockstep is not None:
                    self.log_line(say("$line", line=self.ctl.report.summary()["line"]))
                self._write_report()
            elif isinstance(ev, Failed):
                self._mark(ev.seq, failed=True)
                self.log_line(say("[red]model raised[/]: $message", message=ev.message))
                self._status("failed")
        if self._t_command is not None:
            self.call_after_refresh(self._drawn, self._t_command, t_handled)
            self._t_command = None
        if not isinstance(ev, Stop):
            self._queued.clear()
        elif self._queued:
            self.call_after_refresh(self._command, *self._queued.pop(0))    # after this stop is drawn

    def _drawn(self, t_command: float, t_handled: float) -> None:
        """After the screen that shows a stop was composed: the latency a user sees (benchmark)."""
        now = time.perf_counter()
        self.timings.append((t_handled - t_command, now - t_handled))

    def _show_stop(self, stop: Stop) -> None:
        self._mark(stop.seq)
        self._status("paused")       # the op's number is in the op panel: a title that changes every
        # step would re-lay out the whole screen (the Header's title is sized to its text)
        if stop.reason != "step":
            self.log_line(say("stopped at [b]$name[/] ($op): $reason", name=stop.node.name, op=stop.node.op,
                              reason=stop.reason))
        if stop.nan_origin:
            self.log_line(say("[red]NaN/Inf[/] at $name: $origin", name=stop.node.name, origin=stop.nan_origin))
            if stop.backward_of:
                self.log_line(say("[magenta]$of[/]", of=stop.backward_of))

    def _status(self, text: str) -> None:
        self.sub_title = f"{self._where}: {text}"

    def _mark(self, seq, failed: bool = False) -> None:
        """Relabel only the previous and the current op's leaves; scroll only if it left the view."""
        if self._current_leaf is not None:
            old = self._current_leaf
            old.set_label(self._leaf_label(self.ctl.steps[old.data].node, False))
            self._current_leaf = None
        if seq is None or seq not in self._leaves:
            return
        leaf = self._leaves[seq]
        leaf.set_label(self._leaf_label(self.ctl.steps[seq].node, True, failed))
        self._current_leaf = leaf
        self._tree.move_cursor(leaf)       # scrolls only when the line is out of view

    def _fill_tensors(self, table, values, dropped: bool = False, width: int = 0) -> None:
        self._table_width = width
        self._tensors.set_rows(*table)
        self._refit_table()            # made before the first layout, or for a width since changed
        self._shown = values
        self._dropped = dropped
        self._page = 0
        self._show_values(self._tensors.cursor_row)

    def _show_values(self, row: int) -> None:
        box = self._values
        if not self._shown or row >= len(self._shown) or getattr(self, "_dropped", False):
            box.update("[dim]values not kept (older than --history-mb)[/]" if getattr(self, "_dropped", False)
                       else "[dim]no values[/]", layout=False)
            self._values_box.border_title = "values"
            self._values_title = None
            return
        label, value = self._shown[row]
        width = self._values_box.size.width or 72
        text, total = page(value, self._page * VALUE_ROWS, VALUE_ROWS, cols=max(1, (width - 12) // 11))
        pages = max(1, -(-total // VALUE_ROWS))
        title = say(f"values: $label (page {self._page + 1}/{pages}, \\[ ] to page)", label=label.split()[0])
        if self._values_title != title:        # a tensor's label can be a parameter's name: say(), not markup
            self._values_title = self._values_box.border_title = title
        box.update(Content(text), layout=False)

    def on_tensor_table_highlighted(self, event: TensorTable.Highlighted) -> None:
        self._page = 0
        self._show_values(event.cursor_row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "breakpoints" and event.cursor_row < len(self.ctl.breakpoints):
            bp = self.ctl.breakpoints.items[event.cursor_row]
            bp.enabled = not bp.enabled
            self._refresh_breakpoints()

    def _refresh_breakpoints(self) -> None:
        # Text cells: a DataTable parses a str cell as markup, and a pattern is what the user typed (`[/]`)
        rows = [(Text("●" if bp.enabled else "○"), Text(terminal_text(bp.describe())), Text(str(bp.hits)))
                for bp in self.ctl.breakpoints]
        if rows == self._bp_shown:
            return
        self._bp_shown = rows
        bt = self.query_one("#breakpoints", DataTable)
        bt.clear()
        for row in rows:
            bt.add_row(*row)

    def _refresh_watches(self) -> None:
        self._watches.update(view.watches_text(self.ctl.watches), layout=False)
        self._watches_sent = None           # the next stop sends its watches text whatever it is

    def log_line(self, text) -> None:
        """A line in the log, made by say(): a str is never parsed (the log has markup=False). Errors
        and warnings (red, yellow) also go to the notice line, which every terminal size shows."""
        from textual.css.query import NoMatches
        if isinstance(text, Content):   # as rich Text with the same style names: the log keeps rich's colours
            if any(c in str(s.style) for s in text.spans for c in ("red", "yellow")):
                self._show_notice(text)
            text = Text(text.plain, spans=[Span(s.start, s.end, str(s.style)) for s in text.spans])
        try:
            self.query_one("#log", RichLog).write(text)
        except NoMatches:               # the app is closing: nothing is left to show it
            pass

    def _show_notice(self, content) -> None:
        from textual.css.query import NoMatches
        try:
            n = self.query_one("#notice", Static)
        except NoMatches:
            return
        n.update(content)
        n.add_class("shown")

    def _clear_notice(self) -> None:
        from textual.css.query import NoMatches
        try:
            self.query_one("#notice", Static).remove_class("shown")
        except NoMatches:
            pass

    # --- actions --------------------------------------------------------------------------
    def _command(self, fn, what: str) -> None:
        self._clear_notice()
        if self.ctl is None:
            self.log_line(say("[dim]still loading the model[/]"))
            return
        state = self.ctl.state
        t0 = time.perf_counter()
        if fn():
            self._t_command = t0
            if self._running_timer is not None:
                self._running_timer.stop()
            self._running_timer = self.set_timer(RUNNING_AFTER, lambda: self._show_running(what))
        elif state == "running":
            # type-ahead: a key pressed while an op runs is done at the next stop (as a terminal would)
            if len(self._queued) < MAX_QUEUED:
                self._queued.append((fn, what))
            else:
                self.log_line(say("[dim]the model is running; wait for it to stop[/]"))
        else:
            self.log_line(say(f"[yellow]the run has {state}[/]: r restarts it"))

    def _show_running(self, what: str) -> None:
        self._running_timer = None
        self._running_what = what
        if self.ctl.state == "running":
            self._progress()
            self._progress_timer = self.set_interval(PROGRESS_EVERY, self._progress)

    def _progress(self) -> None:
        """While the model runs: ops run so far in this command and seconds since it began."""
        if self.ctl.state != "running":
            return
        n, t0 = self.ctl.progress
        line = f"running ({self._running_what}): {n:,} ops, {time.perf_counter() - t0:.1f} s"
        self._status(line)
        self._op.border_title = say("op [dim]- $line[/]", line=line)

    def _stop_timers(self) -> None:
        for name in ("_running_timer", "_progress_timer"):
            t = getattr(self, name)
            if t is not None:
                t.stop()
                setattr(self, name, None)

    def action_next(self) -> None:
        if self._looking is not None:         # looking back: forward through the history first
            self._look(self._looking + 1)
            return
        self._command(self.ctl.step, "next op")

    # --- history: looking back at ops that ran -------------------------------------------------
    def action_back(self) -> None:
        if self.ctl is None or not len(self.ctl.history) or self.ctl.state not in ("paused", "finished", "failed"):
            return
        # paused: the newest record is the op on screen; finished: it is the last op, one step back
        newest = len(self.ctl.history) - (1 if self.ctl.state == "paused" else 0)
        start = newest if self._looking is None else self._looking
        if start == 0:
            self.log_line(say("[dim]the first op of this run: nothing before it[/]"))
            return
        self._look(start - 1)

    def action_live(self) -> None:
        if self._looking is not None:
            self._look(len(self.ctl.history))

    def _look(self, index: int) -> None:
        """Show history record `index` (its inputs, outputs and comparison as they were); past the
        newest record (or at the paused op itself), the live event again."""
        h = self.ctl.history
        newest = len(h) - (1 if self.ctl.state == "paused" else 0)
        if index >= newest or self.ctl.state not in ("paused", "finished", "failed"):
            self._looking = None
            ev = self.ctl.current if self.ctl.state == "paused" else self.last_event
            if ev is not None:
                self._show_event(ev)
                if not isinstance(ev, Stop):
                    self._mark(None)
            return
        self._looking = index
        self._show_event(self.ctl.history_stop(index))

    def _show_event(self, ev) -> None:
        p = self._prepare(ev)
        self.shown_event = ev
        with self.batch_update():
            self._op.update(p.op, layout=False)
            self._fill_tensors(p.table, p.values, dropped=getattr(ev, "dropped", False), width=p.width)
            if isinstance(ev, Stop):
                self._mark(ev.seq)

    def on_tree_node_selected(self, event: Tree.NodeSelected) -> None:
        """Enter (or a click) on an op that ran in this run: show it as it was."""
        seq = event.node.data
        if seq is None or self.ctl is None:
            return
        i = self.ctl.history.last_of(seq)
        if i is None:
            self.log_line(say("[dim]$name has not run yet in this run[/]", name=self.ctl.steps[seq].node.name))
            return
        self._look(i)

    def action_step_into(self) -> None:
        self._command(self.ctl.step_into, "to the next module")

    def action_finish(self) -> None:
        self._command(self.ctl.finish, "finish module")

    def action_continue(self) -> None:
        self._command(self.ctl.cont, "continue")

    def action_run_to_nan(self) -> None:
        self._command(self.ctl.run_to_nan, "to the first NaN/Inf")

    def action_restart(self) -> None:
        if self.ctl is None:
            return
        self._looking = None
        self._queued.clear()
        self.ctl.restart()
        self.log_line(say("restarted"))
        self._status("running")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_advisor(self) -> None:
        if self.ctl is not None:
            self.push_screen(AdvisorScreen(self.ctl, self.model_name))

    def action_report(self) -> None:
        if self.ctl is None:
            return
        if self.ctl.lockstep is None:
            self.log_line(say("[yellow]the accuracy report needs --reference (e.g. --reference numpy)[/]"))
            return
        self.push_screen(ReportScreen(self.ctl.report))

    def action_region_diff(self) -> None:
        """m: the stopped region's members, each against the reference (a region is one step on a stack)."""
        stop = self.last_event if isinstance(self.last_event, Stop) else None
        if stop is None or stop.node.op != "region":
            self.log_line(say("[yellow]m shows a region's ops: stop at a region (a compiler stack's, "
                              "e.g. -b onnxruntime)[/]"))
            return
        if self.ctl.lockstep is None:
            self.log_line(say("[yellow]a region's per-op diff needs --reference (e.g. --reference numpy)[/]"))
            return
        rows = self.ctl.report.region_rows(stop.node.name, stop.seq)
        self.push_screen(ReportScreen(rows, f"{stop.node.name}: {len(stop.node.attrs['members'])} ops inside, "
                                            f"each vs $reference"))

    def _write_report(self) -> None:
        if self.report_path and self.ctl is not None and self.ctl.lockstep is not None:
            try:
                self.ctl.report.write(self.report_path)
            except OSError as e:
                self.log_line(say("[red]cannot write $path[/]: $error", path=self.report_path, error=e))
                return
            self.log_line(say(f"report: {len(self.ctl.report.rows)} ops written to $path", path=self.report_path))

    def action_toggle_graph(self) -> None:
        self.set_class(not self.has_class("-graph"), "-graph")

    def action_delete(self) -> None:
        """x: the breakpoint under the cursor (breakpoints table focused), else a watch by number."""
        if self.ctl is None:
            return
        bt = self.query_one("#breakpoints", DataTable)
        if bt.has_focus and len(self.ctl.breakpoints):
            row = min(bt.cursor_row, len(self.ctl.breakpoints) - 1)
            bp = self.ctl.breakpoints.remove(row)
            self.log_line(say("breakpoint deleted: $bp", bp=bp.describe()))
            self._refresh_breakpoints()
            if bp.glob:
                for seq, st in enumerate(self.ctl.steps):
                    if st.node.name == bp.glob:
                        self._leaves[seq].set_label(self._leaf_label(st.node, self._leaves[seq] is self._current_leaf))
            return
        if len(self.ctl.watches):
            self._ask("delete", f"delete watch number (1..{len(self.ctl.watches)}); breakpoints: focus their "
                                "table (tab) and press x")
        else:
            self.log_line(say("[dim]nothing to delete: focus the breakpoints table (tab) to delete a breakpoint[/]"))

    def delete_watch(self, number: int) -> bool:
        if not 1 <= number <= len(self.ctl.watches):
            self.log_line(say(f"[red]no watch {number}[/]: watches are numbered 1..{len(self.ctl.watches)}"))
            return False
        expr = self.ctl.watches.items[number - 1].expr
        self.ctl.watches.remove(number - 1)
        self._refresh_watches()
        self.log_line(say("watch deleted: $expr", expr=expr))
        return True

    def action_quit_debugger(self, code: int = 0) -> None:
        """q (exit 0): the report (--report) is written first, while the UI can still say where."""
        if self.report_path and self.ctl is not None and not self.ctl.report.complete:
            self._write_report()
        if self.ctl is not None:
            self.ctl.quit(timeout=1.0)
        self.exit(return_code=code)

    def action_interrupt(self) -> None:
        """Ctrl-C: pause a running continue at the next op (pdb, gdb); when nothing runs, quit with 130."""
        if self.ctl is not None and self.ctl.interrupt():
            self.log_line(say("[yellow]Ctrl-C: pausing after the op that is running (Ctrl-C again quits)[/]"))
            return
        self._quit_130()

    def _quit_130(self) -> None:
        self.action_quit_debugger(130)

    def action_page(self, delta: int) -> None:
        if getattr(self, "_dropped", False):
            return
        self._page = max(0, self._page + delta)
        self._show_values(self._tensors.cursor_row)

    def action_toggle_breakpoint(self) -> None:
        if self.ctl is None:
            return
        tree = self.query_one("#graph", Tree)
        node = tree.cursor_node
        seq = node.data if node is not None and node.data is not None else \
            (self.ctl.current.seq if self.ctl.current else None)
        if seq is None:
            self.log_line(say("[yellow]select an op in the graph first[/]"))
            return
        op = self.ctl.steps[seq].node
        bp = self.ctl.breakpoints.toggle_node(op)
        self._leaves[seq].set_label(self._leaf_label(op, self._leaves[seq] is self._current_leaf))
        self.log_line(say(f"breakpoint {'set on' if bp else 'removed from'} $name", name=op.name))
        self._refresh_breakpoints()

    def action_add_watch(self) -> None:
        if self.ctl is None:
            return
        self._ask("watch", "watch: out.mean(), inputs[0].std(), np.abs(out).max()  (escape cancels)")

    def action_add_breakpoint(self) -> None:
        if self.ctl is None:
            return
        self._ask("breakpoint", "breakpoint: linear | layers.0.* | nan | max_abs > 1e4 | err > 1e-3 (escape cancels)")

    def _ask(self, what: str, placeholder: str) -> None:
        self._prompt_for = what
        p = self.query_one("#prompt", Input)
        p.placeholder = placeholder
        p.value = ""
        p.add_class("shown")
        p.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        self._close_prompt()
        if text:
            self.submit(self._prompt_for, text)

    def submit(self, what: str, text: str) -> bool:
        """Add a watch or a breakpoint (the prompt and the command palette land here)."""
        try:
            if what == "delete":
                try:
                    return self.delete_watch(int(text))
                except ValueError:
                    self.log_line(say("[red]$text is not a watch number[/]", text=text))
                    return False
            if what == "watch":
                self.ctl.add_watch(text)
                self._refresh_watches()
            else:
                bp = self.ctl.breakpoints.add(text)
                self._refresh_breakpoints()
                if bp.key in ("err", "local", "tolerance", "introduced") and self.ctl.lockstep is None:
                    self.log_line(say("[yellow]this condition needs --reference to ever hold[/]"))
                never = dead(bp, [st.node for st in self.ctl.steps])
                if never:
                    self.log_line(say("[yellow]$never[/]", never=never))
            self.log_line(say(f"{what} added: $text", text=text))
            return True
        except UsageError as e:
            self.log_line(say("[red]$error[/]", error=e))
            return False

    def on_key(self, event) -> None:
        if event.key == "escape" and self.query_one("#prompt").has_class("shown"):
            self._close_prompt()
            event.stop()

    def _close_prompt(self) -> None:
        p = self.query_one("#prompt", Input)
        p.remove_class("shown")
        self.query_one("#graph").focus()

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        yield SystemCommand("Next op", "run one op (n)", self.action_next)
        yield SystemCommand("Continue", "run to the next breakpoint (c)", self.action_continue)
        yield SystemCommand("Run to first NaN/Inf", "stop at the first op whose output is not finite (e)",
                            self.action_run_to_nan)
        yield SystemCommand("Add breakpoint", "op type, path glob or condition (a)", self.action_add_breakpoint)
        yield SystemCommand("Add watch", "an expression over out / inputs (w)", self.action_add_watch)
        yield SystemCommand("Back", "the op before, as it was (p); l returns to the live op", self.action_back)
        yield SystemCommand("Accuracy report", "every op against the reference so far (R)", self.action_report)
        yield SystemCommand("Restart", "run the model again from the first op (r)", self.action_restart)
        yield SystemCommand("Advisor", "what to change on this backend, from the ops run so far (A)",
                            self.action_advisor)

    def on_unmount(self) -> None:
        if self.ctl is not None:
            if self.report_path and not self.ctl.report.complete:
                self._write_report()         # the ops run so far (a whole run wrote it already)
            self.ctl.quit(timeout=1.0)

