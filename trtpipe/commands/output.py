"""How commands print: the options every command shares, JSON, and tables that survive CI logs.

A table goes to a terminal as a rich table (long cells fold, never cut); to anything else (a pipe,
a file, a CI log) as plain aligned text as wide as its content, so keys, digests and names are
always whole, whatever COLUMNS says.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from trtpipe.workspace import Workspace

StoreOption = Annotated[
    Optional[str],
    typer.Option(
        "--store",
        help="Store directory, or a remote build cache oci://HOST/REPO (default: $TRTPIPE_STORE, else $TRTPIPE_HOME, "
             "else the user cache dir).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout (nothing else there).")]


def open_workspace(store: str | Path | None) -> Workspace:
    """The command's workspace (`trtpipe.workspace` decides every place from --store and the environment)."""
    from trtpipe.workspace import Workspace

    return Workspace.open(store)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


def _plain(text: Any) -> str:
    return " ".join(str(text).split()) if text is not None else ""


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                caption: str | None = None, err: bool = False) -> None:
    """A table on stdout (stderr with `err`): rich on a terminal, plain full-width text elsewhere."""
    stream = sys.stderr if err else sys.stdout
    if stream.isatty():
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, caption=caption)
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(str(cell) for cell in row))
        Console(stderr=err).print(table)
        return
    cells = [[_plain(c) for c in columns], *[[_plain(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = [title] if title else []
    for row in cells:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    if caption:
        lines.append(_plain(caption))
    typer.echo("\n".join(lines), err=err)
