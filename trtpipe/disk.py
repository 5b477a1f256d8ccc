"""Disk full, told apart from other failures and said in one line: where, how much was written, how much is free.

A build writes through several libraries, and each says "no space" its own way: Python's OSError with ENOSPC
(or EDQUOT, a quota), safetensors' SafetensorError "... No space left on device (os error 28)", SQLite's
OperationalError "database or disk is full". SQLite can also fail to create its journal on a full disk with a
plain "disk I/O error"; that one counts as disk full only when the filesystem it writes to has less than
`LOW_SPACE_BYTES` free (else it is some other I/O error and is left alone). `disk_full` recognises them (on the
exception or its causes); `disk_full_error` turns one into a `DiskFull` naming the path, the bytes written
before the failure and the bytes free.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from trtpipe.errors import DiskFull

_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXTS = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122",
                   "database or disk is full")
# "disk I/O error" from SQLite is disk full only on a filesystem with less than this free.
LOW_SPACE_BYTES = 1024 * 1024


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def free_bytes(path: Path | str) -> int | None:
    """Bytes free (for an unprivileged writer) on the filesystem holding `path` or its nearest existing parent."""
    probe = Path(path)
    while True:
        try:
            return shutil.disk_usage(probe).free
        except OSError:
            if probe.parent == probe:
                return None
            probe = probe.parent


def disk_full(exc: BaseException, where: Path | str | None = None) -> bool:
    """Whether `exc` (or what caused it) is a write that failed for lack of space. `where` is the path the
    failing code was writing under, used only to judge SQLite's ambiguous "disk I/O error"."""
    for item in _chain(exc):
        if isinstance(item, OSError) and item.errno in _NO_SPACE_ERRNOS:
            return True
        text = str(item).lower()
        if any(marker in text for marker in _NO_SPACE_TEXTS):
            return True
        if "disk i/o error" in text and where is not None:
            free = free_bytes(where)
            if free is not None and free < LOW_SPACE_BYTES:
                return True
    return False


def tree_bytes(path: Path | str) -> int:
    """Bytes of the regular files under `path` (0 if it is gone)."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def human(size: int | None) -> str:
    if size is None:
        return "an unknown amount"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def disk_full_error(exc: BaseException, where: Path | str | None, *, stage: str | None = None,
                    written_in: Path | str | None = None, expected: int | None = None) -> DiskFull:
    """A one-line DiskFull for `exc`: the path it names (else `where`), the stage, the bytes `written_in` holds
    (what the failing step had written when the disk filled), what the stage expects to write when it can
    say (`expected`), and the bytes free on that filesystem now."""
    named = next((getattr(e, "filename", None) for e in _chain(exc) if getattr(e, "filename", None)), None)
    path = str(named or where) if (named or where) else None
    written = tree_bytes(written_in) if written_in is not None else None
    free = free_bytes(path) if path is not None else None
    try:
        total: int | None = shutil.disk_usage(free_root(path)).total if path is not None else None
    except OSError:
        total = None
    parts = ([f"had written {human(written)}"] if written is not None else []) + (
        [f"needs about {human(expected)} in all"] if expected is not None else [])
    said = " ".join(x for x in (f"the {stage} stage" if stage else "", " and ".join(parts)) if x)
    of = f" of {human(total)}" if total is not None else ""
    message = "no space left on device" + (f" writing {path}" if path else "") + (f" ({said})" if said else "")
    if free is not None:
        message += f"; {human(free)} free{of} there"
    needed = f"at least {human(expected)}" if expected is not None else "space"
    return DiskFull(message, path=path or "", free=free, written=written, stage=stage,
                    fix=f"free {needed} on that disk, or put the store on a larger one; nothing was half-written")


def free_root(path: Path | str) -> Path:
    """`path` or its nearest existing parent (what shutil.disk_usage can stat)."""
    probe = Path(path)
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe
