"""Read a small operator file (a trust policy, a public key) without trusting what the path names.

A path can name a FIFO (opening it blocks until a writer comes), a device (/dev/zero never ends), a folder,
or a file far larger than any policy. So: open without blocking (O_NONBLOCK: a FIFO opens at once), check
on the opened descriptor that it is a regular file (no window between the check and the read), and read at
most `limit` + 1 bytes, refusing beyond `limit`. Every refusal is one InvalidInput line naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trtpipe.errors import InvalidInput

MAX_SMALL_FILE = 1024 * 1024  # 1 MiB: a policy or a PEM key is a few KiB; anything near this is not one


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_small_file(path: Path, what: str, *, limit: int = MAX_SMALL_FILE, fix: str | None = None) -> bytes:
    """The bytes of the regular file `path` (at most `limit`); InvalidInput for anything else."""
    name_it = fix or f"name the {what} file itself (a regular file of at most {limit} bytes)"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such {what} file", fix=name_it) from None
    except IsADirectoryError:
        raise InvalidInput(f"{path}: is a folder, not a {what} file", fix=name_it) from None
    except OSError as exc:
        raise InvalidInput(f"{path}: cannot read the {what} file ({exc.strerror})",
                           fix="make the file readable by this user") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise InvalidInput(f"{path}: is {_kind(mode)}, not a regular {what} file", fix=name_it)
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            try:
                chunk = os.read(fd, min(left, 65536))
            except OSError as exc:
                raise InvalidInput(f"{path}: cannot read the {what} file ({exc.strerror})",
                                   fix="make the file readable by this user") from None
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise InvalidInput(f"{path}: the {what} file is larger than {limit} bytes", fix=name_it)
        return data
    finally:
        os.close(fd)
