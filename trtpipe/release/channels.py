"""Channel pointers: `<home>/channels/<model>/<target>/<channel>.json`, each naming one artifact digest.

A pointer file holds the current `digest` and the stack of earlier ones (`history`, newest last) that
`rollback` returns to. `pins()` names every one of them: what the store's gc and verify must keep
(the store is handed the pins; it never reads these files). Writes are atomic (temp file + os.replace) and happen
under one release lock (`channels/.lock`), which promote and rollback hold across their
compare-and-swap and the audit append.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtpipe.atomic import write_text_atomically
from trtpipe.errors import IntegrityError, TimedOut, UsageError
from trtpipe.names import check_name  # the one plain-name rule: the spec is checked against it too

LOCK_TIMEOUT_S = 60.0


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
        if not self.root.is_dir():
            return []
        out = [p for p in (self._read(path) for path in sorted(self.root.glob("*/*/*.json"))) if p is not None]
        return sorted(out, key=lambda p: (p.model, p.target, p.channel))

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
