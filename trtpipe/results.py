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

Results travel between workspaces (a GPU runner to the release runner) as bundles (`trtpipe.release.evidence`):
`chain` reads one digest's whole verified chain for export, and `merge` appends a bundle's records to this
workspace's own chain, each once. A record's identity (`result_identity`) is its content without the chain
fields and without `imported` (where this copy came from), so the same record arriving twice, or from two
bundles, is appended once, and its chain here is this workspace's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock, Timeout
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trtpipe.chained import ChainedLog, HeadKey, canonical, signature_verifies
from trtpipe.errors import IntegrityError, TimedOut, UsageError
from trtpipe.settings import Settings

ResultKind = Literal["smoke", "parity", "bench"]
ResultOrigin = Literal["run", "hand"]
RESULT_KINDS: tuple[str, ...] = ("smoke", "parity", "bench")

_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# Fields that say where a record sits in one log, or how this copy got there: not what the record is.
CHAIN_FIELDS: frozenset[str] = frozenset({"seq", "prev_hash", "hash", "imported"})
MERGE_LOCK_TIMEOUT_S = 120.0


def result_identity(fields: dict[str, Any]) -> str:
    """What a recorded result is, wherever it is kept: sha256 over its canonical JSON without CHAIN_FIELDS.
    Two runs never share one (each carries its own time, and a run's evidence its host, pid and time)."""
    body = {k: v for k, v in fields.items() if k not in CHAIN_FIELDS}
    return "sha256:" + hashlib.sha256(canonical(body)).hexdigest()


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
    imported: dict[str, Any] | None = None  # where this copy came from (a bundle), when it was merged in
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
    `<hex>.head.json`). `key`: the release key, which signs each head written and checks each read. `who`: who
    records (`current_user(settings)`, as the workspace passes it); None: the login name (`login_name`), since
    this module reads no settings of its own."""

    def __init__(self, home: Path, key: HeadKey | None = None, *, who: str | None = None) -> None:
        self.home = Path(home)
        self.dir = self.home / "results"
        self.key = key
        self.who = who

    def _path(self, digest: str) -> Path:
        return self.dir / (digest.split(":", 1)[1] + ".jsonl")

    def _log(self, digest: str) -> ChainedLog:
        # The high-water mark lives outside results/ (beside the trails' marks): an older, genuinely signed
        # log and head put back (a failed run dropped so an earlier pass is the latest) is older than it.
        mark = self.home / "marks" / "results" / (digest.split(":", 1)[1] + ".head.json")
        return ChainedLog(self._path(digest), what="result log", mark=mark)

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
                recorded_by=self.who if self.who is not None else login_name(),
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

    def signed_prefix(self, digest: str, keys: list[HeadKey]) -> tuple[int, str | None]:
        """How many of `digest`'s records a head signature by one of `keys` covers, and that key's id ((0, None):
        the head is unsigned, or no key of `keys` signed it).

        A head's signature covers the log's name, its record count and its last record's hash; the chain links
        every earlier record to that hash. So the records up to the count are covered, and nothing else: a line
        appended through `ChainedLog.append` without the key, with the head rewritten unsigned, is covered by no
        signature (issue 28, attack 6). Read it after `for_digest` has checked the chain."""
        log = self._log(normalize_digest(digest))
        head = log.read_head()
        if not head or head.get("corrupt"):
            return 0, None
        signer = next((key for key in keys if signature_verifies(head, key)), None)
        if signer is None:
            return 0, None
        records = log.scan().records
        count = head["records"]
        if count > len(records) or (count and records[count - 1].get("hash") != head["hash"]):
            return 0, None  # the signed head anchors other records than these
        return count, signer.key_id

    def settled(self, digest: str) -> list[ResultRecord]:
        """`for_digest`, read under the log's append lock: an append in flight (its record written, its head not
        yet) is waited for instead of being taken for a line written outside trtpipe."""
        log = self._log(normalize_digest(digest))
        if not log.path.exists() and not log.head_path.exists():
            return []
        with log.lock():
            return self.for_digest(digest)

    def chain(self, digest: str) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """The whole chain of `digest`'s log as stored (records with seq, prev_hash, hash) and its head, after
        the same check `for_digest` makes (an IntegrityError naming the file when it fails)."""
        log = self._log(normalize_digest(digest))
        if not log.path.exists() and not log.head_path.exists():
            return [], None
        with log.lock():
            self.for_digest(digest)
            return log.scan().records, log.read_head()

    def merge(self, digest: str, records: list[dict[str, Any]], imported: dict[str, Any]) -> list[dict[str, Any]]:
        """Append each of `records` (results of `digest` from another workspace, checked by the caller) whose
        identity this log does not hold yet, with `imported` saying where it came from; returns those appended,
        as written here. Merges of one digest happen one at a time (a lock beside the log), so a bundle imported
        twice at once is still appended once; a damaged log here is refused before anything is appended."""
        digest = normalize_digest(digest)
        self.dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(self._path(digest)) + ".merge.lock", timeout=MERGE_LOCK_TIMEOUT_S)
        try:
            lock.acquire()
        except Timeout:
            raise TimedOut(f"another import has held {lock.lock_file} for {MERGE_LOCK_TIMEOUT_S:g} s",
                           operation="waiting to merge results", seconds=MERGE_LOCK_TIMEOUT_S,
                           fix="wait for it to finish and import again (an import is idempotent)") from None
        try:
            self.settled(digest)  # refuses a damaged log here, naming it
            log = self._log(digest)
            held = {result_identity(fields) for fields in log.scan().records}
            written: list[dict[str, Any]] = []
            for fields in records:
                identity = result_identity(fields)
                if identity in held:
                    continue
                body = {k: v for k, v in fields.items() if k not in CHAIN_FIELDS}
                written.append(log.append({**body, "imported": imported}, key=self.key))
                held.add(identity)
            return written
        finally:
            lock.release()


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


def current_user(settings: Settings) -> str:
    """Who is acting: the settings' actor ($TRTPIPE_USER, else the CI's actor: `trtpipe.settings`), else the
    login name."""
    return settings.actor or login_name()


def login_name() -> str:
    """The login name of this process's user (getpass), else `uid-N` (a container without a passwd entry)."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (some containers)
        return f"uid-{os.getuid()}"


def dump_records(records: list[ResultRecord]) -> list[dict[str, Any]]:
    return [json.loads(r.model_dump_json()) for r in records]
