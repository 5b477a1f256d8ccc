"""A serve in the background: started, waited for until it is ready or has failed, and stopped later.

What a CI job needs from `serve` (issue 23): one step that returns once the server can be used, with its
addresses, or fails with the cause and exit code serve itself gives (a busy port: 2, within seconds); later
steps that read its gRPC address from a file; a step that stops it and waits until it is gone (so the next
server can take the same ports); and one log file to keep as the job's artifact.

`start_detached` runs the given serve command line (the caller's, with `--ready-file`, `--log-file` and no
`--detach`) in a new session (it outlives the step's shell and ignores its terminal), with stdin closed and its
stdout and stderr appended to the log file tritonserver writes too, so that one file holds the server's log and
serve's own lines (ready, unhealthy, restarting, restarted, stopped, its last error) in order. It returns the
ready file once serve wrote it (trtpipe.serving.ready_file: ready and identity-checked), or raises
`DetachedServeFailed` with serve's own error line and exit code when serve exits first.

`stop_detached` sends SIGTERM to the serve a ready file names (checked to be that process: pid and start time)
and waits until it has exited: serve then has stopped its server and removed the ready file.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from pydantic import BaseModel

from trtpipe.errors import DetachedServeFailed, NotFound, TimedOut
from trtpipe.serving.ready_file import ReadyFile, is_running, read_ready_file, remove_ready_file

POLL_S = 0.2  # how often the waiting side looks at the ready file and the process (no event crosses processes)
ERROR_PREFIX = "error: "


def default_log_file(ready_file: Path) -> Path:
    """Where a detached serve logs when no --log-file is named: beside its ready file."""
    return ready_file.with_name(ready_file.name + ".log")


def start_detached(argv: list[str], *, ready_file: Path, log_file: Path, deadline_s: float) -> ReadyFile:
    """Run `argv` (a serve that writes `ready_file` and logs to `log_file`) in the background; return its ready
    file once written, or raise DetachedServeFailed (it exited first) or TimedOut (neither within `deadline_s`:
    then it is stopped)."""
    remove_ready_file(ready_file)  # an earlier run's: never taken for this one
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_bytes(b"")
    with open(log_file, "ab") as output:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                                   start_new_session=True)
    deadline = time.monotonic() + deadline_s
    while True:
        ready = read_ready_file(ready_file)
        if ready is not None and ready.serve_pid == process.pid:
            return ready
        code = process.poll()
        if code is not None:
            # Its own exit code (a signal's as a shell gives it; a 0 before ready is still a failure to start).
            exit_code = code if code > 0 else (128 - code if code < 0 else 1)
            raise DetachedServeFailed(_last_error(log_file, code), exit_code=exit_code, log=str(log_file),
                                      serve_pid=process.pid)
        if time.monotonic() > deadline:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
            raise TimedOut(f"the detached serve (pid {process.pid}) was not ready within {deadline_s:g}s; it was "
                           "stopped", operation="tritonserver start", seconds=deadline_s,
                           fix=f"see its log {log_file}")
        time.sleep(POLL_S)


def _last_error(log_file: Path, code: int) -> str:
    """serve's own error line from its output (the last `error: ` line), without the prefix; else what is known."""
    try:
        lines = log_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    errors = [line[len(ERROR_PREFIX):] for line in lines if line.startswith(ERROR_PREFIX)]
    if errors:
        return errors[-1]
    last = next((line.strip() for line in reversed(lines) if line.strip()), "(no output)")
    return f"serve exited with code {code} before it was ready; its output ends: {last[:300]}"


class Stopped(BaseModel):
    """What `stop_detached` did."""

    serve_pid: int
    was_running: bool
    log: str
    seconds: float


def stop_detached(ready_file: Path, *, timeout: float) -> Stopped:
    """Stop the serve `ready_file` names and wait until it has exited (module docstring)."""
    import psutil

    ready = read_ready_file(ready_file)
    if ready is None:
        raise NotFound(f"{ready_file}: no such ready file (serve removes it when it stops, and writes it only once "
                       "ready)", what="ready file", ref=str(ready_file),
                       fix="give the ready file serve was started with; none there means no serve is ready")
    started = time.monotonic()
    if not is_running(ready):
        remove_ready_file(ready_file, serve_pid=ready.serve_pid)  # its serve died without removing it
        return Stopped(serve_pid=ready.serve_pid, was_running=False, log=ready.log, seconds=0.0)
    process = psutil.Process(ready.serve_pid)
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except psutil.TimeoutExpired:
        raise TimedOut(f"serve (pid {ready.serve_pid}) did not stop within {timeout:g}s of SIGTERM",
                       operation="serve stop", seconds=timeout,
                       fix=f"see its log {ready.log}; give it longer, or kill it") from None
    except psutil.NoSuchProcess:
        pass
    return Stopped(serve_pid=ready.serve_pid, was_running=True, log=ready.log, seconds=time.monotonic() - started)
