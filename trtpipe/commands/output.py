"""How commands print: the options every command shares, JSON, refusals, and tables that survive CI logs.

A table goes to a terminal as a rich table (long cells fold, never cut). To anything else (a pipe, a
file, a CI log) it is plain aligned text no wider than `table_width()` (COLUMNS, at least 120): a cell
too long for its column wraps between words, never inside one (nor inside a series of numbers or a number
and its unit), so keys, digests and names stay whole and searchable; a line is longer only where one word is. Columns whose longest words no longer fit
side by side go under each row as indented `column: value` lines.

A refusal (a `TrtpipeError` the CLI catches) is one line on stderr and, when the command was given
`--json`, also one JSON object on stdout (`refusal_json`): what a CI step parses either way.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

if TYPE_CHECKING:
    from trtpipe.errors import TrtpipeError
    from trtpipe.store.manifest import WeightFiles
    from trtpipe.workspace import Workspace

MIN_TABLE_WIDTH = 120  # a CI log is read in a browser: narrower than this only wraps what would fit anyway
COLUMN_GAP = "  "


@dataclass
class CommandOutput:
    """What the running command asked of its output; the CLI hands one to click as the context object
    (`trtpipe.cli.main`), so the refusal path knows whether `--json` was given."""

    json: bool = False


def _remember_json(ctx: typer.Context, value: bool) -> bool:
    if value and isinstance(ctx.obj, CommandOutput):
        ctx.obj.json = True
    return value


def json_option(help_text: str) -> Any:
    """The `--json` option with `help_text`, for `Annotated[bool, json_option(...)] = False`: every command's
    --json goes through here, so that a refusal of any of them is JSON on stdout too."""
    return typer.Option("--json", help=help_text, callback=_remember_json)


StoreOption = Annotated[
    Optional[str],
    typer.Option(
        "--store",
        help="Store directory, or a remote build cache oci://HOST/REPO (default: $TRTPIPE_STORE, else $TRTPIPE_HOME, "
             "else the user cache dir).",
    ),
]
JsonOption = Annotated[bool, json_option("Print the result as JSON on stdout (nothing else there); a refusal is a "
                                         "JSON object there too ({\"ok\": false, \"error\": ...}).")]


def command_configs() -> Path:
    """The build_configs/ folder a command reads its tables from: TRTPIPE_BUILD_CONFIGS, else the shipped one (read
    here, in the shell, and handed to the library)."""
    from trtpipe.settings import Settings
    from trtpipe.shipped import build_configs_dir

    return build_configs_dir(Settings.from_env())


def open_workspace(store: str | Path | None) -> Workspace:
    """The command's workspace (`trtpipe.workspace` decides every place from --store and the settings); the
    environment is read here, in the shell, once per command."""
    from trtpipe.settings import Settings
    from trtpipe.workspace import Workspace

    return Workspace.open(store, settings=Settings.from_env(), weights=_weight_files)


def _weight_files() -> WeightFiles:
    """Which files of each artifact kind hold weights, as the stages declare them (loaded only when a command
    opens a remote cache: a warm build loads no stage)."""
    from trtpipe.stages import weight_file_rule

    return weight_file_rule()


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


# --------------------------------------------------------------------------- refusals
def refusal_json(err: TrtpipeError, line: str, hint: str | None) -> dict[str, Any]:
    """The JSON object a refused command prints on stdout with --json: `ok` false, the exit code, the error (its
    type, `stderr`: the line stderr got, message, fix, hint, and `fields`: the typed fields its type carries, such
    as a spec error's file, line and field) and its verdicts (a gate refusal's gates, a failed build's diagnoses;
    None where the error has none)."""
    return {
        "ok": False,
        "exit_code": err.exit_code,
        "error": {"type": type(err).__name__, "stderr": line, "message": err.message, "fix": err.fix, "hint": hint,
                  "fields": err.fields()},
        "verdicts": err.verdicts(),
    }


def print_refusal(err: TrtpipeError, line: str, hint: str | None, output: CommandOutput | None) -> None:
    """A refusal: its line on stderr; with --json also `refusal_json` on stdout, one line."""
    if output is not None and output.json:
        print(json.dumps(refusal_json(err, line, hint), sort_keys=True, default=str), file=sys.stdout, flush=True)
    # One write, newline included (print() writes the two apart): nothing another writer says lands inside it.
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------- tables
def table_width(columns: int | None) -> int:
    """How wide a table may be outside a terminal: the shell's COLUMNS, at least MIN_TABLE_WIDTH."""
    return max(columns or 0, MIN_TABLE_WIDTH)


def _plain(text: Any) -> str:
    return " ".join(str(text).split()) if text is not None else ""


