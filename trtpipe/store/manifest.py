"""An entry's manifest.json, read defensively, and the rules every stored file name and size obeys.

The store writes manifests itself, so one that does not parse, has a field of the wrong type, or is
not in canonical form was damaged (a truncated write by another tool, an edit, a bad disk): reading
it says why (`parse_manifest`) instead of raising, and the store treats the entry like any corrupt
one (quarantine, never a crash). A manifest of another `manifest_version` is outdated, not damaged.

File names (`entry_path_problem`): what stages write and what a pull may create, the same rule both
ways: relative POSIX paths of portable names ([A-Za-z0-9_] then [A-Za-z0-9._-]), no empty, dot or
dot-dot component, no NUL or other control byte, at most `MAX_PATH_DEPTH` components of at most 255
bytes and `MAX_PATH_CHARS` in all.

Declared sizes (`size_cap`): what a file of an entry kind can hold, so a pull refuses an absurd
declaration before downloading a byte. A weight file holds at most one GPU's share of a model, or a whole
model where the format is not sharded by GPU (Hugging Face's save_pretrained shards at 5 GB by default, but
an unsharded file may hold all of it): at most `MAX_RANK_FILE_BYTES` (256 GiB; the largest GPU in
build_configs/gpus.yaml has 180 GiB, a test holds the catalog to this cap). Which files of a kind hold
weights is not this module's to know: the stages that store each kind, and the repository layouts the
publish stage writes, declare theirs (`weight_files`), and trtpipe.stages.weight_file_rule hands them here
as one `WeightFiles`. Every other file is a config, a model.py, a template or a tokenizer file: at most
`MAX_OTHER_FILE_BYTES` (256 MiB; the largest tokenizer.json of the supported families is tens of MB). An
entry has at most `MAX_FILES` files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trtpipe.store.keys import canonical_json

MANIFEST = "manifest.json"
# Bump when the manifest's shape changes: entries of another version are misses (rebuilt), never errors.
MANIFEST_VERSION = 2
KINDS = ("checkpoint", "engine", "repository", "hf-checkpoint")
MODES = ("0644", "0755")

MAX_PATH_DEPTH = 16
MAX_PATH_CHARS = 1024
MAX_FILES = 10_000
MAX_RANK_FILE_BYTES = 256 * 2**30
MAX_OTHER_FILE_BYTES = 256 * 2**20

_COMPONENT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class WeightFiles:
    """Which files of each entry kind hold weights: kind -> one pattern over the entry-relative path."""

    patterns: Mapping[str, re.Pattern[str]]

    @classmethod
    def of(cls, declared: Mapping[str, Iterable[str]]) -> WeightFiles:
        """From each kind's declared regexes (its producers': a kind two layouts write has both)."""
        return cls({kind: re.compile("|".join(f"(?:{p})" for p in sorted(set(regexes))))
                    for kind, regexes in declared.items()})

    def holds_weights(self, kind: str, rel: str) -> bool:
        pattern = self.patterns.get(kind)
        return pattern is not None and pattern.fullmatch(rel) is not None


def entry_path_problem(rel: Any) -> str | None:
    """Why `rel` cannot name a file of a stored entry (None when it can)."""
    if not isinstance(rel, str):
        return f"the path is a {type(rel).__name__}, not a string"
    if not rel or len(rel) > MAX_PATH_CHARS:
        return f"the path is {len(rel)} characters long (1 to {MAX_PATH_CHARS})"
    parts = rel.split("/")
    if len(parts) > MAX_PATH_DEPTH:
        return f"the path is {len(parts)} folders deep (at most {MAX_PATH_DEPTH})"
    for part in parts:
        if not _COMPONENT_RE.fullmatch(part):
            return (f"the name {part!r} is not a portable file name (letters, digits, '_' first, "
                    "then letters, digits, '.', '_', '-'; at most 255)")
    if rel == MANIFEST:
        return f"{MANIFEST} is the store's own file"
    return None


def size_cap(kind: str, rel: str, weights: WeightFiles) -> int:
    """The largest size a file `rel` of a `kind` entry can have (see the module doc; `weights` says which files
    hold weights). Applied to what a pull is told before it downloads; what this machine's stages write is
    whatever they wrote."""
    return MAX_RANK_FILE_BYTES if weights.holds_weights(kind, rel) else MAX_OTHER_FILE_BYTES


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def file_item_problem(item: Any) -> str | None:
    """Why one `files` item of a current manifest is malformed (None when it is sound)."""
    if not isinstance(item, dict):
        return f"a files item is a {type(item).__name__}, not an object"
    if set(item) != {"path", "mode", "size", "sha256"}:
        return f"a files item has the fields {sorted(item)}, not mode, path, sha256, size"
    rel = item["path"]
    why = entry_path_problem(rel)
    if why is not None:
        return f"files item {str(rel)[:80]!r}: {why}"
    if item["mode"] not in MODES:
        return f"{rel}: mode {item['mode']!r} is not one of {', '.join(MODES)}"
    size = item["size"]
    if not _is_int(size) or size < 0:
        return f"{rel}: size {size!r} is not a byte count"
    if not isinstance(item["sha256"], str) or not _HEX64_RE.fullmatch(item["sha256"]):
        return f"{rel}: sha256 {str(item['sha256'])[:80]!r} is not 64 lowercase hex digits"
    return None


def manifest_problem(manifest: Any, raw: bytes, kind: str, key: str) -> str | None:
    """Why a parsed manifest of the current version cannot describe `kind/key` (None when it can)."""
    if not isinstance(manifest, dict):
        return f"a JSON {type(manifest).__name__}, not an object"
    expected = {"manifest_version", "kind", "key", "inputs", "files"}
    if set(manifest) != expected:
        return f"fields {sorted(manifest)}, not {sorted(expected)}"
    if (manifest["kind"], manifest["key"]) != (kind, key):
        return f"names {str(manifest['kind'])[:20]}/{str(manifest['key'])[:70]}, not the entry it is in"
    if not isinstance(manifest["inputs"], dict):
        return "inputs (the key document) are not an object"
    files = manifest["files"]
    if not isinstance(files, list):
        return f"files are {json.dumps(files)[:40]}, not a list"
    if len(files) > MAX_FILES:
        return f"lists {len(files)} files (at most {MAX_FILES})"
    seen: set[str] = set()
    for item in files:
        why = file_item_problem(item)
        if why is not None:
            return why
        if item["path"] in seen:
            return f"lists {item['path']} twice"
        seen.add(item["path"])
    if [item["path"] for item in files] != sorted(seen):
        return "files are not sorted by path"
    try:
        canonical = canonical_json(manifest)
    except ValueError as err:
        return f"holds a value JSON cannot say exactly ({err})"
    if canonical != raw:
        return "not in the store's canonical form (edited or rewritten by something else)"
    return None


def parse_manifest(raw: bytes, kind: str, key: str) -> tuple[dict[str, Any], str | None]:
    """(the manifest, why it is damaged or None: a phrase to follow "manifest.json: "). The manifest is always a dict (empty when the bytes are
    not a JSON object); one of another `manifest_version` is returned as it is, undamaged: it is outdated."""
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError):
        return {}, f"not JSON ({len(raw)} bytes; truncated or overwritten?)"
    if not isinstance(parsed, dict):
        return {}, f"a JSON {type(parsed).__name__}, not an object"
    version = parsed.get("manifest_version")
    if not _is_int(version):
        return parsed, "no manifest_version number"
    if version != MANIFEST_VERSION:
        return parsed, None
    why = manifest_problem(parsed, raw, kind, key)
    return parsed, why


def sound_files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The well-formed `files` items of a manifest (all of them for a sound current manifest; for an
    outdated one, whatever of its list is well formed): what sizes and listings may read safely."""
    files = manifest.get("files")
    if not isinstance(files, list):
        return []
    return [item for item in files if file_item_problem(item) is None]
