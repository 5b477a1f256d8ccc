"""What every executor shares: the result type, the failure type, and a logged child-process runner.

The runner starts the child in its own process group (so trtllm-build's MPI/worker children die
with it), copies every output line to the log file and to a rich progress line, enforces a wall
clock timeout, and on timeout or Ctrl-C kills the whole group (TERM, then KILL after a grace period).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from trtpipe.engine.convert_entry import ERROR_PREFIX
from trtpipe.engine.doctor import diagnose
from trtpipe.errors import TimedOut, TrtpipeError
from trtpipe.settings import child_environment


class ExecutorResult(BaseModel):
    executor: str
    returncode: int
    log_path: Path
    duration_s: float
    command: list[str] = Field(default_factory=list)
    tensorrt_version: str | None = None
    gpu_sm: int | None = None
    image: str | None = None


class BuildFailed(TrtpipeError):
    """A build (or conversion) ran and failed; the message carries the doctor's diagnosis when it has one."""

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None, log_path: Path | None = None,
                 diagnoses: list | None = None) -> None:
        self.log_path = log_path
        self.diagnoses = diagnoses or []
        super().__init__(message, fix=fix)

    def verdicts(self) -> list[object] | None:
        """The doctor's diagnoses of the failed build's log (pattern, cause, fix, the line it matched)."""
        return [d.model_dump() if hasattr(d, "model_dump") else d for d in self.diagnoses]


class ConversionJob(BaseModel):
    """One checkpoint conversion for an executor to run (trtpipe.engine.convert_entry).

    Every path is a host path; the docker executor mounts each at the same path in the container, so
    the job's spec (written with absolute paths) reads the same inside and out.
    """

    model_config = ConfigDict(extra="forbid")

    job_dir: Path = Field(description="Private, writable: holds spec.json (what to convert) and summary.json.")
    out_dir: Path = Field(description="Where the checkpoint is written (the store's temporary directory).")
    read_only: list[Path] = Field(
        default_factory=list,
        description="Host paths the conversion reads: model dir, its symlinks' targets, tokenizer, calibration file.",
    )
    device: Literal["cuda", "cpu"] = "cuda"
    world_size: int = Field(default=1, ge=1, description="GPUs the conversion gets: the engine's tp * pp.")
    artifact: Literal["trtllm", "hf"] = Field(
        default="trtllm", description="What it writes: a TRT-LLM checkpoint, or the llm-api backend's HF export.")

    @property
    def spec_path(self) -> Path:
        return self.job_dir / "spec.json"

    @property
    def summary_path(self) -> Path:
        return self.job_dir / "summary.json"

    def entry_arguments(self) -> list[str]:
        """The arguments of `python -m trtpipe.engine.convert_entry` for this job."""
        argv = ["--spec", str(self.spec_path), "--out", str(self.out_dir), "--summary", str(self.summary_path),
                "--device", self.device]
        return argv + ["--artifact", self.artifact] if self.artifact != "trtllm" else argv


class Executor(Protocol):
    name: str

    def run(self, plan, checkpoint_dir: Path, out_dir: Path, log: Path) -> ExecutorResult: ...

    def run_conversion(self, job: ConversionJob, log: Path) -> ExecutorResult: ...


def conversion_failure(log_path: Path, returncode: int | None, *, where: str, reason: str | None = None) -> BuildFailed:
    """A failed conversion: the entry point's own one-line error when it wrote one (with its exit
    status: 2 bad input, 3 missing capability), else the doctor's diagnosis of the log."""
    text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
    own = [line[len(ERROR_PREFIX):].strip() for line in text.splitlines() if line.startswith(ERROR_PREFIX)]
    if own and reason is None:
        failure = BuildFailed(f"checkpoint conversion ({where}) failed: {own[-1]} [log: {log_path}]",
                              log_path=log_path)
        if returncode in (2, 3):
            failure.exit_code = returncode
        return failure
    return failure_from_log(f"checkpoint conversion ({where})", log_path, returncode, reason=reason)


