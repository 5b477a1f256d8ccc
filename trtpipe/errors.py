"""Errors a user can act on.

Every error raised for a user's mistake or for a missing capability is a `TrtpipeError`:
the CLI prints it as one line (no traceback) and exits with its `exit_code`. Raise the subclass
named for what the user can do about it; it carries the fields a caller or the CLI needs.

A library error's `fix` says what to change in the world (a file, a spec field, a variable, a
service); it never names a trtpipe command or flag. The CLI adds those from the error's type and
fields (`trtpipe.commands.hints`), where a test checks each against the command line itself.

Exit codes: `EXIT_CODES` below, one table for the whole CLI (docs/cli.md prints the same table).
"""

from __future__ import annotations

from pathlib import Path


# exit code -> what it means, for the whole CLI (docs/cli.md's table is checked against this).
EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "a check, gate, plan, build or test did not pass, or stored data failed verification",
    2: "invalid input: a spec, option, file, credential or reference (InvalidInput and its kinds)",
    3: "this host lacks a capability the operation needs: a GPU, TensorRT-LLM, a Docker daemon (MissingCapability)",
    4: "a concurrent change won: a channel moved, a tag already names another artifact (Conflict)",
    5: "an operation ran past its deadline (TimedOut)",
    130: "interrupted (Ctrl-C); nothing is left half-written",
}


class TrtpipeError(Exception):
    """A failure with a one-line message that says what went wrong and what to do."""

    exit_code: int = 1

    def __init__(self, message: str, *, fix: str | None = None, exit_code: int | None = None) -> None:
        self.message = message
        self.fix = fix
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = self.message if not self.fix else f"{self.message}; {self.fix}"
        return " ".join(text.split())

    def fields(self) -> dict[str, object]:
        """The typed fields a subclass carries (file, field, channel, digest ...), for a JSON refusal: every
        public attribute set on the error that is plain data, but the message and fix (said apart)."""
        plain = (str, int, float, bool, type(None))
        found: dict[str, object] = {}
        for name, value in vars(self).items():
            if name in ("message", "fix", "exit_code") or name.startswith("_"):
                continue
            if isinstance(value, plain) or (isinstance(value, list) and all(isinstance(v, plain) for v in value)):
                found[name] = value
            elif isinstance(value, Path):
                found[name] = str(value)
        return found

    def verdicts(self) -> list[object] | None:
        """The judgments that made this error, where it has them (a gate refusal's gates); None otherwise."""
        return None


class InvalidInput(TrtpipeError):
    """Input the user gave is wrong: a spec, an option, a file or a reference."""

    exit_code = 2


class SpecError(InvalidInput):
    """An invalid build spec: `file:line:col: field.path: what is wrong; how to fix it`."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str,
        line: int | None = None,
        col: int | None = None,
        field: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.col = col
        self.field = field
        super().__init__(message, fix=fix)

    def one_line(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.col is not None:
                where += f":{self.col}"
        body = super().one_line()
        if self.field:
            return f"{where}: {self.field}: {body}"
        return f"{where}: {body}"


class UsageError(InvalidInput):
    """Bad command-line input (a missing file, a bad option value)."""


class NotFound(InvalidInput):
    """A named thing (artifact, channel, file, model) does not exist."""

    def __init__(self, message: str, *, what: str, ref: str, fix: str | None = None) -> None:
        self.what = what
        self.ref = ref
        super().__init__(message, fix=fix)


class WrongAddress(UsageError):
    """An address that is not the kind the command needs (an HTTP URL, or Triton's HTTP or metrics port, where
    gRPC host:port is asked for). `grpc_address`: the right one, when it could be found."""

    def __init__(self, message: str, *, address: str, grpc_address: str | None = None, fix: str | None = None) -> None:
        self.address = address
        self.grpc_address = grpc_address
        super().__init__(message, fix=fix)


class AccessDenied(InvalidInput):
    """A service refused the credentials given (or none were found): fix the credentials."""

    def __init__(self, message: str, *, resource: str, fix: str | None = None) -> None:
        self.resource = resource
        super().__init__(message, fix=fix)


class MissingCapability(TrtpipeError):
    """This host lacks what the operation needs (a GPU, TensorRT-LLM, a Docker daemon ...)."""

    exit_code = 3


class GateRefused(TrtpipeError):
    """A promotion gate did not pass for the artifact being promoted. `failed`: the gates not passed;
    `missing`: those of them with no result recorded (the rest have results that did not pass);
    `verdicts()`: every gate's verdict (gate, status, detail), passed ones included."""

    def __init__(self, message: str, *, channel: str, digest: str, failed: list[str], fix: str | None = None,
                 missing: list[str] | None = None, verdicts: list[dict[str, object]] | None = None) -> None:
        self.channel = channel
        self.digest = digest
        self.failed = list(failed)
        self.missing = list(missing or [])
        self._verdicts = list(verdicts or [])
        super().__init__(message, fix=fix)

    def verdicts(self) -> list[object] | None:
        return list(self._verdicts)