# A series of numbers such as "10.2 / 10.5 / 13.1 / 14.6" (mean / P50 / P90 / P99) is one value, and so is a
# number with its unit ("40 req/s", "12.5 GiB"): a cell is never broken inside either. The renderer joins
# their parts with no-break spaces, which textwrap does not split on, and prints plain spaces again.
_NO_BREAK = "\u00a0"
_GLUED_SERIES = re.compile(r"(?<=\d) (?=/ [\d-])|(?<=\d /) (?=[\d-])")  # "10.2 / 10.5", "- / 3"
_GLUED_UNIT = re.compile(r"(?<=\d) (?=[A-Za-z%])")


def _cell(text: Any) -> str:
    return _GLUED_UNIT.sub(_NO_BREAK, _GLUED_SERIES.sub(_NO_BREAK, _plain(text)))


def _longest_word(text: str) -> int:
    return max((len(word) for word in text.split(" ")), default=0)


def _wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, broken only between words (a longer word stands alone)."""
    if not text:
        return [""]
    return textwrap.wrap(text, width=max(width, 1), break_long_words=False, break_on_hyphens=False) or [""]


def _fit(natural: list[int], floor: list[int], budget: int) -> list[int]:
    """Column widths within `budget`: each column at most its natural width and at least its floor (its
    longest word), the widest capped first (the largest common cap that fits)."""
    def widths(cap: int) -> list[int]:
        return [max(low, min(full, cap)) for full, low in zip(natural, floor)]

    low, high = 1, max(natural)
    while low < high:  # the largest cap whose widths fit; the floors fit by the caller's check
        cap = (low + high + 1) // 2
        if sum(widths(cap)) <= budget:
            low = cap
        else:
            high = cap - 1
    return widths(low)


def render_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                 caption: str | None = None, width: int = MIN_TABLE_WIDTH) -> list[str]:
    """A table as plain lines no longer than `width` unless a single word is (module docstring).

    The first columns whose longest words fit side by side form the grid, each cell wrapped to its
    column; a column that no longer fits goes under its row as an indented `column: value` line
    (left out where the cell is empty)."""
    cells = [[_cell(c) for c in columns], *[[_cell(c) for c in row] for row in rows]]
    count = len(columns)
    if count == 0:
        return (_wrap(_plain(title), width) if title else []) + (_wrap(_plain(caption), width) if caption else [])
    natural = [max(len(row[i]) for row in cells) for i in range(count)]
    floor = [max(_longest_word(row[i]) for row in cells) for i in range(count)]
    gap = len(COLUMN_GAP)
    grid = count
    while grid > 1 and sum(floor[:grid]) + gap * (grid - 1) > width:
        grid -= 1
    budget = width - gap * (grid - 1)
    if grid == 1:  # one column left: as wide as the line (a longer word then stands alone on its line)
        fitted = [min(natural[0], width)]
    elif sum(natural[:grid]) <= budget:
        fitted = natural[:grid]
    else:
        fitted = _fit(natural[:grid], floor[:grid], budget)
    # Fields below a row start under its second column, unless the first takes more than half the line.
    indent = fitted[0] + gap if grid > 1 and fitted[0] + gap <= width // 2 else gap
    lines = _wrap(_plain(title), width) if title else []
    for number, row in enumerate(cells):
        wrapped = [_wrap(cell, column_width) for cell, column_width in zip(row[:grid], fitted)]
        for index in range(max(len(cell_lines) for cell_lines in wrapped)):
            parts = [(cell_lines[index] if index < len(cell_lines) else "").ljust(column_width)
                     for cell_lines, column_width in zip(wrapped, fitted)]
            lines.append(COLUMN_GAP.join(parts).rstrip())
        if number == 0:
            continue  # the header row names only the grid's columns; the others name themselves below
        for name, value in zip(cells[0][grid:], row[grid:]):
            if not value:
                continue
            label = f"{name}: "
            room = width - indent - len(label)
            if _longest_word(value) > room:  # a word too long to stand beside its label: the value below, unindented
                lines.append((" " * indent if indent + len(label) <= width else "") + label.rstrip())
                lines += _wrap(value, width)
                continue
            more = _wrap(value, room)
            lines.append(" " * indent + label + more[0])
            lines += [" " * (indent + len(label)) + line for line in more[1:]]
    lines = [line.replace(_NO_BREAK, " ") for line in lines]
    return lines + (_wrap(_plain(caption), width) if caption else [])


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *,
                caption: str | None = None, err: bool = False) -> None:
    """A table on stdout (stderr with `err`): rich on a terminal, else `render_table` at `table_width()`."""
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
    from trtpipe.settings import Settings

    lines = render_table(title, columns, rows, caption=caption, width=table_width(Settings.from_env().columns))
    typer.echo("\n".join(lines), err=err)
