"""Recorded test results (smoke, parity, bench) per artifact digest: evidence, not assertions.

Promotion gates read these: a gate passes only on a result recorded for exactly the digest
being promoted. The log is one file per digest under `<home>/results/`, append-only through
trtpipe and hash-chained with its head anchored beside it (`trtpipe.chained`; the head is signed
with the release key when one is set): a file rewritten, truncated, or with lines appended by hand
is refused when read, naming the file, and none of its results count.

Each result says where it came from: `origin` "run" (trtpipe smoke/bench measured it; `evidence`
holds the run's own record: command, server URL, the identity the server reported, versions, host,
time) or "hand" (`trtpipe results record`: nothing ran under trtpipe's eyes). A hand-recorded result
counts only for channels whose trust policy allows it, and a promotion on one is recorded as forced.
Appends happen under a file lock so concurrent smoke and bench runs never interleave lines.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trtpipe.chained import ChainedLog, HeadKey
from trtpipe.errors import IntegrityError, UsageError

ResultKind = Literal["smoke", "parity", "bench"]
ResultOrigin = Literal["run", "hand"]
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
    origin: ResultOrigin = "run"
    evidence: dict[str, Any] | None = None  # the run's own record (origin "run")
    seq: int | None = None  # the chain (None until written)
    prev_hash: str | None = None
    hash: str | None = None

    @field_validator("artifact_digest")
    @classmethod
    def _digest_shape(cls, value: str) -> str:
        if not _DIGEST_RE.match(value):
            raise ValueError("artifact_digest must be sha256:<64 lowercase hex digits>")
        return value


class ResultsLog:
    """Append-only, hash-chained per-digest result log under `<home>/results/<hex>.jsonl` (its head:
    `<hex>.head.json`). `key`: the release key, which signs each head written and checks each read."""

    def __init__(self, home: Path, key: HeadKey | None = None) -> None:
        self.home = Path(home)
        self.dir = self.home / "results"
        self.key = key

    def _path(self, digest: str) -> Path:
        return self.dir / (digest.split(":", 1)[1] + ".jsonl")

    def _log(self, digest: str) -> ChainedLog:
        return ChainedLog(self._path(digest), what="result log")

    def record(
        self,
        artifact_digest: str,
        kind: str,
        passed: bool,
        data: dict[str, Any],
        gpu_class: str | None = None,
        *,
        origin: str = "run",
        evidence: dict[str, Any] | None = None,
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
                origin=origin,  # type: ignore[arg-type]
                evidence=evidence,
            )
            body = json.loads(rec.model_dump_json(exclude={"seq", "prev_hash", "hash"}))
        except (ValidationError, ValueError, TypeError) as exc:
            raise UsageError(
                f"result for {digest} is invalid: {_first_error(exc)}",
                fix=f"kind must be one of {', '.join(RESULT_KINDS)} and data JSON-serializable",
            ) from None
        self.dir.mkdir(parents=True, exist_ok=True)
        # One fsynced write() of one line on an O_APPEND fd, under a lock, then the head: readers see
        # whole lines only. A damaged log (or one whose head does not match) is refused, not extended.
        written = self._log(digest).append(body, key=self.key)
        return ResultRecord.model_validate(written)

    def for_digest(self, digest: str) -> list[ResultRecord]:
        """The results recorded for `digest`; an IntegrityError naming the file when the log was
        edited, shortened, deleted under its head, or extended outside trtpipe."""
        digest = normalize_digest(digest)
        log = self._log(digest)
        if not log.path.exists() and not log.head_path.exists():
            return []
        problems = log.verify(self.key)
        if problems:
            raise IntegrityError(
                f"{problems[0]}; none of the results in {log.path.name} count", path=str(log.path),
                fix="result logs are written only by trtpipe: restore the file and its head from a backup, "
                    "or record the results again by running the checks",
            )
        out: list[ResultRecord] = []
        for number, fields in enumerate(log.scan().records, start=1):
            try:
                out.append(ResultRecord.model_validate(fields))
            except ValidationError as exc:
                raise IntegrityError(
                    f"{log.path}:{number}: corrupt result record: {_first_error(exc)}", path=str(log.path),
                    fix="results logs are append-only; restore the file from a backup",
                ) from None
        return [r for r in out if r.artifact_digest == digest]


def run_evidence(command: str, server_url: str | None, served: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a run records about itself beside its result: the command, the server it talked to, what
    that server reported serving, the versions of the tools, where and when."""
    import platform
    import sys

    from trtpipe.versions import installed_version

    return {
        "command": command,
        "server_url": server_url,
        "served": served,
        "trtpipe": installed_version("trtpipe"),
        "tritonclient": installed_version("tritonclient"),
        "python": sys.version.split()[0],
        "host": platform.node(),
        "pid": os.getpid(),
        "at": _now(),
    }


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
