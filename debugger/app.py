"""The Textual debugger: `opscope debug MODEL --backend B`.

The model runs in the controller's worker thread; its events arrive here as messages, so the
UI never waits on an op. Stats are computed once per stop in the worker; rendering only formats.
"""
from __future__ import annotations

from rich.markup import escape
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Header, Input, RichLog, Static, Tree

from opscope.runtime.errors import UsageError

from . import view
from .controller import Controller, Failed, Finished, Stop
from .stats import page

HELP = """\
[b]opscope debug[/]: step through a model one op at a time

  [b]n[/]  next op                     [b]c[/]  continue to the next breakpoint
  [b]s[/]  step to the next module     [b]f[/]  finish the current module
  [b]e[/]  run to the first NaN/Inf    [b]r[/]  restart the run
  [b]b[/]  toggle a breakpoint on the op selected in the graph
  [b]a[/]  add a breakpoint: linear | layers.0.* | nan | max_abs > 1e4 | err > 1e-3 | attn.* if inf
  [b]w[/]  add a watch: out.mean() | inputs[0].std() | np.abs(out).max()
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


class ControllerEvent(Message):
    """A Stop, Finished or Failed from the model's worker thread."""

    def __init__(self, event):
        super().__init__()
        self.event = event


class DebuggerApp(App):
    """Graph on the left; the current op, its tensors, values, watches and a log on the right."""

    TITLE = "opscope debug"
    CSS = """
    #left { width: 46; }
    #graph { height: 1fr; border: round $primary; }
    #breakpoints { height: 9; border: round $primary; }
    #right { width: 1fr; }
    #op { height: auto; max-height: 14; border: round $primary; padding: 0 1; }
    #tensors { height: auto; max-height: 10; border: round $primary; }
    #lower { height: 1fr; }
    #values-box { width: 3fr; border: round $primary; padding: 0 1; }
    #watches { width: 2fr; border: round $primary; padding: 0 1; }
    #log { height: 7; border: round $primary; }
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
        Binding("r", "restart", "restart"),
        Binding("left_square_bracket", "page(-1)", "page up", show=False),
        Binding("right_square_bracket", "page(1)", "page down", show=False),
        Binding("question_mark", "help", "help"),
        Binding("q", "quit_debugger", "quit"),
    ]

    def __init__(self, controller: Controller, *, model: str = "", autostart: bool = True):
        super().__init__()
        self.ctl = controller
        self.ctl.listener = lambda ev: self.post_message(ControllerEvent(ev))
        self.model_name = model or controller.session.spec
        self.autostart = autostart
        self.total = len(controller.steps)
        self._leaves = {}            # seq -> tree node
        self._current_leaf = None
        self._shown = []             # [(label, value)] in the tensors table order
        self._page = 0
        self._prompt_for = None
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
                yield DataTable(id="tensors", cursor_type="row", zebra_stripes=True)
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
        b = self.backend_name = self.ctl.session.backend.name
        ref = self.ctl.lockstep.reference if self.ctl.lockstep else None
        self.sub_title = f"{self.model_name} on {b}" + (f" vs {ref}" if ref else "")
        self._build_tree()
        t = self.query_one("#tensors", DataTable)
        t.add_columns("tensor", "shape", "dtype", "device", "min", "max", "mean", "std", "nan", "inf", "histogram")
        bt = self.query_one("#breakpoints", DataTable)
        bt.add_columns("on", "breakpoint", "hits")
        self._refresh_breakpoints()
        self._refresh_watches()
        self.query_one("#graph").focus()
        if self.autostart:
            self.ctl.step()
            self.log_line(f"running {self.model_name} on {b}: {self.total} ops; ? shows the keys")

    def _build_tree(self) -> None:
        tree = self.query_one("#graph", Tree)
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
        from rich.text import Text
        has_bp = any(bp.glob == node.name and bp.op is None and bp.cond is None for bp in self.ctl.breakpoints)
        mark = "✖ " if failed else ("▶ " if current else ("● " if has_bp else "  "))
        t = Text(mark, style="bold red" if (failed or has_bp and not current) else "bold yellow")
        t.append(node.name, style="bold reverse" if current else "")
        if node.name.rstrip("_0123456789") != node.op:     # `linear_1` already says linear
            t.append(f" {node.op}", style="dim")
        return t

    # --- controller events ----------------------------------------------------------------
    def on_controller_event(self, message: ControllerEvent) -> None:
        ev = message.event
        self.last_event = ev
        if isinstance(ev, Stop):
            self._show_stop(ev)
        elif isinstance(ev, Finished):
            self.query_one("#op").border_title = "op"
            self._mark(None)
            self.query_one("#op", Static).update(view.finished_panel(ev))
            self._fill_tensors(ev.outputs, [])
            self.log_line(f"[green]run finished[/]: {ev.ops} ops")
            self.sub_title = f"{self.model_name} on {self.backend_name}: finished"
        elif isinstance(ev, Failed):
            self.query_one("#op").border_title = "op"
            self._mark(ev.seq, failed=True)
            self.query_one("#op", Static).update(view.failed_panel(ev, self.total))
            self._fill_tensors(ev.input_stats, [])
            self.log_line(f"[red]model raised[/]: {escape(ev.message)}")
            self.sub_title = f"{self.model_name} on {self.backend_name}: failed"

    def _show_stop(self, stop: Stop) -> None:
        self.query_one("#op").border_title = "op"
        self._mark(stop.seq)
        self.query_one("#op", Static).update(view.op_panel(stop, self.total))
        self._fill_tensors(stop.input_stats + stop.output_stats, stop.inputs + stop.outputs)
        self._refresh_watches()
        self._refresh_breakpoints()
        self.sub_title = f"{self.model_name} on {self.backend_name}: paused at #{stop.seq + 1}/{self.total}"
        if stop.reason != "step":
            self.log_line(f"stopped at [b]{escape(stop.node.name)}[/] ({stop.node.op}): {escape(stop.reason)}")
        if stop.nan_origin:
            self.log_line(f"[red]NaN/Inf[/] at {escape(stop.node.name)}: {escape(stop.nan_origin)}")

    def _mark(self, seq, failed: bool = False) -> None:
        if self._current_leaf is not None:
            old = self._current_leaf
            old.set_label(self._leaf_label(self.ctl.steps[old.data].node, False))
            self._current_leaf = None
        if seq is None or seq not in self._leaves:
            return
        leaf = self._leaves[seq]
        leaf.set_label(self._leaf_label(self.ctl.steps[seq].node, True, failed))
        self._current_leaf = leaf
        tree = self.query_one("#graph", Tree)
        tree.move_cursor(leaf)
        tree.scroll_to_node(leaf, animate=False)

    def _fill_tensors(self, stats, values) -> None:
        t = self.query_one("#tensors", DataTable)
        t.clear()
        for s in stats:
            t.add_row(*view.stats_row(s))
        self._shown = values
        self._page = 0
        self._show_values(0)

    def _show_values(self, row: int) -> None:
        box = self.query_one("#values", Static)
        if not self._shown or row >= len(self._shown):
            box.update("[dim]no values[/]")
            return
        label, value = self._shown[row]
        rows = 12
        width = self.query_one("#values-box").size.width or 72
        text, total = page(value, self._page * rows, rows, cols=max(1, (width - 12) // 11))
        pages = max(1, -(-total // rows))
        self.query_one("#values-box").border_title = f"values: {label} (page {self._page + 1}/{pages}, [ ] to page)"
        box.update(escape(text))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "tensors":
            self._page = 0
            self._show_values(event.cursor_row)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "breakpoints" and event.cursor_row < len(self.ctl.breakpoints):
            bp = self.ctl.breakpoints.items[event.cursor_row]
            bp.enabled = not bp.enabled
            self._refresh_breakpoints()

    def _refresh_breakpoints(self) -> None:
        bt = self.query_one("#breakpoints", DataTable)
        bt.clear()
        for bp in self.ctl.breakpoints:
            bt.add_row("●" if bp.enabled else "○", bp.describe(), str(bp.hits))

    def _refresh_watches(self) -> None:
        self.query_one("#watches", Static).update(view.watches_text(self.ctl.watches))

    def log_line(self, text: str) -> None:
        self.query_one("#log", RichLog).write(text)

    # --- actions --------------------------------------------------------------------------
    def _command(self, fn, what: str) -> None:
        state = self.ctl.state
        if fn():
            self.sub_title = f"{self.model_name} on {self.backend_name}: running ({what})"
            self.query_one("#op").border_title = f"op [dim]- running ({what})...[/]"
        elif state == "running":
            self.log_line("[dim]the model is running; wait for it to stop[/]")
        else:
            self.log_line(f"[yellow]the run has {state}[/]: r restarts it")

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
        self.ctl.restart()
        self.log_line("restarted")
        self.sub_title = f"{self.model_name} on {self.backend_name}: running"

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_quit_debugger(self) -> None:
        self.ctl.quit(timeout=1.0)
        self.exit()

    def action_page(self, delta: int) -> None:
        self._page = max(0, self._page + delta)
        self._show_values(self.query_one("#tensors", DataTable).cursor_row)

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

    def on_unmount(self) -> None:
        self.ctl.quit(timeout=1.0)
