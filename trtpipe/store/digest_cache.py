"""Remember file digests by (path, size, mtime_ns, inode) so unchanged inputs are never re-read.

A small SQLite database in WAL mode with a busy timeout, shared safely by concurrent builds.
Like git's "racy" rule, a digest is only remembered for a file whose mtime is at least
`RACY_WINDOW_NS` old: a file written within the same timestamp tick as a later same-size
rewrite would otherwise keep a stale digest.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from trtpipe.store.objects import sha256_file

RACY_WINDOW_NS = 2_000_000_000
BUSY_TIMEOUT_MS = 30_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS digests (
    path TEXT NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    PRIMARY KEY (path)
)
"""


class DigestCache:
    """sha256 of files, remembered across runs."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._conn: sqlite3.Connection | None = None
        self.hashed_bytes = 0  # bytes actually read by this instance (the benchmark reports it)
        self.hits = 0

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

    def digest(self, path: Path) -> str:
        """sha256 hex of `path`; reads the file only if it changed since it was last hashed."""
        real = str(Path(path).resolve())
        st = os.stat(real)
        conn = self._connect()
        row = conn.execute(
            "SELECT sha256 FROM digests WHERE path=? AND size=? AND mtime_ns=? AND inode=?",
            (real, st.st_size, st.st_mtime_ns, st.st_ino),
        ).fetchone()
        if row is not None:
            self.hits += 1
            return row[0]
        value = sha256_file(Path(real))
        self.hashed_bytes += st.st_size
        after = os.stat(real)
        unchanged = (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
        settled = time.time_ns() - st.st_mtime_ns >= RACY_WINDOW_NS
        if unchanged and settled:
            conn.execute(
                "INSERT OR REPLACE INTO digests(path, size, mtime_ns, inode, sha256) VALUES (?,?,?,?,?)",
                (real, st.st_size, st.st_mtime_ns, st.st_ino, value),
            )
        return value

    def __enter__(self) -> DigestCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
