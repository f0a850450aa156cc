"""The tensors table: one line of stats per input and output, a cursor that picks the value view.

A DataTable re-renders every cell through Rich on any change (~14 ms for a few rows, every step).
Here the whole table is one Content made in the model's worker thread (view.stats_table): the
UI thread only swaps it in and paints the cursor line.
"""
from __future__ import annotations

from textual.binding import Binding
from textual.content import Content
from textual.events import Click
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget


class TensorTable(Widget, can_focus=True):
    """Header + rows (Content lines); up/down or a click moves the cursor and posts Highlighted."""

    BINDINGS = [Binding("up", "move(-1)", "up", show=False), Binding("down", "move(1)", "down", show=False)]
    DEFAULT_CSS = """
    TensorTable { height: auto; text-wrap: nowrap; text-overflow: clip; }
    """
    cursor_row = reactive(0, always_update=False)

    class Highlighted(Message):
        def __init__(self, table: "TensorTable", row: int):
            super().__init__()
            self.table = table
            self.cursor_row = row

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self._header = Content("")
        self._rows: list[Content] = []

    @property
    def row_count(self) -> int:
        return len(self._rows)

    def set_rows(self, header: Content, rows: list[Content]) -> None:
        """New content for every line; the cursor stays on its row when that row still exists."""
        self._header, self._rows = header, rows
        if self.cursor_row >= len(rows):
            self.cursor_row = 0
        self.refresh()

    def row_text(self, row: int) -> str:
        return self._rows[row].plain

    def _window(self) -> tuple[int, int]:
        """(first row shown, rows that fit under the header): the cursor's row is always in view."""
        visible = max(1, self.content_region.height - 1)
        if len(self._rows) <= visible:
            return 0, visible
        return max(0, min(self.cursor_row - visible + 1, len(self._rows) - visible)), visible

    def render(self) -> Content:
        top, visible = self._window()
        lines = [self._header]
        for i, line in enumerate(self._rows[top:top + visible], top):
            if i == self.cursor_row:
                line = line.stylize("reverse" if self.has_focus else "underline")
            lines.append(line)
        return Content("\n").join(lines)

    def watch_cursor_row(self, row: int) -> None:
        self.post_message(self.Highlighted(self, row))
        self.refresh()

    def action_move(self, delta: int) -> None:
        if self._rows:
            self.cursor_row = max(0, min(len(self._rows) - 1, self.cursor_row + delta))

    def move_cursor(self, row: int) -> None:
        if 0 <= row < len(self._rows):
            self.cursor_row = row

    def on_click(self, event: Click) -> None:
        top, _ = self._window()
        row = top + event.y - 1 - self.styles.gutter.top     # line 0 is the header
        self.move_cursor(row)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
