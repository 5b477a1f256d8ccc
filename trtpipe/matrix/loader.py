"""The matrix file: a base spec times its axes, with explicit excludes and includes, read with positions.

```yaml
name: tiny-fleet                 # the matrix's name (reports); each cell is named after its labels
base:                            # any build spec sections, shared by every cell
  engine: {max_batch_size: 4, max_input_len: 256, max_seq_len: 512}
axes:                            # each a list; a cell takes one value of every axis given
  models:        [{label: tiny-llama, path: ../../out/tiny-llama, dtype: float16}]
  targets:       [cpu-reference, {gpu: h100-sxm, tp: 2}]     # text: target.gpu
  quantizations: [none, fp8, {algo: int4_awq, group_size: 64}]  # text: quantization.algo
  profiles:      [throughput, latency]                     # text: limits.profile; a mapping: limits keys
  toolchains:    [trtllm-1.2.1]                            # text: toolchain
exclude:                         # drop the cells whose labels match every pair given
  - {target: a100-80gb, quantization: fp8}
include:                         # add cells: a label of the axis or an inline value per axis named;
  - {target: {gpu: h100-sxm, tp: 2}, quantization: fp8}   # an axis not named takes each of its values
```

An axis value in text is the shorthand of its section (above); a mapping is that section's keys (merged
into the base's section) plus an optional `label`. Labels name cells (`tiny-llama-h100-sxm-tp2-fp8`), so
they are plain names and unique per axis; a mapping without one is labelled from its values. Relative
paths are read against the matrix file's folder, as a spec's are against the spec's.

Loading reuses the spec loader's positioned YAML (`trtpipe.spec_loader.parse_yaml`): every problem is one
`SpecError` at `file:line:col`, and so is every cell's spec problem, cited at the line of the matrix that
set the field (`trtpipe.matrix.expand`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtpipe.errors import SpecError
from trtpipe.names import name_fix, name_problem
from trtpipe.spec_loader import FieldPath, Position, format_field, parse_yaml


@dataclass(frozen=True)
class Axis:
    """One axis: its name in the file, its name in a cell, the spec section it sets and its text shorthand."""

    name: str  # models
    cell_key: str  # model (exclude/include keys, a cell's labels)
    section: str | None  # the spec section a mapping value is merged into (None: a top-level text field)
    shorthand: str  # the field a text value sets (in `section`, or top-level when section is None)


AXES: tuple[Axis, ...] = (
    Axis("models", "model", "model", "path"),
    Axis("targets", "target", "target", "gpu"),
    Axis("quantizations", "quantization", "quantization", "algo"),
    Axis("profiles", "profile", "limits", "profile"),
    Axis("toolchains", "toolchain", None, "toolchain"),
)
AXIS_BY_NAME = {axis.name: axis for axis in AXES}
AXIS_BY_CELL_KEY = {axis.cell_key: axis for axis in AXES}
TOP_KEYS = ("name", "base", "axes", "exclude", "include")
LABEL = "label"


@dataclass
class AxisValue:
    """One value of an axis: its label and the spec fields it sets, with where each was written."""

    axis: Axis
    label: str
    fields: dict[str, Any]  # the section's keys (or {shorthand: value} for a top-level text field)
    positions: dict[FieldPath, Position]  # spec field path -> position in the matrix file
    where: FieldPath  # where the value was written in the matrix file


@dataclass
class IncludeEntry:
    """One `include` entry: per axis it names, the value (an axis value or an inline one)."""

    index: int
    values: dict[str, AxisValue]  # cell key -> value


@dataclass
class MatrixFile:
    """A loaded matrix file: the base spec data, the axes' values, the excludes and includes, positions."""

    path: Path  # absolute
    display_path: str
    name: str
    base: dict[str, Any]
    axes: dict[str, list[AxisValue]]  # axis name -> its values (only the axes given)
    exclude: list[dict[str, str]]  # cell key -> label
    include: list[IncludeEntry]
    positions: dict[FieldPath, Position] = field(default_factory=dict)

    def error(self, where: FieldPath, message: str, fix: str | None = None) -> SpecError:
        """A SpecError at `where` in the matrix file (or its nearest written ancestor)."""
        path = tuple(where)
        while path and path not in self.positions:
            path = path[:-1]
        line, col = self.positions.get(path, (1, 1))
        return SpecError(message, file=self.display_path, line=line, col=col, field=format_field(tuple(where)) or None,
                         fix=fix)

    def base_positions(self) -> dict[FieldPath, Position]:
        """Spec field path -> position, for what `base:` sets."""
        return {p[1:]: at for p, at in self.positions.items() if len(p) > 1 and p[0] == "base"}


