"""The build spec's earlier shape, and how a spec written in it loads today.

Until issue 24 a spec had sections named for one backend (`engine:`, `triton:`) and `backend:` was a name. Today
the limits and runtime knobs have backend-neutral sections and what only one backend reads lives in its own
`backend:` section (trtpipe.backend_options). A spec in the earlier shape still loads: `upgrade` moves each of its
fields to today's place (MOVES), keeps the YAML positions of what it moved, and says so in one line; an error
about a moved field names the field as the user wrote it. A setting written in both places is refused.

Settings the earlier shape let every backend write but that the spec's backend has no place for (llm-api has no
plugins, no engine build timeout and no inflight_batcher_llm Triton options) are dropped when they hold their
default (the earlier shape accepted them there and they changed nothing); `engine.timeout` is dropped for such a
backend whatever it holds (no trtllm-build runs: it bounded nothing). Any other such setting is refused at its
position, saying why the backend has no place for it (as the earlier shape refused it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from trtpipe.backend_options import EngineBackendOptions
from trtpipe.errors import SpecError
from trtpipe.spec import target_default_backend
from trtpipe.toolchain import BACKEND_CLASSES

FieldPath = tuple[str | int, ...]
Position = tuple[int, int]

# Earlier place -> today's place, for every field of the earlier sections.
MOVES: dict[FieldPath, FieldPath] = {
    ("engine", "max_batch_size"): ("limits", "max_batch_size"),
    ("engine", "max_input_len"): ("limits", "max_input_len"),
    ("engine", "max_seq_len"): ("limits", "max_seq_len"),
    ("engine", "max_num_tokens"): ("limits", "max_num_tokens"),
    ("engine", "max_beam_width"): ("limits", "max_beam_width"),
    ("engine", "tokens_per_block"): ("limits", "tokens_per_block"),
    ("engine", "profile"): ("limits", "profile"),
    ("engine", "plugins"): ("backend", "plugins"),
    ("engine", "timeout"): ("backend", "build_timeout"),
    ("engine", "conversion_timeout"): ("backend", "conversion_timeout"),
    ("triton", "streaming"): ("runtime", "streaming"),
    ("triton", "kv_cache_free_gpu_mem_fraction"): ("runtime", "kv_cache_free_fraction"),
    ("triton", "batch_scheduler_policy"): ("runtime", "scheduler_policy"),
    ("triton", "enable_chunked_context"): ("runtime", "chunked_prefill"),
    ("triton", "enable_kv_cache_reuse"): ("runtime", "kv_cache_reuse"),
    ("triton", "max_batch_size"): ("backend", "triton", "max_batch_size"),
    ("triton", "max_queue_delay_microseconds"): ("backend", "triton", "max_queue_delay_microseconds"),
    ("triton", "tensorrt_llm_instance_count"): ("backend", "triton", "tensorrt_llm_instance_count"),
    ("triton", "preprocessing_instance_count"): ("backend", "triton", "preprocessing_instance_count"),
    ("triton", "postprocessing_instance_count"): ("backend", "triton", "postprocessing_instance_count"),
}
# Where a key of an earlier section that is none of its fields (a typo) goes, to be refused with its neighbours.
UNKNOWN_KEYS_GO_TO = {"engine": ("limits",), "triton": ("runtime",)}
EARLIER_SECTIONS = tuple(UNKNOWN_KEYS_GO_TO)
BACKEND_NAME = ("backend",)
BACKEND_KIND = ("backend", "kind")
# Dropped for a backend that has no place for it, whatever it holds (see the module doc).
UNUSED_ELSEWHERE = {("backend", "build_timeout")}


def dotted(path: FieldPath) -> str:
    return ".".join(str(p) for p in path)


def earlier_keys(section: str) -> list[str]:
    """The field names the earlier section `section` had."""
    return [str(old[1]) for old in MOVES if old[0] == section]


@dataclass
class Upgraded:
    """A spec's data in today's shape, its positions under today's paths, and what was moved from where."""

    data: dict[str, Any]
    positions: dict[FieldPath, Position]
    # today's path -> the path the user wrote (for every moved key, and the keys under it)
    written_as: dict[FieldPath, FieldPath] = field(default_factory=dict)
    dropped: list[FieldPath] = field(default_factory=list)

    def note(self, file: str) -> str:
        """The one line a build prints about a spec in the earlier shape."""
        moved = sorted({(old, new) for new, old in self.written_as.items() if is_move(old, new)},
                       key=lambda pair: self.positions.get(pair[1], (0, 0)))
        parts = [f"{dotted(old)} -> {dotted(new)}" for old, new in moved]
        parts += [f"{dotted(old)} dropped (unused by this backend)" for old in self.dropped]
        return (f"{file} is written in the earlier spec shape; it loads as: {', '.join(parts)} "
                "(trtpipe migrate SPEC prints the mapping)")


def is_move(old: FieldPath, new: FieldPath) -> bool:
    return old in MOVES and MOVES[old] == new or (old == BACKEND_NAME and new == BACKEND_KIND)


def shown_path(path: FieldPath, written_as: dict[FieldPath, FieldPath]) -> FieldPath:
    """`path` as the user wrote it: its longest moved prefix replaced by where it was written."""
    for cut in range(len(path), 0, -1):
        earlier = written_as.get(path[:cut])
        if earlier is not None:
            return earlier + path[cut:]
    return path


