"""Remember file digests by (path, size, mtime_ns, ctime_ns, inode) so unchanged files are never re-read.

A small SQLite database in WAL mode with a busy timeout, shared safely by concurrent builds.
Like git's "racy" rule, a digest is only remembered for a file whose mtime is at least
`RACY_WINDOW_NS` old: a file written within the same timestamp tick as a later same-size
rewrite would otherwise keep a stale digest.

Why ctime: a writer can put mtime back (`touch -d`, `os.utime`), but nobody can set ctime; any
write, chmod, utime or link-count change moves it. The price is that our own hard links (store
objects, serving directories) move it too: `restamp` re-dates a row after such an operation of
ours, and only when the inode's ctime shows nothing else happened to it in between.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from trtpipe.store.objects import sha256_file

RACY_WINDOW_NS = 2_000_000_000
BUSY_TIMEOUT_MS = 30_000

# A new table name (not an ALTER): a database written by an older trtpipe keeps working, its rows unused.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS file_digests (
    path TEXT NOT NULL PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    sha256 TEXT NOT NULL
)
"""


def _ident(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


class DigestCache:
    """sha256 of files, remembered across runs."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._conn: sqlite3.Connection | None = None
        self.hashed_bytes = 0  # bytes actually read by this instance (the benchmark reports it)

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self.db_path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def cached(self, path: Path) -> str | None:
        """The remembered sha256 of `path` if the file is exactly as it was when hashed; never reads it."""
        real = str(Path(path).resolve())
        try:
            st = os.stat(real)
        except FileNotFoundError:
            return None
        row = self._connect().execute(
            "SELECT sha256 FROM file_digests WHERE path=? AND size=? AND mtime_ns=? AND ctime_ns=? AND inode=?",
            (real, *_ident(st)),
        ).fetchone()
        return row[0] if row is not None else None

    def digest(self, path: Path) -> str:
        """sha256 hex of `path`; reads the file only if it changed since it was last hashed."""
        real = str(Path(path).resolve())
        st = os.stat(real)
        conn = self._connect()
        row = conn.execute(
            "SELECT sha256 FROM file_digests WHERE path=? AND size=? AND mtime_ns=? AND ctime_ns=? AND inode=?",
            (real, *_ident(st)),
        ).fetchone()
        if row is not None:
            return row[0]
        value = sha256_file(Path(real))
        self.hashed_bytes += st.st_size
        self._remember(real, value, st)
        return value

    def _remember(self, real: str, value: str, st: os.stat_result) -> None:
        """Store `value` for the file as `st` saw it, if it is unchanged since and settled (racy rule)."""
        try:
            after = os.stat(real)
        except FileNotFoundError:
            return
        unchanged = _ident(after) == _ident(st)
        settled = time.time_ns() - st.st_mtime_ns >= RACY_WINDOW_NS
        if unchanged and settled:
            self._connect().execute(
                "INSERT OR REPLACE INTO file_digests(path, size, mtime_ns, ctime_ns, inode, sha256) VALUES (?,?,?,?,?,?)",
                (real, *_ident(st), value),
            )

    def restamp(self, path: Path, before: os.stat_result) -> bool:
        """After our own link or unlink of `path`'s inode: move its row to the new ctime.

        `before` is the stat taken just before that operation; the row moves only if it matched
        `before` exactly (nothing happened to the inode between the last verification and our
        operation) and size, mtime and inode are still the same. True when the row moved.
        """
        real = str(Path(path).resolve())
        try:
            now = os.stat(real)
        except FileNotFoundError:
            return False
        if (now.st_size, now.st_mtime_ns, now.st_ino) != (before.st_size, before.st_mtime_ns, before.st_ino):
            return False
        cursor = self._connect().execute(
            "UPDATE file_digests SET ctime_ns=? WHERE path=? AND size=? AND mtime_ns=? AND ctime_ns=? AND inode=?",
            (now.st_ctime_ns, real, *_ident(before)),
        )
        return cursor.rowcount == 1

    def __enter__(self) -> DigestCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
