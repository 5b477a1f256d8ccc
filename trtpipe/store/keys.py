"""Stage keys: a hash of the document that names exactly the inputs a stage's output depends on.

A stage declares its key document (trtpipe.stages: what enters it and why is the stage's business);
the store hashes it: the key is the sha256 of the canonical JSON of {key_schema, kind, **document}.
Two builds share a key exactly when their stages declared the same document. No path, time or host
name ever enters a key: files enter by their content digest only, and `canonical_json` refuses what
JSON cannot say exactly. This module knows no stage, no model and no quantization.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

# Bump when the meaning of a key document changes: every old entry then simply misses.
KEY_SCHEMA = 2


class StageKey(BaseModel):
    """A stage key and the document that was hashed to make it (stored in the entry manifest)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    key: str
    inputs: dict[str, Any]

    def __str__(self) -> str:
        return self.key


def _check_json(value: Any, where: str = "$") -> None:
    """Refuse values whose JSON form is not canonical (floats that are not finite, odd types)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: non-finite float {value!r} cannot enter a key")
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where}: key {k!r} is not a string")
            _check_json(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_json(v, f"{where}[{i}]")
    elif not isinstance(value, (str, int, float, bool)) and value is not None:
        raise ValueError(f"{where}: {type(value).__name__} cannot enter a key; convert it to JSON first")


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8."""
    _check_json(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def hash_document(document: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(document)).hexdigest()


def make_key(kind: str, document: dict[str, Any]) -> StageKey:
    """The key of a stage's declared document (the stored manifest keeps the whole hashed document)."""
    hashed = {"key_schema": KEY_SCHEMA, "kind": kind, **document}
    return StageKey(kind=kind, key=hash_document(hashed), inputs=hashed)


def tree_digest(file_digests: Mapping[str, str]) -> str:
    """One digest for a set of files given as {relative name: sha256} (e.g. a tokenizer directory)."""
    return hash_document({"files": dict(sorted(file_digests.items()))})
