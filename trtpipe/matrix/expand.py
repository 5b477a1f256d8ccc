"""Expand a matrix file into its cells: the product of its axes, less the excludes, plus the includes.

A cell is one build spec: the base's sections with each axis value's fields merged in (a mapping value
deep-merges into the base's section, so `{algo: int4_awq}` keeps the base's calibration settings), its
relative paths read against the matrix file's folder, and its name the join of its labels. The cell
remembers where each field was written in the matrix file, so `load_cell` reports a cell's spec error at
the line of the matrix that set the field, with the spec loader's own messages.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trtpipe import spec_shape
from trtpipe.errors import SpecError
from trtpipe.matrix.loader import AXES, AxisValue, MatrixFile
from trtpipe.names import name_fix, name_problem
from trtpipe.spec import BuildSpec
from trtpipe.spec_loader import FieldPath, LoadedSpec, Position, spec_error_from_validation

# The spec fields that hold paths, read against the matrix file's folder when relative.
PATH_FIELDS: tuple[FieldPath, ...] = (
    ("model", "path"), ("model", "config"), ("model", "tokenizer"), ("quantization", "calibration", "dataset"),
)


@dataclass
class Cell:
    """One build of the matrix: its name, the label it took on each axis, its spec data and positions."""

    name: str
    labels: dict[str, str]  # cell key (model, target ...) -> label
    data: dict[str, Any]  # the build spec, as YAML would give it (paths absolute)
    positions: dict[FieldPath, Position]  # spec field path -> position in the matrix file
    origin: str  # "axes" or "include[N]"
    # a base in the spec's earlier shape (trtpipe.spec_shape): today's path -> the path it was written as
    written_as: dict[FieldPath, FieldPath] = field(default_factory=dict)


def _deep_merge(into: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)
    return into


def _anchored(value: Any, folder: Path) -> Any:
    """A relative path given as text, read against `folder`; anything else unchanged (the spec refuses it)."""
    if not isinstance(value, str) or not value or "\x00" in value:
        return value
    try:
        path = Path(value).expanduser()
    except RuntimeError:  # ~user of no such user: the spec's own check says so
        return value
    return value if path.is_absolute() else str((folder / path).resolve())


def _make_cell(matrix: MatrixFile, values: list[AxisValue], origin: str) -> Cell:
    data = copy.deepcopy(matrix.base)
    positions = matrix.base_positions()
    upgraded = spec_shape.upgrade(data, positions, matrix.display_path)
    if upgraded is not None:
        data, positions = upgraded.data, upgraded.positions
    for value in values:
        axis = value.axis
        if axis.section is None:
            data.update(copy.deepcopy(value.fields))
        else:
            section = data.setdefault(axis.section, {})
            if isinstance(section, dict):
                _deep_merge(section, value.fields)
        positions.update(value.positions)
    for field_path in PATH_FIELDS:
        holder: Any = data
        for part in field_path[:-1]:
            holder = holder.get(part) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and field_path[-1] in holder:
            holder[field_path[-1]] = _anchored(holder[field_path[-1]], matrix.path.parent)
    labels = {value.axis.cell_key: value.label for value in values}
    name = "-".join(labels[axis.cell_key] for axis in AXES if axis.cell_key in labels) or matrix.name
    data["name"] = name
    return Cell(name=name, labels=labels, data=data, positions=positions, origin=origin,
                written_as=upgraded.written_as if upgraded is not None else {})


def expand(matrix: MatrixFile) -> list[Cell]:
    """Every cell, in file order: the axes' product less the excludes, then each include's cells.

    An include that makes a cell the axes already make with the same spec adds nothing; with another spec
    under the same name it is refused (give its value a label)."""
    given = [axis for axis in AXES if axis.name in matrix.axes]
    cells: dict[str, Cell] = {}

    def add(cell: Cell, where: FieldPath) -> None:
        problem = name_problem("name", cell.name)
        if problem:
            raise matrix.error(where, f"cell name {cell.name!r} (its labels joined) is not a plain name",
                               name_fix("cell name: shorten the labels"))
        first = cells.get(cell.name)
        if first is None:
            cells[cell.name] = cell
        elif first.data != cell.data:
            raise matrix.error(where, f"this makes cell {cell.name}, which {first.origin} also makes with other "
                                      "settings", "give the value that differs its own `label:`")

    for combo in itertools.product(*(matrix.axes[axis.name] for axis in given)):
        labels = {value.axis.cell_key: value.label for value in combo}
        if any(all(labels.get(key) == label for key, label in rule.items()) for rule in matrix.exclude):
            continue
        add(_make_cell(matrix, list(combo), "axes"), ("axes",))
    for entry in matrix.include:
        rest = [axis for axis in given if axis.cell_key not in entry.values]
        for combo in itertools.product(*(matrix.axes[axis.name] for axis in rest)):
            chosen = {**{v.axis.cell_key: v for v in combo}, **entry.values}
            ordered = [chosen[axis.cell_key] for axis in AXES if axis.cell_key in chosen]
            add(_make_cell(matrix, ordered, f"include[{entry.index}]"), ("include", entry.index))
    if not cells:
        raise matrix.error(("exclude",) if matrix.exclude else (), "the matrix has no cells",
                           "keep at least one combination (check exclude), or add axes or include entries")
    return list(cells.values())


def load_cell(matrix: MatrixFile, cell: Cell) -> LoadedSpec:
    """The cell's validated spec, positioned in the matrix file: a problem is one SpecError naming the cell."""
    try:
        spec = BuildSpec.model_validate(cell.data)
    except ValidationError as exc:
        error = spec_error_from_validation(exc, cell.data, cell.positions, matrix.display_path, cell.written_as)
        raise in_cell(error, cell.name) from None
    return LoadedSpec(spec=spec, path=matrix.path, display_path=matrix.display_path, positions=dict(cell.positions),
                      written_as=dict(cell.written_as))


def in_cell(error: SpecError, cell: str) -> SpecError:
    """The same positioned error, saying which cell it is about."""
    return SpecError(f"cell {cell}: {error.message}", file=error.file, line=error.line, col=error.col,
                     field=error.field, fix=error.fix)
