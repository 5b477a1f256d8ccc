"""Recorded test results (smoke, parity, bench) per artifact digest.

Promotion gates read these: a gate passes only on a result recorded for exactly the digest
being promoted. The log is append-only JSONL, one file per digest under `<home>/results/`;
appends happen under a file lock so concurrent smoke and bench runs never interleave lines.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trtpipe.errors import IntegrityError, UsageError

ResultKind = Literal["smoke", "parity", "bench"]
RESULT_KINDS: tuple[str, ...] = ("smoke", "parity", "bench")

_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def normalize_digest(digest: str) -> str:
    """Accept `sha256:<hex>` or bare 64-hex; return `sha256:<hex>` or raise a UsageError."""
    text = digest.strip().lower()
    if re.fullmatch(r"[0-9a-f]{64}", text):
        text = "sha256:" + text
    if not _DIGEST_RE.match(text):
        raise UsageError(
            f"{digest!r} is not an artifact digest",
            fix="give sha256:<64 hex digits>, as the build report names it",
        )
    return text


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class ResultRecord(BaseModel):
    """One recorded outcome of a smoke, parity or bench run for one artifact digest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    artifact_digest: str
    kind: ResultKind
    passed: bool
    data: dict[str, Any] = Field(default_factory=dict)
    gpu_class: str | None = None
    recorded_at: str = Field(default_factory=_now)
    recorded_by: str | None = None

    @field_validator("artifact_digest")
    @classmethod
    def _digest_shape(cls, value: str) -> str:
        if not _DIGEST_RE.match(value):
            raise ValueError("artifact_digest must be sha256:<64 lowercase hex digits>")
        return value


class ResultsLog:
    """Append-only per-digest result log under `<home>/results/<hex>.jsonl`."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.dir = self.home / "results"

    def _path(self, digest: str) -> Path:
        return self.dir / (digest.split(":", 1)[1] + ".jsonl")

    def record(
        self,
        artifact_digest: str,
        kind: str,
        passed: bool,
        data: dict[str, Any],
        gpu_class: str | None = None,
    ) -> ResultRecord:
        digest = normalize_digest(artifact_digest)
        try:
            rec = ResultRecord(
                artifact_digest=digest,
                kind=kind,  # type: ignore[arg-type]
                passed=passed,
                data=data,
                gpu_class=gpu_class,
                recorded_by=current_user(),
            )
            line = rec.model_dump_json() + "\n"
        except (ValidationError, ValueError, TypeError) as exc:
            raise UsageError(
                f"result for {digest} is invalid: {_first_error(exc)}",
                fix=f"kind must be one of {', '.join(RESULT_KINDS)} and data JSON-serializable",
            ) from None
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self._path(digest)
        # One write() of one line on an O_APPEND fd, under a lock: readers see whole lines only.
        with FileLock(str(path) + ".lock", timeout=60):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
        return rec

    def for_digest(self, digest: str) -> list[ResultRecord]:
        digest = normalize_digest(digest)
        path = self._path(digest)
        if not path.exists():
            return []
        out: list[ResultRecord] = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                out.append(ResultRecord.model_validate_json(line))
            except ValidationError as exc:
                raise IntegrityError(
                    f"{path}:{number}: corrupt result record: {_first_error(exc)}", path=str(path),
                    fix="results logs are append-only; restore the file or remove the bad line",
                ) from None
        return [r for r in out if r.artifact_digest == digest]


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        return f"{loc}: {err.get('msg')}" if loc else str(err.get("msg"))
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def current_user() -> str:
    """Who is acting: $TRTPIPE_USER, else the CI's actor, else the login name (`trtpipe.settings`)."""
    from trtpipe.settings import from_env

    actor = from_env().actor
    if actor:
        return actor
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (some containers)
        return f"uid-{os.getuid()}"


def dump_records(records: list[ResultRecord]) -> list[dict[str, Any]]:
    return [json.loads(r.model_dump_json()) for r in records]
