"""The audit trail: one append-only JSONL file, `<home>/audit/audit.jsonl`, hash-chained.

Each record carries the hash of the previous one and its own hash over its canonical JSON, so an
edited, removed or reordered line breaks the chain and `verify_audit` (`trtpipe channels --verify`)
reports where. trtpipe only ever appends (O_APPEND, under a lock); it has no command that edits.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtpipe.errors import IntegrityError

AuditAction = Literal["promote", "force-promote", "rollback", "refused", "conflict"]
GENESIS = "sha256:" + "0" * 64


class AuditRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int
    at: str
    who: str
    action: AuditAction
    channel: str
    model: str
    target: str
    from_digest: str | None
    to_digest: str | None
    ref: str | None = None
    gates: list[dict[str, Any]] = Field(default_factory=list)
    gates_source: str | None = None
    reason: str | None = None
    detail: str | None = None
    prev_hash: str
    hash: str


def audit_path(home: Path) -> Path:
    return Path(home) / "audit" / "audit.jsonl"


def _record_hash(fields: dict[str, Any]) -> str:
    body = {k: v for k, v in fields.items() if k != "hash"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        return []
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def append_audit(home: Path, **fields: Any) -> AuditRecord:
    """Append one record chained to the last one. Fields: at, who, action, channel, model, target, ..."""
    path = audit_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock", timeout=60):
        lines = _read_lines(path)
        if lines:
            last = json.loads(lines[-1])
            seq, prev = int(last["seq"]) + 1, str(last["hash"])
        else:
            seq, prev = 1, GENESIS
        body = {"seq": seq, "prev_hash": prev, **fields}
        body = json.loads(AuditRecord.model_validate({**body, "hash": GENESIS}).model_dump_json())
        body["hash"] = _record_hash(body)
        record = AuditRecord.model_validate(body)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(body, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
    return record


def read_audit(home: Path, channel: str | None = None) -> list[AuditRecord]:
    """Every audit record (oldest first), optionally only those of one channel name."""
    path = audit_path(home)
    out: list[AuditRecord] = []
    for number, line in enumerate(_read_lines(path), start=1):
        try:
            record = AuditRecord.model_validate_json(line)
        except (ValidationError, ValueError):
            raise IntegrityError(f"{path}:{number}: audit record is not valid (the trail was edited by hand)",
                                 path=str(path)) from None
        if channel is None or record.channel == channel:
            out.append(record)
    return out


def verify_audit(home: Path) -> list[str]:
    """Problems in the hash chain (empty when intact): edited, dropped, inserted or reordered records."""
    path = audit_path(home)
    problems: list[str] = []
    prev = GENESIS
    expected_seq = 1
    for number, line in enumerate(_read_lines(path), start=1):
        try:
            fields = json.loads(line)
        except ValueError:
            problems.append(f"{path}:{number}: not JSON")
            prev = "?"
            continue
        if fields.get("prev_hash") != prev:
            problems.append(f"{path}:{number}: chain broken (prev_hash does not match the record before it: a record was removed, inserted or reordered)")
        if _record_hash(fields) != fields.get("hash"):
            problems.append(f"{path}:{number}: record hash mismatch (the record was edited)")
        if fields.get("seq") != expected_seq:
            problems.append(f"{path}:{number}: sequence {fields.get('seq')} where {expected_seq} was expected")
        prev = str(fields.get("hash"))
        expected_seq = int(fields.get("seq", expected_seq)) + 1 if isinstance(fields.get("seq"), int) else expected_seq + 1
    return problems
