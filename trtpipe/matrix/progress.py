"""The live progress of a matrix build on stderr: one row per task (cell, node, stage, elapsed, state).

On a terminal the rows are a rich table redrawn in place; elsewhere (a CI log) each change of a row is
one plain line, so a log reads as a timeline.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Row:
    cell: str
    state: str = "waiting"  # waiting, queued, running, retrying, built, hit, failed, refused, planned, cancelled
    node: str = ""
    stage: str = ""
    started: float | None = None
    finished: float | None = None

    def elapsed(self, now: float) -> str:
        if self.started is None:
            return ""
        return f"{(self.finished or now) - self.started:.1f}s"


class LiveTable:
    """Rows keyed by task name; `update` changes a row, `refresh` redraws (a terminal) or prints changes."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.rows: dict[str, Row] = {}
        self._live: Any = None
        self._tty = enabled and sys.stderr.isatty()
        self._printed: dict[str, tuple[str, str, str]] = {}

    def __enter__(self) -> LiveTable:
        if self._tty:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self._table(), console=Console(stderr=True), refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(None, None, None)
            self._live = None

    def add(self, cell: str, state: str = "waiting") -> None:
        self.rows[cell] = Row(cell=cell, state=state)

    def update(self, cell: str, **changes: Any) -> None:
        row = self.rows.get(cell)
        if row is None:
            return
        for name, value in changes.items():
            setattr(row, name, value)

    def refresh(self) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.update(self._table())
            return
        now = time.monotonic()
        for row in self.rows.values():
            shown = (row.state, row.node, row.stage)
            if self._printed.get(row.cell) != shown:
                self._printed[row.cell] = shown
                parts = [f"  {row.cell}", row.state]
                if row.node:
                    parts.append(f"on {row.node}")
                if row.stage:
                    parts.append(row.stage)
                if row.started is not None:
                    parts.append(row.elapsed(now))
                # One write per line, newline included: print() writes the text and its end apart, and a fresh-clone
                # run saw a row's text land before the closing summary line with its newline after it.
                sys.stderr.write("  ".join(parts) + "\n")
                sys.stderr.flush()

    def _table(self) -> Any:
        from rich.table import Table

        now = time.monotonic()
        table = Table(title="matrix", caption="cell, node, stage, elapsed")
        for column in ("cell", "state", "node", "stage", "elapsed"):
            table.add_column(column, overflow="fold")
        for row in self.rows.values():
            table.add_row(row.cell, row.state, row.node, row.stage, row.elapsed(now))
        return table
