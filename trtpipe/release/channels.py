"""Channel pointers: `<home>/channels/<model>/<target>/<channel>.json`, each naming one artifact digest.

A pointer file holds the current `digest` and the stack of earlier ones (`history`, newest last) that
`rollback` returns to. `pins()` names every one of them: what the store's gc and verify must keep
(the store is handed the pins; it never reads these files). Writes are atomic (temp file + os.replace) and happen
under one release lock (`channels/.lock`), which promote and rollback hold across their
compare-and-swap and the audit append.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtpipe.atomic import write_text_atomically
from trtpipe.errors import IntegrityError, TimedOut
from trtpipe.names import check_name  # the one plain-name rule: the spec is checked against it too

LOCK_TIMEOUT_S = 60.0
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


class ChannelScope(BaseModel):
    """Channels are per model and per target (a prod for h100 is not a prod for l40s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    target: str

    def __str__(self) -> str:
        return f"{self.model}/{self.target}"


class PointerTarget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    digest: str
    ref: str | None = None  # where the artifact lives: "engine/<key>" locally, or a pinned oci:// ref
    set_at: str
    set_by: str


class ChannelPointer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    channel: str
    model: str
    target: str
    digest: str
    ref: str | None = None
    set_at: str
    set_by: str
    history: list[PointerTarget] = Field(default_factory=list)

    @property
    def scope(self) -> ChannelScope:
        return ChannelScope(model=self.model, target=self.target)

    @property
    def previous(self) -> PointerTarget | None:
        return self.history[-1] if self.history else None


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class ChannelStore:
    """Reads and atomically replaces channel pointer files under `<home>/channels/`."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.root = self.home / "channels"

    @contextmanager
    def lock(self) -> Iterator[None]:
        """The release lock: held across a channel's compare-and-swap, its write and its audit record."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self.root / ".lock"), timeout=LOCK_TIMEOUT_S)
        try:
            lock.acquire()
        except Timeout:
            raise TimedOut(
                f"another promotion or rollback has held {self.root / '.lock'} for {LOCK_TIMEOUT_S:g} s",
                operation="waiting for the release lock", seconds=LOCK_TIMEOUT_S,
                fix="wait for it to finish and try again",
            ) from None
        try:
            yield
        finally:
            lock.release()

    def path(self, scope: ChannelScope, channel: str) -> Path:
        return self.root / check_name("model", scope.model) / check_name("target", scope.target) / f"{check_name('channel', channel)}.json"

    def get(self, scope: ChannelScope, channel: str) -> ChannelPointer | None:
        return self._read(self.path(scope, channel))

    def _read(self, path: Path) -> ChannelPointer | None:
        if not path.is_file():
            return None
        try:
            return ChannelPointer.model_validate_json(path.read_text(encoding="utf-8"))
        except (ValidationError, ValueError):
            raise IntegrityError(
                f"{path}: channel pointer is corrupt", path=str(path),
                fix="restore it from the audit trail, or remove it and promote again",
            ) from None

    def write(self, pointer: ChannelPointer) -> Path:
        """Atomically replace the pointer file (the caller holds `lock()`)."""
        path = self.path(pointer.scope, pointer.channel)
        write_text_atomically(path, pointer.model_dump_json(indent=2) + "\n")
        return path

    def all(self) -> list[ChannelPointer]:
        """Every pointer under `channels/`. Anything there that is not a readable, valid pointer file in
        its place (`<model>/<target>/<channel>.json`) is an error naming it, never skipped: whoever asks
        (gc, verify, rm) must not mistake an unreadable pin for no pin."""
        out = [self._read_pinned(path) for path in self._pointer_files()]
        return sorted(out, key=lambda p: (p.model, p.target, p.channel))

    def _pointer_files(self) -> list[Path]:
        """The pointer files, walked strictly: hidden names (the release lock, atomic writes' temp files)
        are skipped; a folder that cannot be listed, a symlink, a file out of place or a non-file where a
        pointer belongs is an IntegrityError naming it."""
        if not os.path.lexists(self.root):
            return []
        found: list[Path] = []

        def walk(folder: Path, depth: int) -> None:
            try:
                children = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError as err:
                raise self._unusable(folder, f"cannot be listed ({err.strerror or err})") from None
            for child in children:
                if child.name.startswith("."):
                    continue
                path = Path(child.path)
                if child.is_symlink():
                    raise self._unusable(path, "is a symlink, not a channel folder or pointer file")
                if depth < 2:
                    if not child.is_dir(follow_symlinks=False):
                        raise self._unusable(path, f"is a file where a {('model', 'target')[depth]} folder belongs "
                                                   f"(pointers live at <model>/<target>/<channel>.json)")
                    walk(path, depth + 1)
                elif child.is_file(follow_symlinks=False) and child.name.endswith(".json"):
                    found.append(path)
                else:
                    raise self._unusable(path, "is not a <channel>.json pointer file "
                                               "(pointers live at <model>/<target>/<channel>.json)")

        if not self.root.is_dir():
            raise self._unusable(self.root, "is not a folder")
        walk(self.root, 0)
        return found

    def _unusable(self, path: Path, why: str) -> IntegrityError:
        return IntegrityError(
            f"{path}: {why}; cannot tell what it pins, so nothing was changed",
            path=str(path), fix="move it out of the channels folder, or restore it from the audit trail",
        )

    def _read_pinned(self, path: Path) -> ChannelPointer:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise self._unusable(path, f"cannot be read ({err.strerror or err})") from None
        except ValueError:
            raise self._unusable(path, "is not UTF-8 text") from None
        try:
            pointer = ChannelPointer.model_validate_json(text)
        except (ValidationError, ValueError):
            raise IntegrityError(
                f"{path}: channel pointer is corrupt; cannot tell what it pins, so nothing was changed", path=str(path),
                fix="restore it from the audit trail, or remove it and promote again",
            ) from None
        for digest in (pointer.digest, *(h.digest for h in pointer.history)):
            if not _DIGEST_RE.fullmatch(digest):
                raise IntegrityError(
                    f"{path}: channel pointer names {digest[:80]!r}, which is not an artifact digest; "
                    "cannot tell what it pins, so nothing was changed", path=str(path),
                    fix="restore it from the audit trail, or remove it and promote again",
                )
        return pointer

    def find(self, channel: str, *, model: str | None = None, target: str | None = None) -> list[ChannelPointer]:
        return [
            p
            for p in self.all()
            if p.channel == channel and (model is None or p.model == model) and (target is None or p.target == target)
        ]

    def pins(self) -> dict[str, list[str]]:
        """Every digest a channel holds or can roll back to (what gc must keep) -> the channels naming it,
        as `model/target/channel`. A corrupt pointer file is an error, never "pins nothing"."""
        out: dict[str, list[str]] = {}
        for pointer in self.all():
            label = f"{pointer.model}/{pointer.target}/{pointer.channel}"
            for digest in dict.fromkeys([pointer.digest, *(h.digest for h in pointer.history)]):
                out.setdefault(digest, []).append(label)
        return out
