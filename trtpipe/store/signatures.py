"""What the local store knows about an artifact's signatures and where it came from, by artifact digest.

`<store>/signatures/<hex of the artifact digest>.json`:
    {"digest": "sha256:...", "kind": ..., "key": ...,
     "pulled_from": "oci://HOST/REPO@sha256:..." or null,   # set when the entry came from a registry
     "bundles": [{"bundle": "<model-signing bundle JSON>", "claimed_key_id": "..."}],
     "provenance": "<DSSE envelope JSON>" or null}

Beside the entry, never in it (a stored entry is never modified, and a signature is not part of what it
is). The store only keeps these; it judges nothing: `trtpipe.release.trust` verifies a bundle against the
entry's files and a trust policy every time it matters (serve, promote, build), so a record is a
cache of signatures, never itself evidence. That a record names `pulled_from` is what tells a build that
an entry came from elsewhere; one written by an attacker with write access to the store proves nothing,
which is why the bundles are verified, not the record believed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtpipe.atomic import write_text_atomically

MAX_BUNDLES = 16


def _path(root: Path, digest: str) -> Path:
    hexpart = digest.removeprefix("sha256:")
    if len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return Path(root) / "signatures" / f"{hexpart}.json"


def read_record(root: Path, digest: str) -> dict[str, Any] | None:
    """The record of `digest`, or None (none, or unreadable: then nothing is known about it)."""
    path = _path(root, digest)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("digest") != digest:
        return None
    if not isinstance(data.get("bundles"), list):
        data["bundles"] = []
    return data


def update_record(root: Path, digest: str, *, kind: str, key: str, pulled_from: str | None = None,
                  bundles: list[dict[str, str]] = (), provenance: str | None = None) -> dict[str, Any]:
    """Merge what is new into the record of `digest` (bundles deduplicated; the first pull source kept)."""
    path = _path(root, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock  # loaded by writers only: a warm build reads records

    with FileLock(str(path) + ".lock", timeout=60):
        record = read_record(root, digest) or {"digest": digest, "kind": kind, "key": key, "pulled_from": None,
                                               "bundles": [], "provenance": None}
        if pulled_from and not record.get("pulled_from"):
            record["pulled_from"] = pulled_from
        known = {item.get("bundle") for item in record["bundles"] if isinstance(item, dict)}
        for item in bundles:
            if item.get("bundle") not in known and len(record["bundles"]) < MAX_BUNDLES:
                record["bundles"].append({"bundle": str(item["bundle"]), "claimed_key_id": str(item.get("claimed_key_id", ""))})
                known.add(item.get("bundle"))
        if provenance is not None:
            record["provenance"] = provenance
        write_text_atomically(path, json.dumps(record, indent=1, sort_keys=True) + "\n", mode=0o644)
    return record
