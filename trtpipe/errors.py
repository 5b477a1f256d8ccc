"""Errors a user can act on.

Every error raised for a user's mistake or for a missing capability is a `TrtpipeError`:
the CLI prints it as one line (no traceback) and exits with its `exit_code`.
"""

from __future__ import annotations


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


class SpecError(TrtpipeError):
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


class UsageError(TrtpipeError):
    """Bad command-line input (a missing file, a bad option value)."""

    exit_code = 2


class MissingCapability(TrtpipeError):
    """This host lacks what the operation needs (a GPU, TensorRT-LLM, a Docker daemon ...)."""

    exit_code = 3
