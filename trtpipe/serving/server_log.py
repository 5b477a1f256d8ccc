"""Where a served tritonserver's own log goes, whether it outlives the server, and following it to a stream.

tritonserver (or the Triton container's `docker run` client) writes its log to a file, always: the start-up
wait and the watchdog read its tail (a port clash, the last error). By default that file is in the server's
private work folder, removed on a clean exit and kept, and named, when the server failed. `serve` can also:

- append it to a file the user names (never removed; each server reads back only its own part of it);
- keep the default file after a clean exit too (`keep`), e.g. when a smoke test failed against the server;
- follow it: copy each line, as it is written, to a stream (serve's stderr, so a CI log shows it live).

A server that answered requests with errors (Triton's `nv_inference_request_failure`, read before it is
stopped) has its log kept as well: serve cannot see why a client failed (a smoke's wrong answer is not a
failed request), but it can see that the server refused or failed requests.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

FOLLOW_POLL_S = 0.2  # how often the follower looks for new lines (product code: no event to wait on for a file)


@dataclass(frozen=True)
class ServerLog:
    """How serve treats its server's log. `path`: the file the log goes to (None: the server's work folder);
    `keep`: keep the log after a clean exit too; `follow`: a stream each new line is copied to."""

    path: Path | None = None
    keep: bool = False
    follow: TextIO | None = None


class LogFollower:
    """Copy what is appended to `path` from `offset` on to `stream`, line by line, until `stop()`, which
    copies what is left first. The file is held open from the start, so the last lines of a server whose work
    folder is removed as it stops are still read."""

    def __init__(self, path: Path, stream: TextIO, offset: int = 0) -> None:
        self.stream = stream
        self.partial = b""
        self.source = open(path, "rb")  # noqa: SIM115 - held for the follower's life, closed by its thread
        self.source.seek(offset)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trtpipe-serve-log", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stopping.wait(FOLLOW_POLL_S):
                self._copy()
            self._copy(final=True)
        finally:
            self.source.close()

    def _copy(self, final: bool = False) -> None:
        data = self.source.read()
        pieces = (self.partial + data).split(b"\n")
        rest = pieces.pop()  # after the last newline: a line not finished yet (b"" when the data ends with one)
        if final and rest:
            pieces.append(rest)
            rest = b""
        self.partial = rest
        for line in pieces:
            self.stream.write(line.decode("utf-8", "replace") + "\n")
        if pieces:
            self.stream.flush()

    def stop(self, timeout: float = 10) -> None:
        self.stopping.set()
        self.thread.join(timeout)
