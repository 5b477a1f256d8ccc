"""Content-addressed objects: `objects/sha256/ab/cdef...`, each file stored once.

Entries hold hard links to objects, so an object with a link count of 1 is referenced by no
entry and no running build: that is what garbage collection removes. Where a hard link is
impossible (a filesystem without them), the entry keeps its own copy and its manifest says so.
Objects are made read-only so a stray write through a link cannot corrupt a stored artifact.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Literal

READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH

Placement = Literal["linked", "copied"]


def sha256_file(path: Path) -> str:
    """sha256 of a file (hashlib.file_digest: C-level reads, measured as fast as large manual reads)."""
    with open(path, "rb") as handle:
        if hasattr(hashlib, "file_digest"):  # Python >= 3.11
            return hashlib.file_digest(handle, "sha256").hexdigest()
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(block)
        return digest.hexdigest()


def _is_hex_digest(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


class ObjectStore:
    """The `objects/` folder of a store."""

    def __init__(self, root: Path) -> None:
        self.root = root  # <store>/objects

    def path_for(self, digest: str) -> Path:
        if not _is_hex_digest(digest):
            raise ValueError(f"not a sha256 hex digest: {digest!r}")
        return self.root / "sha256" / digest[:2] / digest[2:]

    def iter_objects(self):
        """Yield (digest, path) of every stored object."""
        base = self.root / "sha256"
        if not base.is_dir():
            return
        for shard in sorted(base.iterdir()):
            if not shard.is_dir() or len(shard.name) != 2:
                continue
            for obj in sorted(shard.iterdir()):
                if obj.name.startswith(".tmp-"):
                    continue
                digest = shard.name + obj.name
                if _is_hex_digest(digest):
                    yield digest, obj

    def adopt(self, file: Path, digest: str, size: int) -> Placement:
        """Make `file` (already hashed to `digest`) share storage with the object of that digest.

        If the object exists, `file` is replaced by a hard link to it; otherwise the object is
        created as a hard link to `file`. Returns "copied" when hard links are not possible.
        """
        obj = self.path_for(digest)
        if obj.exists():
            try:
                if os.path.samefile(file, obj):
                    return "linked"
                if obj.stat().st_size != size:
                    # The stored object is damaged (size is cheap to check): replace it below.
                    self.discard(digest)
                else:
                    return self._link_object_over(obj, file)
            except FileNotFoundError:
                pass  # removed meanwhile (gc or quarantine): create it again
        obj.parent.mkdir(parents=True, exist_ok=True)
        staging = obj.parent / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            os.link(file, staging)
        except OSError:
            return "copied"  # no hard links here: the entry keeps its own copy, no object needed
        os.chmod(staging, READ_ONLY)
        os.replace(staging, obj)  # a concurrent creator of the same digest wrote the same bytes
        return "linked"

    def _link_object_over(self, obj: Path, file: Path) -> Placement:
        staging = file.with_name(f".tmp-link-{uuid.uuid4().hex[:8]}")
        try:
            os.link(obj, staging)
        except OSError:
            return "copied"
        os.replace(staging, file)
        return "linked"

    def discard(self, digest: str, *, into: Path | None = None) -> bool:
        """Remove (or move into `into`) the object of `digest`; True if there was one."""
        obj = self.path_for(digest)
        try:
            if into is not None:
                into.mkdir(parents=True, exist_ok=True)
                os.replace(obj, into / digest)
            else:
                obj.unlink()
            return True
        except FileNotFoundError:
            return False

    def verify(self, digest: str) -> bool:
        """Re-hash one object; True when its content still matches its name."""
        return sha256_file(self.path_for(digest)) == digest


def copy_file(src: Path, dst: Path) -> None:
    """Copy bytes (used only where a hard link fails)."""
    shutil.copyfile(src, dst)
