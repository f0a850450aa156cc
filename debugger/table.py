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
    """Header + rows (Content lines); up/down or a click moves the cursor and posts Highlighted. The last
    `pinned` rows (the op's outputs) stay in view when the rows do not fit: the inputs scroll above them."""

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
        self._pinned = 0

    @property
    def row_count(self) -> int:
        return len(self._rows)

    def set_rows(self, header: Content, rows: list[Content], pinned: int = 0) -> None:
        """New content for every line; the cursor stays on its row when that row still exists."""
        relayout = len(rows) != len(self._rows)         # an auto height (small terminals) follows the rows
        self._header, self._rows, self._pinned = header, rows, min(pinned, len(rows))
        if self.cursor_row >= len(rows):
            self.cursor_row = 0
        self.refresh(layout=relayout)

    def get_content_height(self, container, viewport, width: int) -> int:
        return 1 + len(self._rows)

    def row_text(self, row: int) -> str:
        return self._rows[row].plain

    def _shown(self) -> list[int]:
        """The rows in view, top to bottom: the cursor's row always; the pinned rows always, under a window of
        the others that follows the cursor."""
        visible = max(1, self.content_region.height - 1)
        n = len(self._rows)
        if n <= visible:
            return list(range(n))
        pinned = min(self._pinned, visible - 1)
        rest, room = n - pinned, visible - pinned
        top = max(0, min(min(self.cursor_row, rest - 1) - room + 1, rest - room))
        return list(range(top, top + room)) + list(range(n - pinned, n))

    def render(self) -> Content:
        lines = [self._header]
        for i in self._shown():
            line = self._rows[i]
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
        shown = self._shown()
        line = event.y - 1 - self.styles.gutter.top          # line 0 is the header
        if 0 <= line < len(shown):
            self.move_cursor(shown[line])

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
