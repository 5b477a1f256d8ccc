"""Load a build spec from YAML, remembering where every key was written.

Every problem becomes ONE positioned `SpecError`: `file:line:col: field.path: what is wrong; how to fix it`.
YAML is composed into nodes first (marks per key path, duplicate keys refused), then constructed with the safe
loader and validated by pydantic; pydantic error locations are mapped back to the YAML positions.

A spec is a few hundred bytes of hand-written YAML, so the loader refuses, at the position where it starts,
anything far outside that: a file over `MAX_SPEC_BYTES`, collections nested deeper than `MAX_DEPTH` (counted
after aliases are expanded: no RecursionError anywhere below), more than `MAX_NODES` values once aliases are
expanded (a "billion laughs" spec is refused at the anchor that crosses the bound, before anything is
constructed, in bounded memory and time), a recursive alias, a NUL byte in any value, a value the safe
constructor cannot build (an integer beyond Python's digit limit, a timestamp that is no date). Paths in the
spec are checked when they are anchored: `~user` for a user that does not exist, names longer than the
filesystem takes, NUL bytes.
"""

from __future__ import annotations

import difflib
import errno
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trtpipe import spec_shape
from trtpipe.errors import SpecError
from trtpipe.spec import BuildSpec
from trtpipe.toolchain import BACKEND_CLASSES

FieldPath = tuple[str | int, ...]
Position = tuple[int, int]

MERGE_TAG = "tag:yaml.org,2002:merge"

# Bounds on a spec (see the module doc). The largest example spec is about 1 KB, 5 levels deep
# (release.gates.<channel>.bench.<slo>) and about 60 values; these leave room for hand-written anchors.
MAX_SPEC_BYTES = 256 * 1024
MAX_DEPTH = 16
MAX_NODES = 10_000
# Linux's NAME_MAX and PATH_MAX (limits.h): open() refuses longer names with ENAMETOOLONG.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095


def format_field(field_path: FieldPath) -> str:
    """('backend', 'plugins', 'x') -> 'backend.plugins.x'; list indexes as [i]; a key that is not a plain word
    (a user's map key with a space, a slash or a newline) as ['its repr'], so the field stays on one line."""
    text = ""
    for part in field_path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif str(part).replace("_", "a").replace("-", "a").isalnum() and str(part).isascii():
            text += ("." if text else "") + str(part)
        else:
            text += f"[{str(part)!r}]"
    return text


@dataclass
class LoadedSpec:
    """A validated BuildSpec plus where each field was written in its YAML file."""

    spec: BuildSpec
    path: Path
    display_path: str = ""
    positions: dict[FieldPath, Position] = field(default_factory=dict)
    # Each path field as written, made absolute against the spec's folder but with symlinks NOT followed (the
    # spec's values are resolved): whether a file is "in the model folder" is a question about this path.
    written_paths: dict[FieldPath, Path] = field(default_factory=dict)
    # A spec in the earlier shape (trtpipe.spec_shape): today's path -> the path it was written as, and the note.
    written_as: dict[FieldPath, FieldPath] = field(default_factory=dict)
    shape_note: str | None = None

    def shown(self, field_path: FieldPath) -> str:
        """A field as the user wrote it (its earlier name in a spec of the earlier shape)."""
        return format_field(spec_shape.shown_path(tuple(field_path), self.written_as))

    def position(self, field_path: FieldPath) -> Position | None:
        """(line, col), 1-based, of the key `field_path` in the file; None if it was not written."""
        return self.positions.get(tuple(field_path))

    def nearest_position(self, field_path: FieldPath) -> tuple[Position, FieldPath]:
        """The position of the field, or of its closest written ancestor (the file start at worst)."""
        path = tuple(field_path)
        while path:
            found = self.positions.get(path)
            if found is not None:
                return found, path
            path = path[:-1]
        return (1, 1), ()

    def error(self, field_path: FieldPath, message: str, fix: str | None = None) -> SpecError:
        """A SpecError citing `field_path` (or its nearest written ancestor) in this spec file."""
        (line, col), _ = self.nearest_position(field_path)
        if self.written_as:
            message = spec_shape.in_earlier_names(message, self.written_as)
            fix = spec_shape.in_earlier_names(fix, self.written_as) if fix is not None else None
        return SpecError(
            message,
            file=self.display_path or str(self.path),
            line=line,
            col=col,
            field=self.shown(field_path) or None,
            fix=fix,
        )


