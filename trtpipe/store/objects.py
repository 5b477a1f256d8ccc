"""Content-addressed objects: `objects/sha256/ab/cdef...`, each file stored once.

Entries hold hard links to objects, so an object with a link count of 1 is referenced by no
entry and no running build: that is what garbage collection removes. Where a hard link is
impossible (a filesystem without them), the entry keeps its own copy.
Objects are read-only (0444), so a stray write by a non-root user through a link fails; and an
object is only ever linked into an entry once its bytes are established to equal the entry's file.
"""

from __future__ import annotations

import hashlib
import os
import stat
import uuid
from collections.abc import Callable
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

    def __init__(self, root: Path, quarantine_dir: Path | None = None) -> None:
        self.root = root  # <store>/objects
        self.quarantine_dir = quarantine_dir  # <store>/quarantine/objects
        self.corrupt: list[str] = []  # digests of objects `adopt` found corrupt and moved aside

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

    def adopt(self, file: Path, digest: str, size: int, *, known: Callable[[Path], str | None] | None = None,
              on_relink: Callable[[os.stat_result, os.stat_result], object] | None = None) -> Placement:
        """Make `file` (already hashed to `digest` by the caller) share storage with the object of that digest.

        If the object exists, `file` is replaced by a hard link to it, but only once the object's
        bytes are established to equal the file's: same inode, or `known(object)` (the digest
        cache) vouching for it, or a byte-for-byte comparison. An object whose bytes differ from
        its name is corrupt, whoever wrote it: it is moved to quarantine (`self.corrupt` names it)
        and the object is made from `file` instead. Without an object, it is created as a hard link
        to `file`. Returns "copied" when hard links are not possible here. `on_relink(before, after)`: the
        stored object's stat around our linking another path to it (its ctime moves; see the digest cache).
        """
        obj = self.path_for(digest)
        if obj.exists():
            try:
                if os.path.samefile(file, obj):
                    return "linked"
                if obj.stat().st_size == size and (
                    (known is not None and known(obj) == digest) or _same_bytes(obj, file)
                ):
                    before = os.stat(obj)
                    placed = self._link_object_over(obj, file)
                    if on_relink is not None:
                        on_relink(before, os.stat(obj))
                    return placed
                # Its bytes are not what its name says: never link anything onto it.
                self.quarantine_object(digest)
                self.corrupt.append(digest)
            except FileNotFoundError:
                pass  # removed meanwhile (gc or quarantine): create it again
        obj.parent.mkdir(parents=True, exist_ok=True)
        staging = obj.parent / f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            os.link(file, staging)
        except OSError:
            return "copied"  # no hard links here: the entry keeps its own copy, no object needed
        os.chmod(staging, READ_ONLY)
        # A concurrent creator of the same digest hashed its own file to it (as our caller did).
        os.replace(staging, obj)
        return "linked"

    def _link_object_over(self, obj: Path, file: Path) -> Placement:
        staging = file.with_name(f".tmp-link-{uuid.uuid4().hex[:8]}")
        try:
            os.link(obj, staging)
        except OSError:
            return "copied"
        os.replace(staging, file)
        return "linked"

    def quarantine_object(self, digest: str) -> Path | None:
        """Move the object of `digest` into `<store>/quarantine/objects/` (kept for inspection, gc removes it)."""
        if self.quarantine_dir is None:
            self.discard(digest)
            return None
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        target = self.quarantine_dir / digest
        if target.exists():
            target = self.quarantine_dir / f"{digest}.{uuid.uuid4().hex[:8]}"
        try:
            os.replace(self.path_for(digest), target)
        except FileNotFoundError:
            return None
        return target

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


def _same_bytes(a: Path, b: Path, block: int = 1024 * 1024) -> bool:
    """True when both files hold exactly the same bytes (read side by side, stops at the first difference)."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            left, right = fa.read(block), fb.read(block)
            if left != right:
                return False
            if not left:
                return True
