"""Locks of the store.

- Build lock (per kind/key, exclusive, `filelock`): held while a process builds, replaces or
  removes an entry. Concurrent builders of one key wait for the first, then reuse its result.
- Lease (per kind/key, shared `flock`): held by every running build that uses an entry (for
  example the checkpoint an engine is being built from). gc and `cache rm` take it exclusively
  without waiting, so an entry in use is never removed.
Both are kernel locks: a process killed with SIGKILL releases them at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from filelock import FileLock


class KeyLocks:
    """Build locks and leases under `<store>/locks/<kind>/<key>.{lock,lease}`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._locks: dict[tuple[str, str], FileLock] = {}

    def _file(self, kind: str, key: str, suffix: str) -> Path:
        folder = self.root / kind
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{key}.{suffix}"

    def build_lock(self, kind: str, key: str) -> FileLock:
        # One FileLock object per key and process keeps the lock re-entrant inside a process.
        lock = self._locks.get((kind, key))
        if lock is None:
            # filelock loads only when a build lock is taken: a warm build takes leases (flock) only.
            from filelock import FileLock

            lock = FileLock(str(self._file(kind, key, "lock")), thread_local=False)
            self._locks[(kind, key)] = lock
        return lock

    @contextlib.contextmanager
    def building(self, kind: str, key: str, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
        from filelock import Timeout

        lock = self.build_lock(kind, key)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if on_wait is not None:
                on_wait()
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

    @contextlib.contextmanager
    def try_exclusive(self, kind: str, key: str) -> Iterator[bool]:
        """Build lock + exclusive lease without waiting; yields False when someone holds either."""
        from filelock import Timeout

        lock = self.build_lock(kind, key)
        if lock.is_locked:  # this very process is building it (the lock is re-entrant in-process)
            yield False
            return
        try:
            lock.acquire(timeout=0)
        except Timeout:
            yield False
            return
        try:
            fd = os.open(self._file(kind, key, "lease"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield False
                    return
                yield True
            finally:
                os.close(fd)
        finally:
            lock.release()

    @contextlib.contextmanager
    def lease(self, kind: str, key: str) -> Iterator[None]:
        """A shared hold on an entry: gc will not remove it while this is held."""
        fd = os.open(self._file(kind, key, "lease"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def is_free(self, kind: str, key: str) -> bool:
        with self.try_exclusive(kind, key) as free:
            return free
