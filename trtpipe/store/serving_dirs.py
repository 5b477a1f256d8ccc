"""Serving directories: where `trtpipe serve` puts what Triton reads, outside every store entry.

    <store>/serving/<digest12>-<unique>/        one live server's model repository (removed when it stops)
    <store>/serving/<digest12>-<unique>.lock    held (flock) by the process that owns that server; holds the
                                                serve record {digest, token} (`write_serve_record`)
    <store>/serving/<digest12>-container/       for a server trtpipe does not own (`serve --print`, the
                                                Triton container): kept, and reused for the same digest

A directory whose lock nobody holds belonged to a server that is gone (killed, crashed): the next
`serve` and `cache gc` remove it. The kernel drops a flock when the last process holding it dies, so
no pid files; the server process inherits the lock (`lock_fd`), so a server that outlives the
`trtpipe serve` that started it still keeps its directory.
This module knows only the layout and the locks; `trtpipe.serving.serving_copy` fills the directories.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from trtpipe.store.readonly import remove_tree

SERVING = "serving"
LOCK_SUFFIX = ".lock"
KEPT_SUFFIX = "-container"


def serving_root(store_root: Path) -> Path:
    return Path(store_root) / SERVING


@dataclass
class ServingDirLease:
    """A serving directory and the lock that says its server is alive."""

    path: Path
    lock_path: Path | None = None
    _fd: int | None = field(default=None, repr=False)

    @property
    def lock_fd(self) -> int | None:
        """The locked descriptor: hand it to the server process so the lock lives as long as it does."""
        return self._fd

    def release(self) -> None:
        """Remove the directory, then drop the lock (a crash in between leaves a stale pair gc removes)."""
        remove_tree(self.path)
        if self.lock_path is not None:
            self.lock_path.unlink(missing_ok=True)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def new_serving_dir(base: Path, label: str) -> ServingDirLease:
    """A fresh, empty `base/<label>-<unique>/`, locked by this process until `release()`."""
    base.mkdir(parents=True, exist_ok=True)
    name = f"{label}-{uuid.uuid4().hex[:12]}"
    lock_path = base / f"{name}{LOCK_SUFFIX}"
    # Lock first, folder second: a folder without a lock beside it is never a live server's.
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    path = base / name
    path.mkdir()
    return ServingDirLease(path=path, lock_path=lock_path, _fd=fd)


def write_serve_record(lease: ServingDirLease, record: dict[str, str]) -> None:
    """Write `record` (the digest whose bytes this serve verified, and the serve's token) into the lease's lock
    file: it exists exactly as long as the lock is held, so a record nobody holds is never taken for a live serve."""
    import json

    if lease._fd is None:
        raise ValueError("the lease was released")
    body = json.dumps(record, sort_keys=True).encode()
    os.ftruncate(lease._fd, 0)
    os.pwrite(lease._fd, body, 0)


def live_serve_record(store_root: Path, token: str) -> dict[str, str] | None:
    """The record of the live serve (its lock held) in `store_root` whose token is `token`, else None."""
    import hmac
    import json

    base = serving_root(store_root)
    if not base.is_dir() or not token:
        return None
    for lock_path in sorted(base.glob(f"*{LOCK_SUFFIX}")):
        try:
            record = json.loads(lock_path.read_bytes() or b"{}")
        except (OSError, ValueError):
            continue
        if (isinstance(record, dict) and isinstance(record.get("token"), str)
                and hmac.compare_digest(record["token"], token) and not _lock_is_free(lock_path)):
            return {str(k): str(v) for k, v in record.items()}
    return None


def kept_serving_dir(base: Path, label: str) -> Path:
    """The path of the kept serving directory for `label` (`serve --print`, containers)."""
    return base / f"{label}{KEPT_SUFFIX}"


def _lock_is_free(lock_path: Path) -> bool:
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
    finally:
        os.close(fd)


def stale_serving_dirs(store_root: Path) -> list[Path]:
    """Serving directories (and lock files without a directory) whose server is gone."""
    base = serving_root(store_root)
    if not base.is_dir():
        return []
    stale: list[Path] = []
    for child in sorted(base.iterdir()):
        if child.name.endswith(LOCK_SUFFIX):
            if not child.with_name(child.name[: -len(LOCK_SUFFIX)]).exists() and _lock_is_free(child):
                stale.append(child)
            continue
        if child.name.endswith(KEPT_SUFFIX) or child.name.startswith("."):
            continue  # kept on purpose; or another serve's staging folder of a kept directory
        if _lock_is_free(child.with_name(child.name + LOCK_SUFFIX)):
            stale.append(child)
    return stale


def remove_stale(store_root: Path) -> list[Path]:
    """Remove what `stale_serving_dirs` finds; returns what was removed."""
    removed = []
    for path in stale_serving_dirs(store_root):
        if path.name.endswith(LOCK_SUFFIX):
            path.unlink(missing_ok=True)
        else:
            remove_tree(path)
            path.with_name(path.name + LOCK_SUFFIX).unlink(missing_ok=True)
        removed.append(path)
    return removed
