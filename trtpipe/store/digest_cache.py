"""Remember file digests by (path, size, mtime_ns, ctime_ns, inode) so unchanged files are never re-read.

A small SQLite database in WAL mode with a busy timeout, shared safely by concurrent builds.
Like git's "racy" rule, a digest is only remembered for a file whose mtime is at least
`RACY_WINDOW_NS` old: a file written within the same timestamp tick as a later same-size
rewrite would otherwise keep a stale digest.

Why ctime: a writer can put mtime back (`touch -d`, `os.utime`), but nobody can set ctime; any
write, chmod, utime or link-count change moves it. The price is that our own hard links (store
objects, serving directories) move it too: `restamp` re-dates a row after such an operation of
ours, and only when the inode's ctime shows nothing else happened to it in between.

The database is a cache: when it is damaged (not a database, malformed, a table of another shape) it
is set aside and rebuilt empty, and that is said once (one line: to `on_rebuilt`, else a warning on
stderr); nothing but re-hashing is lost.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtpipe.store.objects import sha256_file
from trtpipe.store.readonly import remove_tree

# sqlite's primary result codes for a file that is not (or no longer) a database.
_SQLITE_CORRUPT, _SQLITE_NOTADB = 11, 26
_COLUMNS = ["path", "size", "mtime_ns", "ctime_ns", "inode", "sha256"]

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

    def __init__(self, db_path: Path, *, on_rebuilt: Callable[[str], None] | None = None) -> None:
        self.db_path = db_path
        self._conn: sqlite3.Connection | None = None
        self.hashed_bytes = 0  # bytes actually read by this instance (the benchmark reports it)
        self.on_rebuilt = on_rebuilt
        self.rebuilt: str | None = None  # what was wrong, when this instance rebuilt the database

    def _open(self) -> sqlite3.Connection:
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(self.db_path) and not stat.S_ISREG(os.lstat(self.db_path).st_mode):
            raise sqlite3.DatabaseError("not a regular file")
        conn = sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
            columns = [row[1] for row in conn.execute("PRAGMA table_info(file_digests)")]
            if columns != _COLUMNS:
                raise sqlite3.DatabaseError(f"its table has the columns {columns}")
            conn.execute("CREATE INDEX IF NOT EXISTS file_digests_inode ON file_digests(inode)")
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            try:
                self._conn = self._open()
            except sqlite3.DatabaseError as err:
                if not _damaged(err):
                    raise
                self._rebuild(err)
        assert self._conn is not None
        return self._conn

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        """Run one statement; a damaged database is rebuilt (once) and the statement run again."""
        try:
            return self._connect().execute(sql, params)
        except sqlite3.DatabaseError as err:
            if not _damaged(err):
                raise
            self._rebuild(err)
            return self._connect().execute(sql, params)

    def _rebuild(self, err: BaseException) -> None:
        """Set the damaged database aside and start an empty one, under a lock (another process may be
        doing the same: whoever comes second finds a sound database and keeps it)."""
        from filelock import FileLock

        self.close()
        with FileLock(str(self.db_path.with_name(f".{self.db_path.name}.rebuild.lock")), timeout=BUSY_TIMEOUT_MS / 1000):
            with contextlib.suppress(sqlite3.DatabaseError):
                self._conn = self._open()
                return  # rebuilt by another process meanwhile, or the damage was in a file now replaced
            aside = self.db_path.with_name(f".{self.db_path.name}.damaged-{uuid.uuid4().hex[:8]}")
            for suffix in ("", "-wal", "-shm"):  # the WAL of a damaged database must not meet the new one
                source, target = Path(str(self.db_path) + suffix), Path(str(aside) + suffix)
                if os.path.lexists(source):
                    os.replace(source, target)
                    remove_tree(target)
            self._conn = self._open()
        reason = " ".join(str(err).split()) or type(err).__name__
        self.rebuilt = reason
        message = (f"the digest cache {self.db_path} was damaged ({reason}); it was set aside and rebuilt empty "
                   "(file digests are hashed again as needed)")
        if self.on_rebuilt is not None:
            self.on_rebuilt(message)
        else:  # one line on stderr, where every command's notes go (stdout may carry --json)
            print(f"warning: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def cached(self, path: Path) -> str | None:
        """The remembered sha256 of `path`'s bytes if its inode is exactly as it was when they were hashed,
        under whichever of its names (a stored object and the entry files linked to it are one inode);
        never reads the file."""
        try:
            st = os.stat(Path(path).resolve())
        except FileNotFoundError:
            return None
        row = self._execute(
            "SELECT sha256 FROM file_digests WHERE inode=? AND size=? AND mtime_ns=? AND ctime_ns=? LIMIT 1",
            (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns),
        ).fetchone()
        return row[0] if row is not None else None

    def digest(self, path: Path) -> str:
        """sha256 hex of `path`; reads the file only if it changed since it was last hashed."""
        return self.digest_with_stat(path)[0]

    def digest_with_stat(self, path: Path) -> tuple[str, os.stat_result]:
        """(sha256 hex, the stat it describes): what the store remembers as the moment it vouched for an
        inode's bytes, so its own later links can re-date the rows (`restamp`)."""
        real = str(Path(path).resolve())
        st = os.stat(real)
        row = self._execute(
            "SELECT sha256 FROM file_digests WHERE path=? AND size=? AND mtime_ns=? AND ctime_ns=? AND inode=?",
            (real, *_ident(st)),
        ).fetchone()
        if row is not None:
            return row[0], st
        value = sha256_file(Path(real))
        self.hashed_bytes += st.st_size
        self._remember(real, value, st)
        return value, st

    def vouch(self, path: Path, sha256: str) -> os.stat_result | None:
        """Remember `sha256` for `path` without reading it: the caller knows the bytes (it hashed them while
        writing, or they came verified). Only for a settled file (racy rule). Returns the stat remembered."""
        real = str(Path(path).resolve())
        try:
            st = os.stat(real)
        except FileNotFoundError:
            return None
        return st if self._remember(real, sha256, st) else None

    def _remember(self, real: str, value: str, st: os.stat_result) -> bool:
        """Store `value` for the file as `st` saw it, if it is unchanged since and settled (racy rule)."""
        try:
            after = os.stat(real)
        except FileNotFoundError:
            return False
        unchanged = _ident(after) == _ident(st)
        settled = time.time_ns() - st.st_mtime_ns >= RACY_WINDOW_NS
        if unchanged and settled:
            self._execute(
                "INSERT OR REPLACE INTO file_digests(path, size, mtime_ns, ctime_ns, inode, sha256) VALUES (?,?,?,?,?,?)",
                (real, *_ident(st), value),
            )
        return unchanged and settled

    def restamp(self, path: Path, before: os.stat_result) -> bool:
        """After our own link or unlink of `path`'s inode: move its rows (every path's) to the new ctime.

        `before` is the stat taken just before that operation; the rows move only if they matched
        `before` exactly (nothing happened to the inode between the last verification and our
        operation) and size, mtime and inode are still the same. True when a row moved.
        """
        try:
            now = os.stat(Path(path).resolve())
        except FileNotFoundError:
            return False
        return self.restamp_stats(before, now)

    def restamp_stats(self, before: os.stat_result, now: os.stat_result) -> bool:
        """`restamp` with both stats in hand (an unlink through a kept descriptor: `os.fstat` before and after).
        Rows are matched by inode, not path: a stored inode has one row per path it is known by (entries,
        objects), and one link or unlink moves the ctime of all of them."""
        if (now.st_size, now.st_mtime_ns, now.st_ino) != (before.st_size, before.st_mtime_ns, before.st_ino):
            return False
        if now.st_ctime_ns == before.st_ctime_ns:
            return True
        cursor = self._execute(
            "UPDATE file_digests SET ctime_ns=? WHERE inode=? AND size=? AND mtime_ns=? AND ctime_ns=?",
            (now.st_ctime_ns, before.st_ino, before.st_size, before.st_mtime_ns, before.st_ctime_ns),
        )
        return cursor.rowcount >= 1

    def __enter__(self) -> DigestCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _damaged(err: sqlite3.DatabaseError) -> bool:
    """True when the error says the file is not a sound digest database (not: locked, busy, disk full)."""
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    # Raised by this module (not a regular file, a table of another shape), or an older sqlite3 module.
    return type(err) is sqlite3.DatabaseError