# ------------------------------------------------------------------------------------------------ YAML


def _mark(mark: yaml.Mark | None) -> Position:
    if mark is None:
        return (1, 1)
    return (mark.line + 1, mark.column + 1)


def _record_positions(
    node: yaml.Node, path: FieldPath, positions: dict[FieldPath, Position], file: str, depth: int = 0
) -> None:
    """Record the position of every key (and list item) under `node`; refuse duplicate keys."""
    if depth > 64:  # aliases can nest deeply; a spec never does
        return
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, Position] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                # `<<: *anchor` merges keys; they keep the anchor's positions
                _record_positions(value_node, path, positions, file, depth + 1)
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            where = _mark(key_node.start_mark)
            if key in seen:
                raise SpecError(
                    f"duplicate key {key!r} (first written at line {seen[key][0]})",
                    file=file,
                    line=where[0],
                    col=where[1],
                    field=format_field(path + (key,)),
                    fix="keep only one of them: YAML would silently use the last",
                )
            seen[key] = where
            positions.setdefault(path + (key,), where)
            _record_positions(value_node, path + (key,), positions, file, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            positions.setdefault(path + (index,), _mark(item.start_mark))
            _record_positions(item, path + (index,), positions, file, depth + 1)


class _SpecLimit(yaml.MarkedYAMLError):
    """A bound of the loader was crossed at `problem_mark` (reported like any YAML error)."""

    def __init__(self, problem: str, mark: yaml.Mark | None,
                 fix: str = "a spec is a small hand-written file: write the values out plainly") -> None:
        super().__init__(problem=problem, problem_mark=mark)
        self.fix = fix


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the bounds of the module doc enforced while it composes and constructs.

    The pure-Python loader on purpose: its scanner and parser keep explicit stacks (no recursion), and the
    composer, the one recursive part, is bounded here before it descends."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0
        # expanded (size, height) of every node composed so far, by identity; a node is in it once complete
        self._expanded: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if id(node) not in self._expanded:
                raise _SpecLimit("this alias refers to a collection it is inside (a recursive alias)", mark,
                                 "an alias may only name an anchor whose collection is complete")
            return node
        mark = self.peek_event().start_mark
        collection = self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent)
        if collection:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _SpecLimit(f"collections are nested more than {MAX_DEPTH} levels deep here", mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            if collection:
                self._depth -= 1
        if isinstance(node, yaml.ScalarNode):
            if "\x00" in node.value:
                raise _SpecLimit("this value holds a NUL byte (\\0)", mark, "remove it: no name or path can contain one")
            size, height = 1, 0
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
            stats = [self._expanded[id(child)] for child in children]
            size = 1 + sum(s for s, _ in stats)
            height = 1 + max((h for _, h in stats), default=0)
            if height > MAX_DEPTH:
                raise _SpecLimit(f"with its aliases expanded, this collection nests more than {MAX_DEPTH} levels "
                                 "deep", mark)
            if size > MAX_NODES:
                raise _SpecLimit(f"with its aliases expanded, this collection holds more than {MAX_NODES:,} values "
                                 "(anchors and aliases that multiply each other)", mark)
        self._expanded[id(node)] = (size, height)
        return node

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, OverflowError, ArithmeticError) as exc:
            # e.g. an integer longer than Python's int() takes, a timestamp with month 13
            raise _SpecLimit(f"cannot read this value ({exc})", node.start_mark,
                             "write a plain number, text, true/false or a date that exists") from None