def failure_from_log(what: str, log_path: Path, returncode: int | None, *, reason: str | None = None) -> BuildFailed:
    """A BuildFailed for a failed run, with the first diagnosis from the log as cause and fix."""
    text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.is_file() else ""
    diagnoses = diagnose(text)
    status = reason or f"exit status {returncode}"
    if diagnoses:
        first = diagnoses[0]
        return BuildFailed(
            f"{what} failed ({status}): {first.cause} [doctor: {first.pattern_id}; log: {log_path}]",
            fix=first.fix, log_path=log_path, diagnoses=diagnoses,
        )
    return BuildFailed(
        f"{what} failed ({status}); log: {log_path}",
        fix="read the end of the log: the failing step's own message is there", log_path=log_path, diagnoses=[],
    )


def timed_out(what: str, seconds: float | None, log_path: Path, *, spec_field: str) -> TimedOut:
    """A run stopped at its deadline (its process group killed): which limit, where it is set, the log."""
    return TimedOut(
        f"{what} ran past its limit of {seconds:g}s and was stopped; log: {log_path}",
        operation=what, seconds=float(seconds or 0),
        fix=f"raise {spec_field} in the spec (seconds), or run it on a faster or larger GPU host",
    )


class ProcessOutcome(BaseModel):
    returncode: int
    timed_out: bool
    interrupted: bool
    duration_s: float


def _kill_group(proc: subprocess.Popen, grace_s: float) -> None:
    """TERM the child's whole process group, then KILL it if it has not exited after grace_s."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # The leader is gone; make sure no straggler of the group survives either.
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        except subprocess.TimeoutExpired:
            continue


def run_logged_process(
    argv: Sequence[str],
    log_path: Path,
    *,
    timeout_s: float | None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    show_progress: bool = True,
    title: str = "trtllm-build",
    on_line: Callable[[str], None] | None = None,
    kill_grace_s: float = 10.0,
) -> ProcessOutcome:
    """Run argv in its own process group, log every line, enforce the timeout, clean up on Ctrl-C.
    The child never gets the secret variables (registry credentials, the release key): trtllm-build
    and the converters need none."""
    env = child_environment(env)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    timed_out = False
    interrupted = False
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,  # its own process group: killpg reaches MPI ranks and workers too
            text=True,
            errors="replace",
            bufsize=1,
        )
        last_line = [""]

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                last_line[0] = line.rstrip()[-160:]
                if on_line is not None:
                    on_line(line)

        reader = threading.Thread(target=pump, daemon=True)
        status_ctx = None
        # From right after the start: a Ctrl-C while the reader or the status line starts (a loaded machine
        # can take a while there) must still kill the group, or the build outlives trtpipe.
        try:
            reader.start()
            if show_progress:
                from rich.console import Console

                status_ctx = Console(stderr=True).status(f"{title} starting")
                status_ctx.start()
            deadline = None if timeout_s is None else started + timeout_s
            while True:
                try:
                    proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if status_ctx is not None:
                    elapsed = time.monotonic() - started
                    status_ctx.update(f"{title} {elapsed:5.0f}s | {last_line[0]}")
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    _kill_group(proc, kill_grace_s)
                    break
        except KeyboardInterrupt:
            interrupted = True
            _kill_group(proc, kill_grace_s)
        finally:
            if status_ctx is not None:
                status_ctx.stop()
            if reader.ident is not None:  # started
                reader.join(timeout=5.0)
            if proc.stdout is not None:
                proc.stdout.close()
        returncode = proc.wait()
        if timed_out:
            log.write(f"\n[trtpipe] killed after timeout of {timeout_s}s\n")
        if interrupted:
            log.write("\n[trtpipe] interrupted; process group killed\n")
    outcome = ProcessOutcome(
        returncode=returncode, timed_out=timed_out, interrupted=interrupted,
        duration_s=time.monotonic() - started,
    )
    if interrupted:
        raise KeyboardInterrupt
    return outcome
