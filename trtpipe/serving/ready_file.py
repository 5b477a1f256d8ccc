"""The ready file: what `serve --ready-file F` writes once its server is ready, for a CI step to wait on and read.

It is written only after every model is ready and the server has reported the repository's digest over gRPC
(trtpipe.serving.server `_start`), atomically (a temporary file beside it, then a rename: a reader sees no
file or the whole one), again after each restart (the server's pid changes; its addresses do not), and removed
when serve stops. A ready file left from an earlier run is removed before the server starts, so a waiter never
mistakes it for this one. Its JSON: the `ready` (or `restarted`) event's fields (grpc_url, http_url, metrics_url,
pid of tritonserver or the container client, repository_digest, models, log, serving_dir, restarts, watch,
container) and serve's own `serve_pid` and `serve_started` (its start time, which tells that process from a
later one given the same pid): what `serve-stop` signals.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from trtpipe.atomic import write_text_atomically
from trtpipe.errors import InvalidInput


class ServedServer(BaseModel):
    """A ready server, as serve announces it (trtpipe.serving.watch `ServerReady`, `ServerRestarted`) and as the
    ready file keeps it."""

    event: str
    grpc_url: str
    http_url: str
    metrics_url: str
    pid: int
    log: str
    models: list[str]
    repository_digest: str | None
    serving_dir: str
    restarts: int
    watch: dict[str, object]
    container: str | None = None  # the Triton container's image (GPU targets); None: tritonserver on this host
    # "verified": a trust policy verified a signature over exactly the files served; "unverified": no policy, or
    # one that let it through unsigned (serve says so once, on stderr).
    content: Literal["verified", "unverified"] = "unverified"


class ReadyFile(ServedServer):
    """The content of a ready file: the last ready or restarted event, and serve's own process."""

    event: Literal["ready", "restarted"]
    serve_pid: int
    serve_started: float


def process_started(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch, psutil's create_time), or None when there is none."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def write_ready_file(path: Path, event: BaseModel) -> ReadyFile:
    """Write `event` (a ready or restarted event) as the ready file `path`, with this process as serve."""
    pid = os.getpid()
    content = ReadyFile(**event.model_dump(), serve_pid=pid, serve_started=process_started(pid) or 0.0)
    write_text_atomically(path, content.model_dump_json(indent=2) + "\n", mode=0o644)
    return content


def read_ready_file(path: Path) -> ReadyFile | None:
    """The ready file at `path`, or None when there is none; InvalidInput when it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise InvalidInput(f"{path}: cannot read the ready file ({err.strerror})", fix="give the file serve wrote") from None
    try:
        return ReadyFile.model_validate(json.loads(text))
    except (ValueError, ValidationError) as err:
        first = " ".join(str(err).split())[:160]
        raise InvalidInput(f"{path} is not a serve ready file: {first}",
                           fix="give the ready file serve wrote") from None


def remove_ready_file(path: Path, *, serve_pid: int | None = None) -> None:
    """Remove the ready file at `path`; with `serve_pid`, only when it is that serve's (another serve may have
    written a newer one meanwhile)."""
    if serve_pid is not None:
        try:
            current = read_ready_file(path)
        except InvalidInput:
            return
        if current is None or current.serve_pid != serve_pid:
            return
    path.unlink(missing_ok=True)


def is_running(ready: ReadyFile) -> bool:
    """Whether the serve a ready file names still runs (the same process: its pid and its start time; a dead
    process its parent has not reaped yet is not running)."""
    import psutil

    try:
        process = psutil.Process(ready.serve_pid)
        return abs(process.create_time() - ready.serve_started) < 1.0 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
