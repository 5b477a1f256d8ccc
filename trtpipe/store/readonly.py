"""Read-only trees: stored entries are frozen (files 0444, folders 0555) and thawed only to be moved or removed.

Only folders are ever made writable again: unlinking or renaming a file needs write permission on its
folder, never on the file, so a stored file (a hard link to a shared object) keeps its 0444 whatever
happens to the entry that links it. (root ignores these bits; the store's verify is what catches a
write by root, see `trtpipe cache verify`.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

FILE_MODE = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH  # 0444
DIR_MODE = FILE_MODE | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH  # 0555
_WRITABLE_DIR = 0o755


def freeze_tree(root: Path) -> None:
    """Make every file under `root` 0444 and every folder 0555, `root` included (deepest first).

    A file already 0444 is left alone: a chmod moves the inode's ctime even when it changes nothing,
    and a file hard-linked from another entry must keep the ctime the digest cache knows it by."""
    for folder, dirs, names in os.walk(root, topdown=False):
        for name in names:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != FILE_MODE:
                os.chmod(path, FILE_MODE)
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, DIR_MODE)
    os.chmod(root, DIR_MODE)


def thaw_dirs(root: Path) -> None:
    """Make `root` and every folder below it writable by its owner again (files keep their mode)."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(root, _WRITABLE_DIR)
    for folder, dirs, _ in os.walk(root):
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(path, _WRITABLE_DIR)


def remove_tree(root: Path, *, on_unlink: Callable[[os.stat_result, os.stat_result], None] | None = None) -> None:
    """Remove a (possibly frozen) tree; never fails on what is already gone.

    `on_unlink(before, after)`: called for each file that shares its inode with another path (a hard link
    into the store), with the inode's stat just before and just after the unlink (read through a kept
    descriptor): the unlink moves that inode's ctime, and the digest cache re-dates its rows."""
    if not os.path.lexists(root):
        return
    if os.path.isdir(root) and not os.path.islink(root):
        thaw_dirs(root)
        if on_unlink is not None:
            _unlink_shared(root, on_unlink)
        shutil.rmtree(root, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(root)


def _unlink_shared(root: Path, on_unlink: Callable[[os.stat_result, os.stat_result], None]) -> None:
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                before = os.fstat(fd)
                if not stat.S_ISREG(before.st_mode) or before.st_nlink < 2:
                    continue
                try:
                    os.unlink(path)
                except OSError:
                    continue
                on_unlink(before, os.fstat(fd))
            finally:
                os.close(fd)


def normalized_mode(st_mode: int) -> str:
    """The mode a manifest records: "0755" when any execute bit is set, else "0644" (as git does).

    The bits on disk are always read-only (the store freezes them); the manifest keeps only what
    is part of the content (executable or not), so a umask or a copy never changes a digest.
    """
    return "0755" if st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH) else "0644"
