"""Channel pointers: what each channel (per model and target) names, as the trail replays it.

A channel's pointer holds the current `digest` and the stack of earlier ones (`history`, newest last) that
`rollback` returns to. `pins()` names every one of them: what the store's gc and verify must keep (the store
is handed the pins; it never reads the channels). The pointers are a projection of the trail, kept in one
state file (`channels/state.json`, `trtpipe.release.projection`) that is rebuilt whenever it is not what the
trail says: promote and rollback only append to the trail, under one release lock (`channels/.lock`) held
across their compare-and-swap and the append. The per-channel pointer files of older homes
(`channels/<model>/<target>/<channel>.json`) are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, Field

from trtpipe.errors import TimedOut
from trtpipe.names import check_name  # the one plain-name rule: the spec is checked against it too

if TYPE_CHECKING:
    from trtpipe.release.projection import ChannelState

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
    """The channels of a workspace, read from their projection of the trail (`trtpipe.release.projection`)."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.root = self.home / "channels"
        self._held = 0  # how deep this store holds the release lock (it then writes the state file itself)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """The release lock: held across a channel's compare-and-swap and its audit record. Let go normally, it
        first writes the state file as the trail now says (a failed write is left for the next read)."""
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
        self._held += 1
        try:
            yield
            self.state()  # the projection follows what was appended: written before the lock is let go
        finally:
            self._held -= 1
            lock.release()

    def state(self) -> ChannelState:
        """Every channel as the trails say now (the state file rebuilt when it is not that)."""
        from trtpipe.release.projection import current_state

        return current_state(self.home, self._save)

    def _save(self, state: ChannelState) -> None:
        """Write the rebuilt state file: under the release lock when this store holds it, else only if the lock
        is free (a promotion or rollback under way writes it when it is done). Best effort: a write that fails
        (a full disk, a read-only home) leaves a stale file, which the next read rebuilds."""
        from trtpipe.release.projection import state_path, write_state

        path = state_path(self.home)
        try:
            if self._held:
                write_state(path, state)
                return
            self.root.mkdir(parents=True, exist_ok=True)
            lock = FileLock(str(self.root / ".lock"), timeout=0)
            try:
                lock.acquire()
            except Timeout:
                return
            try:
                write_state(path, state)
            finally:
                lock.release()
        except OSError:
            return

    def get(self, scope: ChannelScope, channel: str) -> ChannelPointer | None:
        for what, name in (("model", scope.model), ("target", scope.target), ("channel", channel)):
            check_name(what, name)
        return next((p for p in self.all() if (p.model, p.target, p.channel) == (scope.model, scope.target, channel)), None)

    def all(self) -> list[ChannelPointer]:
        """Every channel, sorted by model, target and channel. A trail that cannot be read is an IntegrityError
        naming it, never "no channels": whoever asks (gc, verify, rm) must not mistake an unreadable pin for no pin."""
        return sorted(self.state().channels, key=lambda p: (p.model, p.target, p.channel))

    def find(self, channel: str, *, model: str | None = None, target: str | None = None) -> list[ChannelPointer]:
        return [
            p
            for p in self.all()
            if p.channel == channel and (model is None or p.model == model) and (target is None or p.target == target)
        ]

    def pins(self) -> dict[str, list[str]]:
        """Every digest a channel holds or can roll back to (what gc must keep) -> the channels naming it,
        as `model/target/channel`. An unreadable trail is an error, never "pins nothing"."""
        out: dict[str, list[str]] = {}
        for pointer in self.all():
            label = f"{pointer.model}/{pointer.target}/{pointer.channel}"
            for digest in dict.fromkeys([pointer.digest, *(h.digest for h in pointer.history)]):
                out.setdefault(digest, []).append(label)
        return out
