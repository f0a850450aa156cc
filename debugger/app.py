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

from rich.markup import escape
from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.widgets import DataTable, Footer, Header, Input, RichLog, Static, Tree

from opscope.runtime.errors import UsageError

from . import view
from .controller import Controller, Failed, Finished, Stop
from .screens import AdvisorScreen, HelpScreen
from .stats import page
from .table import TensorTable

MAX_QUEUED = 32          # keys pressed while an op runs, done one per stop
RUNNING_AFTER = 0.25      # seconds before "running..." is shown: a quick step never flashes it
VALUE_ROWS = 12


@dataclass
class Prepared:
    """A controller event made ready to show (in the worker thread)."""

    op: Content
    table: tuple                # the tensors table: (header, [row]) as Content
    values: list                # [(label, value)] in table order, for the value pages
    watches: str | None         # watches text, None when unchanged since the last event


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
    #op { height: 12; border: round $primary; padding: 0 1; }
    #tensors { height: 8; border: round $primary; }
    #lower { height: 1fr; }
    #values-box { width: 3fr; border: round $primary; padding: 0 1; scrollbar-size-vertical: 1; }
    #values { height: 12; text-wrap: nowrap; }     /* VALUE_ROWS: a fixed size never re-lays out */
    #watches { width: 2fr; height: 1fr; border: round $primary; padding: 0 1; }
    #log { height: 7; border: round $primary; scrollbar-size-vertical: 1; }
    #prompt { dock: bottom; display: none; }
    #prompt.shown { display: block; }
    """
    BINDINGS = [
        Binding("n", "next", "next op"),
        Binding("s", "step_into", "next module"),
        Binding("f", "finish", "finish module"),
        Binding("c", "continue", "continue"),
        Binding("e", "run_to_nan", "to NaN"),
        Binding("b", "toggle_breakpoint", "breakpoint"),
        Binding("w", "add_watch", "watch"),
        Binding("a", "add_breakpoint", "add break", show=False),
        Binding("A", "advisor", "advisor"),
        Binding("r", "restart", "restart"),
        Binding("left_square_bracket", "page(-1)", "page up", show=False),
        Binding("right_square_bracket", "page(1)", "page down", show=False),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit_debugger", "quit"),
    ]

    def __init__(self, controller: Controller, *, model: str = "", autostart: bool = True):
        super().__init__()
        self.ctl = controller
        self.ctl.listener = self._from_worker
        self.model_name = model or controller.session.spec
        self.autostart = autostart
        self.total = len(controller.steps)
        self._leaves = {}            # seq -> tree node
        self._current_leaf = None
        self._shown = []             # [(label, value)] in the tensors table order
        self._page = 0
        self._prompt_for = None
        self._watches_sent = None    # the watches text last prepared (worker thread)
        self._bp_shown = None        # what the breakpoints table shows, to skip unchanged refills
        self._running_timer = None
        self._queued: list = []      # commands typed ahead while the model ran
        self._t_command = None
        self.timings: list[tuple[float, float]] = []   # per stop: (command -> stop handled, -> drawn), s
        self.last_event = None       # for tests and scripts

    # --- layout ---------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal():
            with Vertical(id="left"):
                yield Tree(self.model_name, id="graph")
                yield DataTable(id="breakpoints", cursor_type="row")
            with Vertical(id="right"):
                yield Static("[dim]starting...[/]", id="op")
                yield TensorTable(id="tensors")
                with Horizontal(id="lower"):
                    with VerticalScroll(id="values-box"):
                        yield Static("", id="values")
                    yield Static("", id="watches")
                yield RichLog(id="log", markup=True, wrap=True, max_lines=500)
        yield Input(id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        for wid, title in (("graph", "graph"), ("breakpoints", "breakpoints"), ("op", "op"),
                           ("tensors", "tensors"), ("values-box", "values"), ("watches", "watches"), ("log", "log")):
            self.query_one(f"#{wid}").border_title = title
        self._op = self.query_one("#op", Static)
        self._tensors = self.query_one("#tensors", TensorTable)
        self._values = self.query_one("#values", Static)
        self._values_box = self.query_one("#values-box")
        self._watches = self.query_one("#watches", Static)
        self._tree = self.query_one("#graph", Tree)
        b = self.backend_name = self.ctl.session.backend.name
        ref = self.ctl.lockstep.reference if self.ctl.lockstep else None
        self._where = f"{self.model_name} on {b}" + (f" vs {ref}" if ref else "")
        self.sub_title = self._where
        self._build_tree()
        bt = self.query_one("#breakpoints", DataTable)
        bt.add_columns("on", "breakpoint", "hits")
        self._refresh_breakpoints()
        self._refresh_watches()
        self._tree.focus()
        # torch, the model and the UI leave ~400k long-lived objects; a full garbage collection that
        # walks them all costs ~250 ms and would land in the middle of some step. Freezing them
        # (after one collection) keeps later collections to what stepping allocates.
        gc.collect()
        gc.freeze()
        if self.autostart:
            self._t_command = time.perf_counter()
            self.ctl.step()
            self.log_line(f"running {self.model_name} on {b}: {self.total} ops; ? shows the keys")

    def _build_tree(self) -> None:
        tree = self._tree
        tree.guide_depth = 3
        tree.root.expand()
        groups = {"": tree.root}

        def group(path: str):
            if path in groups:
                return groups[path]
            parent = group(path.rsplit(".", 1)[0] if "." in path else "")
            node = parent.add(path.rsplit(".", 1)[-1], data=None, expand=True)
            groups[path] = node
            return node

        for seq, st in enumerate(self.ctl.steps):
            self._leaves[seq] = group(st.node.module_path).add_leaf(self._leaf_label(st.node, False), data=seq)

    def _leaf_label(self, node, current: bool, failed: bool = False):
        has_bp = self.ctl.breakpoints.on_node(node) is not None
        mark = "✖ " if failed else ("▶ " if current else ("● " if has_bp else "  "))
        t = Text(mark, style="bold red" if (failed or has_bp and not current) else "bold yellow")
        t.append(node.name, style="bold reverse" if current else "not bold")
        if node.name.rstrip("_0123456789") != node.op:     # `linear_1` already says linear
            t.append(f" {node.op}", style="not bold dim")
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
            op = view.op_panel(ev, self.total)
            stats, values = ev.input_stats + ev.output_stats, ev.inputs + ev.outputs
        elif isinstance(ev, Finished):
            op, stats, values = view.finished_panel(ev), ev.outputs, []
        else:
            op, stats, values = view.failed_panel(ev, self.total), ev.input_stats, ev.inputs
        watches = view.watches_text(self.ctl.watches)
        if watches == self._watches_sent:
            watches = None
        else:
            self._watches_sent = watches
        return Prepared(Content.from_markup(op), view.stats_table(stats), values, watches)

    def on_controller_event(self, message: ControllerEvent) -> None:
        ev = message.event
        t_handled = time.perf_counter()
        self.last_event = ev
        p = message.prepared or self._prepare(ev)
        if self._running_timer is not None:
            self._running_timer.stop()
            self._running_timer = None
        with self.batch_update():
            if self._op.border_title != "op":
                self._op.border_title = "op"
            self._op.update(p.op, layout=False)
            self._fill_tensors(p.table, p.values)
            if p.watches is not None:
                self._watches.update(p.watches, layout=False)
            self._refresh_breakpoints()
            if isinstance(ev, Stop):
                self._show_stop(ev)
            elif isinstance(ev, Finished):
                self._mark(None)
                self.log_line(f"[green]run finished[/]: {ev.ops} ops")
                self._status("finished")
            elif isinstance(ev, Failed):
                self._mark(ev.seq, failed=True)
                self.log_line(f"[red]model raised[/]: {escape(ev.message)}")
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
            self.log_line(f"stopped at [b]{escape(stop.node.name)}[/] ({stop.node.op}): {escape(stop.reason)}")
        if stop.nan_origin:
            self.log_line(f"[red]NaN/Inf[/] at {escape(stop.node.name)}: {escape(stop.nan_origin)}")

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

    def _fill_tensors(self, table, values) -> None:
        self._tensors.set_rows(*table)
        self._shown = values
        self._page = 0
        self._show_values(self._tensors.cursor_row)

    def _show_values(self, row: int) -> None:
        box = self._values
        if not self._shown or row >= len(self._shown):
            box.update("[dim]no values[/]", layout=False)
            self._values_box.border_title = "values"
            return
        label, value = self._shown[row]
        width = self._values_box.size.width or 72
        text, total = page(value, self._page * VALUE_ROWS, VALUE_ROWS, cols=max(1, (width - 12) // 11))
        pages = max(1, -(-total // VALUE_ROWS))
        title = f"values: {label} (page {self._page + 1}/{pages}, [ ] to page)"
        if self._values_box.border_title != title:
            self._values_box.border_title = title
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
        rows = [("●" if bp.enabled else "○", bp.describe(), str(bp.hits)) for bp in self.ctl.breakpoints]
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

    def log_line(self, text: str) -> None:
        self.query_one("#log", RichLog).write(text)

    # --- actions --------------------------------------------------------------------------
    def _command(self, fn, what: str) -> None:
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
                self.log_line("[dim]the model is running; wait for it to stop[/]")
        else:
            self.log_line(f"[yellow]the run has {state}[/]: r restarts it")

    def _show_running(self, what: str) -> None:
        self._running_timer = None
        if self.ctl.state == "running":
            self._status(f"running ({what})")
            self._op.border_title = f"op [dim]- running ({what})...[/]"

    def action_next(self) -> None:
        self._command(self.ctl.step, "next op")

    def action_step_into(self) -> None:
        self._command(self.ctl.step_into, "to the next module")

    def action_finish(self) -> None:
        self._command(self.ctl.finish, "finish module")

    def action_continue(self) -> None:
        self._command(self.ctl.cont, "continue")

    def action_run_to_nan(self) -> None:
        self._command(self.ctl.run_to_nan, "to the first NaN/Inf")

    def action_restart(self) -> None:
        self._queued.clear()
        self.ctl.restart()
        self.log_line("restarted")
        self._status("running")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_advisor(self) -> None:
        self.push_screen(AdvisorScreen(self.ctl, self.model_name))

    def action_quit_debugger(self) -> None:
        self.ctl.quit(timeout=1.0)
        self.exit()

    def action_page(self, delta: int) -> None:
        self._page = max(0, self._page + delta)
        self._show_values(self._tensors.cursor_row)

    def action_toggle_breakpoint(self) -> None:
        tree = self.query_one("#graph", Tree)
        node = tree.cursor_node
        seq = node.data if node is not None and node.data is not None else \
            (self.ctl.current.seq if self.ctl.current else None)
        if seq is None:
            self.log_line("[yellow]select an op in the graph first[/]")
            return
        op = self.ctl.steps[seq].node
        bp = self.ctl.breakpoints.toggle_node(op)
        self._leaves[seq].set_label(self._leaf_label(op, self._leaves[seq] is self._current_leaf))
        self.log_line(f"breakpoint {'set on' if bp else 'removed from'} {escape(op.name)}")
        self._refresh_breakpoints()

    def action_add_watch(self) -> None:
        self._ask("watch", "watch: out.mean(), inputs[0].std(), np.abs(out).max()  (escape cancels)")

    def action_add_breakpoint(self) -> None:
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
            if what == "watch":
                self.ctl.add_watch(text)
                self._refresh_watches()
            else:
                bp = self.ctl.breakpoints.add(text)
                self._refresh_breakpoints()
                if bp.key in ("err", "local", "tolerance") and self.ctl.lockstep is None:
                    self.log_line("[yellow]this condition needs --reference to ever hold[/]")
            self.log_line(f"{what} added: {escape(text)}")
            return True
        except UsageError as e:
            self.log_line(f"[red]{escape(str(e))}[/]")
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
        yield SystemCommand("Restart", "run the model again from the first op (r)", self.action_restart)
        yield SystemCommand("Advisor", "what to change on this backend, from the ops run so far (A)",
                            self.action_advisor)

    def on_unmount(self) -> None:
        self.ctl.quit(timeout=1.0)

