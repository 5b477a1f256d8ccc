"""The audit trail: one append-only JSONL file, `<home>/audit/audit.jsonl`, hash-chained, its head anchored.

Each record carries the hash of the previous one and its own hash over its canonical JSON, so an
edited, removed or reordered line breaks the chain; the head beside it (`audit/audit.head.json`,
signed with the release key when one is set) shows a shortened, emptied, deleted or re-hashed trail
(`trtpipe.chained` says exactly what is detected with and without a key). `verify_audit`
(`trtpipe channels --verify`) reports every problem. trtpipe only ever appends (one fsynced write,
under a lock); a torn last line is mended by the next append and the mending recorded (`repair`).

The trail is the truth about channels: a promotion is its record, and the channels are what replaying
the trail gives (`trtpipe.release.projection`; `trtpipe.release.trail` judges the trails).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtpipe.chained import GENESIS, ChainedLog, HeadKey, Repair
from trtpipe.errors import IntegrityError

# repair: the trail mended itself (a torn line, a lagging head), a registry channel tag was moved back to the
# trail's last word, or (in trails kept before channels were the trail's projection) a pointer was; aborted: the
# promotion `undoes` names did not complete (nothing moved); policy: the workspace's trust policy was set, or a
# command ran with --no-policy (`trtpipe.release.workspace_policy`).
AuditAction = Literal["promote", "force-promote", "rollback", "refused", "conflict", "repair", "aborted", "policy"]
TRAIL_WIDE = "*"  # the channel/model/target of a record about the trail itself

__all__ = ["GENESIS", "AuditRecord", "append_audit", "audit_path", "marks_dir", "read_audit", "verify_audit", "trail_log"]


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
    undoes: int | None = None  # aborted: the seq of the promotion that did not complete
    prev_hash: str
    hash: str


def audit_path(home: Path) -> Path:
    return Path(home) / "audit" / "audit.jsonl"


def marks_dir(home: Path) -> Path:
    """Where the high-water marks of this workspace's trails are kept: outside `audit/`, so a trail folder
    cut back (or restored from an older copy) does not take its marks with it."""
    return Path(home) / "marks"


ADOPT_HINT = "`trtpipe channels --adopt-trail` (with TRTPIPE_SIGNING_KEY set)"


def trail_log(home: Path) -> ChainedLog:
    return ChainedLog(audit_path(home), what="audit trail", mark=marks_dir(home) / "audit.head.json", adopt_hint=ADOPT_HINT)


def append_audit(home: Path, *, key: HeadKey | None = None, adopt: bool = False, **fields: Any) -> AuditRecord:
    """Append one record chained to the last one (fsynced) and re-anchor the head (signed with `key`).
    Fields: at, who, action, channel, model, target, from_digest, to_digest, ... A torn last line or a
    lagging head is mended first, each mending recorded as a `repair` record before this one (with a signing
    key only what the key's signatures cover is mended; `adopt`: see `ChainedLog.append`)."""
    body = AuditRecord.model_validate({**fields, "seq": 0, "prev_hash": GENESIS, "hash": GENESIS}).model_dump(mode="json")
    for name in ("seq", "prev_hash", "hash"):
        body.pop(name)

    def repairs(found: list[Repair]) -> list[dict[str, Any]]:
        return [{**{k: v for k, v in body.items() if k in ("at", "who")}, "action": "repair", "channel": TRAIL_WIDE,
                 "model": TRAIL_WIDE, "target": TRAIL_WIDE, "from_digest": None, "to_digest": None, "ref": None,
                 "gates": [], "gates_source": None, "reason": None, "detail": f"trail {r.kind}: {r.detail}", "undoes": None}
                for r in found]

    written = trail_log(home).append(body, key=key, on_repair=repairs, adopt=adopt)
    return AuditRecord.model_validate(written)


def read_audit(home: Path, channel: str | None = None) -> list[AuditRecord]:
    """Every whole audit record (oldest first), optionally only those of one channel name. (The chain
    and head are checked by `verify_audit`; a torn last line is not a record yet.)"""
    log = trail_log(home)
    scan = log.scan()
    unreadable = next((p for p in scan.problems if "not a JSON record" in p or "an empty line" in p), None)
    if unreadable:
        raise IntegrityError(f"{unreadable} (the trail was edited by hand)", path=str(log.path))
    out: list[AuditRecord] = []
    for number, fields in enumerate(scan.records, start=1):
        try:
            record = AuditRecord.model_validate(fields)
        except (ValidationError, ValueError):
            raise IntegrityError(f"{log.path}:{number}: audit record is not valid (the trail was edited by hand)",
                                 path=str(log.path)) from None
        if channel is None or record.channel == channel:
            out.append(record)
    return out


def verify_audit(home: Path, key: HeadKey | None = None) -> list[str]:
    """Problems in the hash chain and its head (empty when intact): edited, dropped, inserted or
    reordered records; a shortened, emptied, deleted or re-hashed trail (with `key`, the head's
    signature is checked too)."""
    return trail_log(home).verify(key)