def _reader_position(text: str, index: int) -> Position:
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def parse_yaml(text: str, file: str) -> tuple[Any, dict[FieldPath, Position]]:
    """YAML text -> (data, key positions). Raises a positioned SpecError for broken YAML, duplicate keys, or
    YAML beyond the loader's bounds (size is the caller's: `load_spec`)."""
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text)  # its reader refuses characters YAML does not allow, NUL among them
        node = loader.get_single_node()
        if node is None:
            return None, {}
        positions: dict[FieldPath, Position] = {}
        _record_positions(node, (), positions, file)
        data = loader.construct_document(node)
    except _SpecLimit as exc:
        line, col = _mark(exc.problem_mark)
        raise SpecError(f"invalid spec: {exc.problem}", file=file, line=line, col=col, fix=exc.fix) from None
    except yaml.MarkedYAMLError as exc:
        line, col = _mark(exc.problem_mark or exc.context_mark)
        what = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise SpecError(
            f"invalid YAML: {what}",
            file=file,
            line=line,
            col=col,
            fix="fix the YAML syntax here (indent with spaces, `key: value`, quote values containing ': ' or '#')",
        ) from None
    except yaml.reader.ReaderError as exc:
        line, col = _reader_position(text, exc.position)
        code = exc.character if isinstance(exc.character, int) else 0
        what = "a NUL byte" if code == 0 else f"the control character #x{code:04x}"
        raise SpecError(
            f"invalid YAML: {what} is not allowed in YAML text", file=file, line=line, col=col,
            fix="remove it (a spec is plain UTF-8 text)",
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML: {exc}", file=file, line=1, col=1, fix="fix the YAML syntax") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, positions


# --------------------------------------------------------------------------------------------- pydantic


def _unwrap(annotation: Any) -> list[Any]:
    """The member types of Optional/Union annotations."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def backend_options_of(data: Any) -> type[BaseModel] | None:
    """The options model of the backend section the spec data names (its `kind`), if it names a registered one."""
    backend = data.get("backend") if isinstance(data, dict) else None
    kind = backend.get("kind") if isinstance(backend, dict) else None
    return BACKEND_CLASSES[kind].options if isinstance(kind, str) and kind in BACKEND_CLASSES else None


def model_at(field_path: FieldPath, root: type[BaseModel] = BuildSpec, data: Any = None) -> type[BaseModel] | None:
    """The pydantic model class that holds the keys at `field_path` (None if not a model). Under `backend`, the
    member of the backend union that the spec `data` selects."""
    current: Any = root
    index = 0
    if root is BuildSpec and field_path[:1] == ("backend",):
        current, index = backend_options_of(data), 1
    while index < len(field_path):
        part = field_path[index]
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        info = current.model_fields.get(str(part))
        if info is None:
            return None
        nxt = None
        for member in _unwrap(info.annotation):
            if isinstance(member, type) and issubclass(member, BaseModel):
                nxt = member
                break
            if typing.get_origin(member) is dict:
                # dict[str, Model]: skip the user's key
                value_type = typing.get_args(member)[1]
                for inner in _unwrap(value_type):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        nxt = inner
                        index += 1
                        break
                if nxt is None:
                    return None
                break
        if nxt is None:
            return None
        current = nxt
        index += 1
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _present_prefix(data: Any, loc: FieldPath) -> FieldPath:
    """The longest prefix of a pydantic loc that names real keys in the data (drops union tags etc.)."""
    prefix: list[str | int] = []
    current = data
    for part in loc:
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and 0 <= part < len(current):
            current = current[part]
        else:
            break
        prefix.append(part)
    return tuple(prefix)


def _field_in_message(section: FieldPath, message: str, data: Any) -> FieldPath:
    """A section-level (model validator) error names its fields; cite the first one written in the YAML."""
    model = model_at(section, data=data)
    if model is None:
        return section
    node = data
    for part in section:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        return section
    best: tuple[int, str] | None = None
    for name in model.model_fields:
        if name in node:
            for token in (f"`{name}`", f"{name} "):
                at = message.find(token)
                if at >= 0 and (best is None or at < best[0]):
                    best = (at, name)
    return section + (best[1],) if best else section


def _describe(error: dict[str, Any], field_path: FieldPath, data: Any = None,
              written: FieldPath | None = None) -> tuple[str, str]:
    """(what is wrong, how to fix it) for one pydantic error; `written`: the field as the user wrote it."""
    written = field_path if written is None else written
    kind = error["type"]
    ctx = error.get("ctx") or {}
    value = error.get("input")
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    name = str(field_path[-1]) if field_path else "spec"
    if kind == "missing":
        return "required field is missing", f"add `{name}:` here"
    if len(field_path) == 3 and field_path[:2] == ("backend", "plugins") and kind != "extra_forbidden":
        return (
            f"plugin override {name!r} has a {type(value).__name__} value",
            "write text (enable, disable, auto or a dtype such as float16), true/false, or null",
        )
    if kind == "union_tag_invalid":
        return (f"{ctx.get('tag')!r} is not a backend",
                f"use one of: {', '.join(BACKEND_CLASSES)}")
    if kind == "extra_forbidden" and len(field_path) == 1 and name in spec_shape.EARLIER_SECTIONS:
        # an earlier section that is not a mapping (a mapping would have been moved: trtpipe.spec_shape)
        return (f"expected a mapping of keys, got {shown}",
                "write its fields under limits:, runtime: and backend: (the spec's sections today)")
    if kind == "extra_forbidden":
        if len(field_path) == 2 and field_path[0] == "backend" and backend_options_of(data) is not None:
            not_offered = spec_shape.not_offered_line(data["backend"]["kind"], name, format_field(written), value)
            if not_offered is not None:
                return not_offered
        model = model_at(field_path[:-1], data=data)
        valid = list(model.model_fields) if model else []
        if len(field_path) == 1:  # the earlier shape's sections still load (trtpipe.spec_shape)
            valid += list(spec_shape.EARLIER_SECTIONS)
        if len(written) == 2 and written[0] in spec_shape.EARLIER_SECTIONS:  # a typo in an earlier section
            valid = spec_shape.earlier_keys(str(written[0]))
        close = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.6)
        if close:
            return f"unknown key {name!r}", f"did you mean {close[0]!r}?"
        return f"unknown key {name!r}", f"valid keys here: {', '.join(valid)}"
    if kind == "enum":
        expected = str(ctx.get("expected", "")).replace("'", "")
        return f"{shown} is not allowed", f"use one of: {expected}"
    if kind == "literal_error":
        return f"{shown} is not allowed", f"use one of: {ctx.get('expected', '')}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"expected a whole number, got {shown}", "write an integer such as 8 (no quotes, no decimals)"
    if kind in ("float_parsing", "float_type"):
        return f"expected a number, got {shown}", "write a number such as 0.9"
    if kind in ("bool_parsing", "bool_type"):
        return f"expected true or false, got {shown}", "write true or false"
    if kind in ("string_type", "str_type"):
        return f"expected text, got {shown}", "write a plain string"
    if kind in ("path_type",):
        return f"expected a path, got {shown}", "write a file or folder path"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return (
            f"expected a mapping of keys, got {shown}",
            f"write `{name}:` followed by indented `key: value` lines",
        )
    if kind == "list_type":
        return f"expected a list, got {shown}", "write a YAML list (`- item` lines or [a, b])"
    bounds = {
        "greater_than_equal": ("at least", "ge"),
        "greater_than": ("greater than", "gt"),
        "less_than_equal": ("at most", "le"),
        "less_than": ("less than", "lt"),
    }
    if kind in bounds:
        words, key = bounds[kind]
        limit = ctx.get(key)
        return f"{shown} is out of range: it must be {words} {limit}", f"use a value of {words} {limit}"
    if kind == "value_error":
        text = str(ctx.get("error", error["msg"]))
        text = text.removeprefix("Value error, ")
        if "; " in text:
            what, fix = text.split("; ", 1)
            return what, fix
        return text, "see the field's description in trtpipe/spec.py"
    return error["msg"], "fix the value (see trtpipe/spec.py for the allowed values)"


def _without_tag(loc: FieldPath) -> FieldPath:
    """A pydantic loc under the backend union names the member's tag (('backend', 'llm-api', 'x')): drop it."""
    if len(loc) > 1 and loc[0] == "backend" and loc[1] in BACKEND_CLASSES:
        return (loc[0],) + loc[2:]
    return loc


def spec_error_from_validation(
    exc: ValidationError, data: Any, positions: dict[FieldPath, Position], file: str,
    written_as: dict[FieldPath, FieldPath] | None = None,
) -> SpecError:
    """The first (in file order) pydantic error as one positioned SpecError; `written_as` (a spec in the earlier
    shape, trtpipe.spec_shape): the fields are shown as the user wrote them."""
    written_as = written_as or {}
    candidates: list[tuple[Position, int, FieldPath, str, str]] = []
    seen: set[FieldPath] = set()
    for order, error in enumerate(exc.errors()):
        loc: FieldPath = _without_tag(tuple(error["loc"]))
        kind = error["type"]
        if kind == "missing":
            field_path = _present_prefix(data, loc[:-1]) + (loc[-1],) if loc else ()
        else:
            field_path = _present_prefix(data, loc)
            if (kind == "value_error" and field_path == loc[: len(field_path)]
                    and model_at(field_path, data=data) is not None):
                field_path = _field_in_message(field_path, str(error.get("msg", "")), data)
        if field_path in seen:
            continue
        seen.add(field_path)
        written = spec_shape.shown_path(field_path, written_as)
        what, fix = _describe(error, field_path, data, written)
        if written_as:
            what, fix = spec_shape.in_earlier_names(what, written_as), spec_shape.in_earlier_names(fix, written_as)
        probe = field_path
        position = None
        while probe and position is None:
            position = positions.get(probe)
            probe = probe[:-1]
        candidates.append((position or (1, 1), order, written, what, fix))
    candidates.sort(key=lambda c: (c[0], c[1]))
    (line, col), _, field_path, what, fix = candidates[0]
    more = len(candidates) - 1
    if more:
        fix = f"{fix} ({more} more problem{'s' if more > 1 else ''} after this one)"
    return SpecError(what, file=file, line=line, col=col, field=format_field(field_path) or None, fix=fix)


# ------------------------------------------------------------------------------------------------ load

_RELATIVE_PATH_FIELDS: tuple[tuple[str, str], ...] = (
    ("model", "path"),
    ("model", "config"),
    ("model", "tokenizer"),
)


def _shown(text: str, limit: int = 60) -> str:
    """A path as an error line shows it: its first `limit` characters, never a 4 KB wall."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def path_problem(value: str) -> tuple[str, str] | None:
    """(what is wrong, fix) when no filesystem could open `value` as written, else None."""
    if "\x00" in value:
        return f"the path {_shown(value)} holds a NUL byte", "remove it: no file name can contain one"
    encoded = os.fsencode(value)
    longest = max((len(part) for part in encoded.split(b"/")), default=0)
    if longest > MAX_NAME_BYTES:
        return (f"the path {_shown(value)} has a name of {longest} bytes; a file name is at most {MAX_NAME_BYTES}",
                "shorten that name (or fix a missing '/')")
    if len(encoded) > MAX_PATH_BYTES:
        return (f"the path {_shown(value)} is {len(encoded)} bytes long; a path is at most {MAX_PATH_BYTES}",
                "use a shorter path (a folder closer to the root, or a symlink to it)")
    return None


def _anchor_paths(loaded: LoadedSpec, base: Path) -> None:
    """Resolve the spec's relative paths against the spec file's folder; refuse, at the field, a path no
    filesystem could open (NUL byte, an overlong name) or a `~user` whose user does not exist."""
    spec = loaded.spec

    def anchored(field_path: FieldPath, value: Path | None) -> Path | None:
        if value is None:
            return None
        problem = path_problem(str(value))
        if problem:
            raise loaded.error(field_path, *problem)
        try:
            value = value.expanduser()
        except RuntimeError:  # pathlib: "Could not determine home directory." for ~nosuchuser
            user = str(value).split("/", 1)[0]
            raise loaded.error(field_path, f"{user} names no user of this machine, so {_shown(str(value))} cannot be "
                               "found", f"write the folder's full path instead of {user}/...") from None
        if value.is_absolute():  # kept as written (its last name may name the artifact)
            loaded.written_paths[field_path] = Path(os.path.normpath(value))
            return value
        value = base / value
        problem = path_problem(str(value))
        if problem:
            raise loaded.error(field_path, *problem)
        loaded.written_paths[field_path] = Path(os.path.normpath(value))
        try:
            return value.resolve()
        except OSError as exc:  # ELOOP (a symlink loop), ENAMETOOLONG once links are followed
            raise loaded.error(field_path, f"cannot resolve {_shown(str(value))}: {exc.strerror}",
                               "give a path that exists without a symlink loop") from None

    for section, name in _RELATIVE_PATH_FIELDS:
        holder = getattr(spec, section)
        setattr(holder, name, anchored((section, name), getattr(holder, name)))
    calibration = spec.quantization.calibration
    calibration.dataset = anchored(("quantization", "calibration", "dataset"), calibration.dataset)


def load_spec(path: Path | str) -> LoadedSpec:
    """Read, parse and validate a build spec. Raises one positioned SpecError (exit code 2) on any problem."""
    display = str(path)
    problem = path_problem(display)
    if problem:
        raise SpecError(problem[0], file=_shown(display), line=1, col=1, fix=problem[1])
    path = Path(path)
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)  # never more: a device or a huge file is refused below
    except FileNotFoundError:
        raise SpecError(
            "spec file does not exist", file=display, line=1, col=1, fix="check the path (see build_configs/examples/)"
        ) from None
    except IsADirectoryError:
        raise SpecError("is a directory, not a spec file", file=display, line=1, col=1, fix="pass the YAML file") from None
    except OSError as exc:
        fix = ("use a shorter path" if exc.errno == errno.ENAMETOOLONG else
               "give a path whose folders exist" if exc.errno in (errno.ENOTDIR, errno.ELOOP) else
               "check the file's permissions")
        raise SpecError(f"cannot read the spec: {exc.strerror}", file=display, line=1, col=1, fix=fix) from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(
            f"the spec is larger than {MAX_SPEC_BYTES // 1024} KiB; a build spec is a small hand-written file",
            file=display, line=1, col=1, fix="give the build spec YAML, not another file",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise SpecError("spec is not UTF-8 text", file=display, line=line, col=1, fix="save the file as UTF-8") from None
    data, positions = parse_yaml(text, display)
    if data is None:
        raise SpecError(
            "spec file is empty",
            file=display,
            line=1,
            col=1,
            fix="write at least a `model:` section (see build_configs/examples/tiny-cpu.yaml)",
        )
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a {type(data).__name__} value"
        raise SpecError(
            f"the top level is {kind}, not a mapping of sections",
            file=display,
            line=1,
            col=1,
            fix="write sections as `model:`, `target:`, `limits:` ... at the start of lines",
        )
    bad_keys = [k for k in data if not isinstance(k, str)]
    if bad_keys:
        raise SpecError(
            f"key {bad_keys[0]!r} is not text", file=display, line=1, col=1, fix="section names are words like `model`"
        )
    upgraded = spec_shape.upgrade(data, positions, display)
    written_as: dict[FieldPath, FieldPath] = {}
    if upgraded is not None:
        data, positions, written_as = upgraded.data, upgraded.positions, upgraded.written_as
    try:
        spec = BuildSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, data, positions, display, written_as) from None
    loaded = LoadedSpec(spec=spec, path=path.resolve(), display_path=display, positions=positions,
                        written_as=written_as, shape_note=upgraded.note(display) if upgraded is not None else None)
    try:
        _anchor_paths(loaded, path.resolve().parent)
    except ValidationError as exc:  # validate_assignment re-checks a resolved path
        raise spec_error_from_validation(exc, data, positions, display, written_as) from None
    return loaded