def in_earlier_names(text: str, written_as: dict[FieldPath, FieldPath]) -> str:
    """`text` with today's dotted field names replaced by their earlier names, for the earlier sections the user
    wrote (a spec with an `engine:` section reads of engine.max_seq_len, written or not)."""
    sections = {old[0] for old in written_as.values()}
    names = {dotted(new): dotted(old) for old, new in MOVES.items() if old[0] in sections}
    names |= {dotted(new): dotted(old) for new, old in written_as.items() if is_move(old, new)}
    if not names:
        return text
    pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                         + r")(?![\w])")
    return pattern.sub(lambda m: names[m.group(1)], text)


def _default_at(path: FieldPath) -> Any:
    """The default of a backend-section field `path` (('backend', 'triton', 'x')) on an engine backend."""
    model: type[BaseModel] = EngineBackendOptions
    for part in path[1:-1]:
        annotation = model.model_fields[str(part)].annotation
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        model = annotation
    return model.model_fields[str(path[-1])].get_default(call_default_factory=True)


def _backend_kind(data: dict[str, Any]) -> Any:
    backend = data.get("backend")
    if isinstance(backend, dict):
        if "kind" in backend:
            return backend["kind"]
    elif backend is not None:
        return backend
    return target_default_backend(data)


def drops(new: FieldPath, value: Any) -> bool:
    """Whether a backend-section field `new` moved from the earlier shape is dropped for a backend that has no place
    for it (the module doc): it bounded nothing there, or it holds its default."""
    return new in UNUSED_ELSEWHERE or value == _default_at(new)


def is_earlier_shape(data: dict[str, Any]) -> bool:
    return any(isinstance(data.get(s), dict) for s in EARLIER_SECTIONS) or isinstance(data.get("backend"), str)


def upgrade(data: dict[str, Any], positions: dict[FieldPath, Position], file: str) -> Upgraded | None:
    """`data` moved to today's shape (None: it is in today's shape already). Raises a positioned SpecError for a
    setting written both in its earlier and its present place."""
    if not is_earlier_shape(data):
        return None
    out = {k: v for k, v in data.items() if not (k in EARLIER_SECTIONS and isinstance(v, dict))}
    new_positions = {p: at for p, at in positions.items()
                     if not (p and p[0] in EARLIER_SECTIONS and isinstance(data.get(p[0]), dict))}
    upgraded = Upgraded(out, new_positions)
    kind = _backend_kind(data)
    if isinstance(data.get("backend"), str):
        out["backend"] = {"kind": data["backend"]}
        upgraded.written_as[BACKEND_KIND] = BACKEND_NAME
        if BACKEND_NAME in positions:
            new_positions[BACKEND_KIND] = positions[BACKEND_NAME]
    known = BACKEND_CLASSES.get(kind) if isinstance(kind, str) else None  # the spec's own check names a bad one
    options = known.options if known is not None else None
    for section in EARLIER_SECTIONS:
        values = data.get(section)
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            old: FieldPath = (section, key)
            new = MOVES.get(old, UNKNOWN_KEYS_GO_TO[section] + (key,))
            if new[0] == "backend" and options is not None and new[1] not in options.model_fields:
                if drops(new, value):
                    upgraded.dropped.append(old)
                    continue
                what, fix = not_offered_line(str(kind), str(new[1]), dotted(old), value) or (
                    f"{dotted(old)} has no place with backend {kind}", f"remove {dotted(old)}")
                where = positions.get(old, (1, 1))
                raise SpecError(what, file=file, line=where[0], col=where[1], field=dotted(old), fix=fix)
            holder = out
            for part in new[:-1]:
                existing = holder.get(part)
                if existing is None:
                    existing = holder[part] = {}
                    prefix = new[:new.index(part) + 1]
                    if prefix != BACKEND_NAME:  # the backend section holds more than what came from here
                        upgraded.written_as.setdefault(prefix, (section,))
                    if (section,) in positions:
                        new_positions.setdefault(prefix, positions[(section,)])
                elif not isinstance(existing, dict):
                    break
                holder = existing
            else:
                if new[-1] in holder:
                    where = positions.get(old, (1, 1))
                    raise SpecError(
                        f"{dotted(old)} is written twice: here, in the earlier spec shape, and as {dotted(new)}",
                        file=file, line=where[0], col=where[1], field=dotted(old),
                        fix=f"keep only {dotted(new)}")
                holder[new[-1]] = value
            upgraded.written_as[new] = old
            for path, at in positions.items():
                if path[:2] == old:
                    new_positions[new + path[2:]] = at
    return upgraded


def not_offered_line(kind: str, field_name: str, shown_field: str, value: Any) -> tuple[str, str] | None:
    """(what, fix) when the backend `kind` has no place for the field `field_name` of another backend's section."""
    known = BACKEND_CLASSES.get(kind) if isinstance(kind, str) else None  # the spec's own check names a bad one
    options = known.options if known is not None else None
    why = options.not_offered.get(field_name) if options is not None else None
    if why is None:
        return None
    others = [k for k, cls in BACKEND_CLASSES.items() if field_name in cls.options.model_fields]
    shown_value = repr(value) if len(repr(value)) <= 60 else type(value).__name__
    return (f"{shown_field} = {shown_value} has no equivalent with backend {kind}: {why}",
            f"remove {shown_field} (or use backend {' or '.join(others)})")


def mapping() -> list[tuple[str, str]]:
    """(earlier field, today's field) for every move, as `trtpipe migrate` prints them."""
    return [(dotted(BACKEND_NAME), dotted(BACKEND_KIND))] + [(dotted(o), dotted(n)) for o, n in MOVES.items()]