# --------------------------------------------------------------------------------------------- reading


def _read_text(path: Path, display: str) -> str:
    def fail(message: str, fix: str) -> SpecError:
        return SpecError(message, file=display, line=1, col=1, fix=fix)

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise fail("matrix file does not exist", "check the path (see build_configs/examples/)") from None
    except IsADirectoryError:
        raise fail("is a directory, not a matrix file", "pass the YAML file") from None
    except OSError as exc:
        raise fail(f"cannot read the matrix file: {exc.strerror}", "check the file's permissions") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError("matrix file is not UTF-8 text", file=display, line=line, col=1,
                        fix="save the file as UTF-8") from None


class _Reader:
    """Checks the matrix file's shape, one positioned error at a time."""

    def __init__(self, data: dict[str, Any], positions: dict[FieldPath, Position], path: Path, display: str) -> None:
        self.data = data
        self.positions = positions
        self.path = path
        self.display = display
        self.folder = path.parent

    def error(self, where: FieldPath, message: str, fix: str | None = None) -> SpecError:
        probe = tuple(where)
        while probe and probe not in self.positions:
            probe = probe[:-1]
        line, col = self.positions.get(probe, (1, 1))
        return SpecError(message, file=self.display, line=line, col=col, field=format_field(tuple(where)) or None,
                         fix=fix)

    def mapping(self, value: Any, where: FieldPath, what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(where, f"{what} must be a mapping of keys, got {_shown(value)}",
                             f"write `{where[-1]}:` followed by indented `key: value` lines")
        for key in value:
            if not isinstance(key, str):
                raise self.error(where, f"key {key!r} is not text", "keys are words such as `model` or `target`")
        return value

    def listing(self, value: Any, where: FieldPath, what: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.error(where, f"{what} must be a list, got {_shown(value)}",
                             "write a YAML list (`- item` lines or [a, b])")
        return value

    def known_keys(self, value: dict[str, Any], where: FieldPath, valid: tuple[str, ...]) -> None:
        for key in value:
            if key not in valid:
                close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
                fix = f"did you mean {close[0]!r}?" if close else f"valid keys here: {', '.join(valid)}"
                raise self.error((*where, key), f"unknown key {key!r}", fix)

    def label(self, value: Any, where: FieldPath) -> str:
        if not isinstance(value, str):
            raise self.error(where, f"a label must be text, got {_shown(value)}", "write a plain name, e.g. h100-tp2")
        problem = name_problem("label", value)
        if problem:
            raise self.error(where, problem, name_fix("label (it becomes part of each cell's artifact name)"))
        return value

    # -- axis values -------------------------------------------------------------------------------
    def axis_value(self, axis: Axis, item: Any, where: FieldPath) -> AxisValue:
        """A value of `axis` written at `where`: text (the shorthand) or a mapping of the section's keys."""
        if isinstance(item, (str, int, float)) and not isinstance(item, bool):
            text = str(item)
            fields = {axis.shorthand: text}
            positions = {self._spec_path(axis, axis.shorthand): self._at(where)}
            if axis.section is not None:
                positions[(axis.section,)] = self._at(where)
            return AxisValue(axis, self.label(self._derived_label(axis, fields, where), where), fields, positions, where)
        if axis.section is None:
            raise self.error(where, f"a {axis.cell_key} value is its name (text), got {_shown(item)}",
                             f"write the {axis.cell_key}'s name, e.g. trtllm-1.2.1")
        mapping = dict(self.mapping(item, where, f"a value of axes.{axis.name}"))
        positions: dict[FieldPath, Position] = {(axis.section,): self._at(where)}
        for path, at in self.positions.items():
            if len(path) > len(where) and path[: len(where)] == tuple(where) and path[len(where)] != LABEL:
                positions[(axis.section, *path[len(where):])] = at
        label = mapping.pop(LABEL, None)
        if not mapping:
            raise self.error(where, f"this {axis.cell_key} value sets no {axis.section} field",
                             f"write the {axis.section} keys it sets, e.g. {axis.shorthand}: ...")
        if label is None:
            label = self._derived_label(axis, mapping, where)
            label_at = where
        else:
            label_at = (*where, LABEL)
        return AxisValue(axis, self.label(label, label_at), mapping, positions, where)

    def _at(self, where: FieldPath) -> Position:
        return self.positions.get(tuple(where), (1, 1))

    @staticmethod
    def _spec_path(axis: Axis, name: str) -> FieldPath:
        return (axis.section, name) if axis.section is not None else (name,)

    def _derived_label(self, axis: Axis, fields: dict[str, Any], where: FieldPath) -> str:
        """The label of a value written without one: from the values that name it."""
        def text(name: str) -> str | None:
            value = fields.get(name)
            return str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None

        parts: list[str] = []
        if axis.cell_key == "model":
            named = text("path") or text("config") or text("repo_id")
            if named:
                path = Path(named)
                parts.append(path.parent.name if path.name == "config.json" else path.name)
        elif axis.cell_key == "target":
            if text("gpu"):
                parts.append(str(text("gpu")))
            for name in ("tp", "pp"):
                if text(name) and text(name) != "1":
                    parts.append(f"{name}{text(name)}")
        elif axis.cell_key == "quantization":
            if text("algo"):
                parts.append(str(text("algo")))
            if text("kv_cache") and text("kv_cache") != "auto":
                parts.append(f"kv-{text('kv_cache')}")
            if text("group_size"):
                parts.append(f"g{text('group_size')}")
        else:
            if text(axis.shorthand):
                parts.append(str(text(axis.shorthand)))
        if not parts:
            raise self.error(where, f"this {axis.cell_key} value has no label",
                             "add `label:` (a plain name for it in cell names)")
        return "-".join(parts)

    # -- the file ----------------------------------------------------------------------------------
    def read(self) -> MatrixFile:
        data = self.data
        self.known_keys(data, (), TOP_KEYS)
        name = data.get("name", self.path.stem)
        if not isinstance(name, str) or name_problem("name", name):
            raise self.error(("name",), f"the matrix name {name!r} is not a plain name", name_fix("matrix name"))
        base = dict(self.mapping(data.get("base") or {}, ("base",), "base"))
        if "name" in base:
            raise self.error(("base", "name"), "a matrix names each cell after its labels, so base may not set `name`",
                             "remove base.name (set the matrix's own `name:` for its reports)")
        axes_data = self.mapping(data.get("axes") or {}, ("axes",), "axes")
        self.known_keys(axes_data, ("axes",), tuple(AXIS_BY_NAME))
        axes: dict[str, list[AxisValue]] = {}
        for axis in AXES:
            if axis.name not in axes_data:
                continue
            where = ("axes", axis.name)
            items = self.listing(axes_data[axis.name], where, f"axes.{axis.name}")
            if not items:
                raise self.error(where, f"axes.{axis.name} is empty", f"list at least one {axis.cell_key}, or remove the axis")
            values = [self.axis_value(axis, item, (*where, index)) for index, item in enumerate(items)]
            seen: dict[str, AxisValue] = {}
            for value in values:
                if value.label in seen:
                    first = seen[value.label].where
                    raise self.error(value.where, f"label {value.label!r} is used twice in axes.{axis.name} "
                                                  f"(first at line {self._at(first)[0]})",
                                     "give each value its own `label:`")
                seen[value.label] = value
            axes[axis.name] = values
            if axis.section is not None and axis.section in base and not isinstance(base[axis.section], dict):
                raise self.error(("base", axis.section), f"base.{axis.section} must be a mapping of keys",
                                 f"write `{axis.section}:` followed by indented `key: value` lines")
        exclude = self._excludes(axes)
        include = self._includes(axes)
        return MatrixFile(path=self.path, display_path=self.display, name=name, base=base, axes=axes,
                          exclude=exclude, include=include, positions=self.positions)

    def _excludes(self, axes: dict[str, list[AxisValue]]) -> list[dict[str, str]]:
        entries = self.listing(self.data.get("exclude") or [], ("exclude",), "exclude")
        given = {AXIS_BY_NAME[name].cell_key: values for name, values in axes.items()}
        result = []
        for index, entry in enumerate(entries):
            where = ("exclude", index)
            entry = self.mapping(entry, where, "an exclude entry")
            if not entry:
                raise self.error(where, "this exclude entry names no axis", "write e.g. {target: a100-80gb, quantization: fp8}")
            self.known_keys(entry, where, tuple(given))
            for key, label in entry.items():
                labels = [v.label for v in given[key]]
                if label not in labels:
                    close = difflib.get_close_matches(str(label), labels, n=1, cutoff=0.6)
                    raise self.error((*where, key), f"{label!r} is not a label of axes.{AXIS_BY_CELL_KEY[key].name}",
                                     f"did you mean {close[0]!r}?" if close else f"use one of: {', '.join(labels)}")
            result.append({str(k): str(v) for k, v in entry.items()})
        return result

    def _includes(self, axes: dict[str, list[AxisValue]]) -> list[IncludeEntry]:
        entries = self.listing(self.data.get("include") or [], ("include",), "include")
        result = []
        for index, entry in enumerate(entries):
            where = ("include", index)
            entry = self.mapping(entry, where, "an include entry")
            if not entry:
                raise self.error(where, "this include entry names no axis", "write e.g. {target: h200, quantization: fp8}")
            self.known_keys(entry, where, tuple(AXIS_BY_CELL_KEY))
            values: dict[str, AxisValue] = {}
            for key, value in entry.items():
                axis = AXIS_BY_CELL_KEY[key]
                known = {v.label: v for v in axes.get(axis.name, [])}
                if isinstance(value, str) and value in known:
                    values[key] = known[value]
                else:
                    values[key] = self.axis_value(axis, value, (*where, key))
            result.append(IncludeEntry(index=index, values=values))
        return result


def _shown(value: Any) -> str:
    return type(value).__name__ if isinstance(value, (dict, list)) else repr(value)


def load_matrix(path: Path | str) -> MatrixFile:
    """Read and check a matrix file. Raises one positioned SpecError (exit code 2) on any problem."""
    display = str(path)
    path = Path(path)
    data, positions = parse_yaml(_read_text(path, display), display)
    if data is None:
        raise SpecError("matrix file is empty", file=display, line=1, col=1,
                        fix="write `base:` and `axes:` (see build_configs/examples/matrices/tiny.yaml)")
    if not isinstance(data, dict):
        raise SpecError("the top level is not a mapping", file=display, line=1, col=1,
                        fix="write `name:`, `base:`, `axes:`, `exclude:`, `include:` at the start of lines")
    reader = _Reader(data, positions, path.resolve(), display)
    for key in data:
        if not isinstance(key, str):
            raise reader.error((), f"key {key!r} is not text", f"top-level keys: {', '.join(TOP_KEYS)}")
    return reader.read()