class Untrusted(TrtpipeError):
    """An artifact's signatures do not satisfy the trust policy (unsigned, signed by an untrusted key, or
    signed over other bytes); `missing` lists what the policy wanted and did not find."""

    def __init__(self, message: str, *, subject: str, missing: list[str], fix: str | None = None) -> None:
        self.subject = subject
        self.missing = list(missing)
        super().__init__(message, fix=fix)


class IntegrityError(TrtpipeError):
    """Stored data is not what its name or record says (a corrupt entry, object, trail or result log)."""

    def __init__(self, message: str, *, path: str | None = None, in_store: bool = False, fix: str | None = None) -> None:
        self.path = path
        self.in_store = in_store  # damage to a stored artifact (which the store can restore to its digest)
        super().__init__(message, fix=fix)


class Conflict(TrtpipeError):
    """Someone else changed the same thing first (a channel pointer, a lock holder)."""

    exit_code = 4

    def __init__(self, message: str, *, resource: str, fix: str | None = None) -> None:
        self.resource = resource
        super().__init__(message, fix=fix)


class TagMoved(Conflict):
    """A registry tag no longer names what it named when it was read (another writer moved it first):
    the compare of a compare-and-swap failed, and nothing was moved."""


class RemoteError(TrtpipeError):
    """A remote service (a registry) is unreachable or answered with an error."""

    def __init__(self, message: str, *, remote: str, fix: str | None = None) -> None:
        self.remote = remote
        super().__init__(message, fix=fix)


class CheckFailed(TrtpipeError):
    """A check of a running system failed (a server not ready, a model missing, a wrong answer)."""

    def __init__(self, message: str, *, check: str, fix: str | None = None) -> None:
        self.check = check
        super().__init__(message, fix=fix)


class DetachedServeFailed(TrtpipeError):
    """A serve started in the background exited before it was ready: its own error line (`message`, which
    carries its fix and hint) and exit code; `log` holds its output and its server's log."""

    def __init__(self, message: str, *, exit_code: int, log: str, serve_pid: int) -> None:
        self.log = log
        self.serve_pid = serve_pid
        super().__init__(message, exit_code=exit_code)

    def one_line(self) -> str:
        return f"{super().one_line()} (serve's output and its server's log: {self.log})"


class DiskFull(TrtpipeError):
    """A write failed for lack of space (ENOSPC, a quota, SQLite's "database or disk is full"): `path` is where,
    `free` the bytes free on that filesystem afterwards, `written` what the failing step had written before."""

    def __init__(self, message: str, *, path: str, free: int | None = None, written: int | None = None,
                 stage: str | None = None, fix: str | None = None) -> None:
        self.path = path
        self.free = free
        self.written = written
        self.stage = stage
        super().__init__(message, fix=fix)


class InternalError(TrtpipeError):
    """trtpipe broke one of its own rules (a stage wrote what the store refuses): a bug to report."""


class Interrupted(TrtpipeError):
    """The user pressed Ctrl-C; `kept` names what was already stored (whole, and reused next time)."""

    exit_code = 130

    def __init__(self, message: str, *, kept: list[str] | None = None) -> None:
        self.kept = list(kept or [])
        super().__init__(message)


class TimedOut(TrtpipeError):
    """An operation ran past its deadline."""

    exit_code = 5

    def __init__(self, message: str, *, operation: str, seconds: float, fix: str | None = None) -> None:
        self.operation = operation
        self.seconds = seconds
        super().__init__(message, fix=fix)
