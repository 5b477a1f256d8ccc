"""One trail per channel, many writers: a channel promoted through a registry keeps its trail there.

A channel whose artifacts live in a registry (`oci://HOST/REPO`) is shared by every workspace that
promotes into it: a laptop, a CI runner, a second release runner. Its trail (every promote,
force-promote, rollback and aborted move of that channel, hash-chained, its head signed with the
release key when one is set) is kept in that repository under the movable tag
`trail.<model>.<target>.<channel>`: an OCI manifest whose config blob is the head and whose one layer
is the JSONL records. Each workspace keeps the copy it last adopted at
`<home>/audit/channels/<model>/<target>/<channel>.jsonl` (with its head and `<channel>.source.json`:
where the registry copy lives, the manifest digest adopted, and the hashes of the records this
workspace wrote). The channel is what replaying that copy gives (`trtpipe.release.projection`).

Writing (promote, rollback): read the registry's copy (the tag's manifest digest D and the trail);
check it (below) and adopt it; decide the move on it; append the record; store the new copy by digest;
read the tag again and move it only if it still names D (`OciRemote.put_channel_trail`); then read it
back and look for the record just written. A lost race (the tag moved before the PUT, or the copy read
back lacks the record) is retried from the top, at most `MAX_ATTEMPTS` times, and a retry that finds the
channel moved by another writer is a conflict, not a retry: the gates were judged against what the
channel held. The registry (distribution v2, like the OCI distribution spec) has no conditional tag
update, so one race stays open: a writer whose read of D and PUT straddle this writer's PUT and
read-back overwrites it unseen by either. Its trace is certain, though: the next read by the writer
that lost finds the registry's record N differing from the one it wrote and read back, and reports it
as exactly that (the `written` hashes say which records were its own); nothing adopts it silently.

Checking (the one rule `channels --verify` and the release page both apply, `standing`): the registry's
copy must be a sound chain whose head anchors all of it (signed by the release key, when one is set),
holding only this channel's records; and it must extend this workspace's copy record for record
(same hashes). Longer and consistent: this workspace is behind, and catches up (adopts it). Shorter,
or differing at some record: the registry's trail was shortened or rewritten (or, at a record this
workspace wrote, lost to the race above), reported and refused. Without a key, a rewrite is caught
by every workspace that had adopted the records rewritten; one that never saw them (a fresh one)
cannot tell; with a key, a rewrite without the key fails the head's signature everywhere. A signed registry
trail is extended only with the key (`require_signer`): a keyless move would leave an unsigned head there.
Each head written carries the next sequence after the registry head it extends (`trtpipe.chained`).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtpipe.atomic import write_text_atomically
from trtpipe.chained import ChainedLog, HeadKey, chained_line, head_bytes_of, head_document, scan_bytes, signature_verifies
from trtpipe.errors import Conflict, IntegrityError, TagMoved, TrtpipeError
from trtpipe.release.audit import AuditRecord, marks_dir
from trtpipe.store.remote import ChannelMirror

MAX_ATTEMPTS = 6
WRITTEN_KEPT = 64  # how many of its own record hashes a workspace remembers per channel
SHARED_ACTIONS = ("promote", "force-promote", "rollback", "aborted")


def channel_tag(model: str, target: str, channel: str) -> str:
    """The registry tag that follows a channel: `<model>.<target>.<channel>`, at most 128 characters (the
    names are plain, `check_name`, so it is a valid OCI tag as it is)."""
    return f"{model}.{target}.{channel}"[:128]


def trail_tag(model: str, target: str, channel: str) -> str:
    """The registry tag a channel's trail is kept under, beside the channel tag `<model>.<target>.<channel>`."""
    return f"trail.{model}.{target}.{channel}"[:128]


class TrailSource(BaseModel):
    """Where a shared channel's trail lives and what this workspace last adopted of it."""

    model_config = ConfigDict(extra="forbid")

    remote: str  # the registry repository, oci://HOST/REPO
    tag: str
    digest: str | None = None  # the registry copy's manifest digest last adopted
    written: list[str] = Field(default_factory=list)  # hashes of records this workspace wrote and read back


@dataclass(frozen=True)
class SharedChannel:
    """One channel's shared trail as this workspace sees it."""

    home: Path
    model: str
    target: str
    channel: str

    @property
    def cid(self) -> tuple[str, str, str]:
        return (self.model, self.target, self.channel)

    @property
    def label(self) -> str:
        return f"{self.model}/{self.target}/{self.channel}"

    @property
    def tag(self) -> str:
        return trail_tag(self.model, self.target, self.channel)

    @property
    def log(self) -> ChainedLog:
        path = Path(self.home) / "audit" / "channels" / self.model / self.target / f"{self.channel}.jsonl"
        # The head names the channel, not the file: the same trail is the same log in every workspace.
        mark = marks_dir(self.home) / "channels" / self.model / self.target / f"{self.channel}.head.json"
        return ChainedLog(path, what=f"trail of channel {self.label}", log_name=f"channel-trail:{self.label}", mark=mark)

    @property
    def source_path(self) -> Path:
        return self.log.path.with_name(f"{self.channel}.source.json")

    def source(self) -> TrailSource | None:
        try:
            return TrailSource.model_validate_json(self.source_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, ValidationError):
            raise IntegrityError(f"{self.source_path}: not a channel trail source (edited)", path=str(self.source_path),
                                 fix="remove it; the next promote of the channel adopts the registry's trail again") from None

    def local_records(self) -> list[AuditRecord]:
        """This workspace's adopted copy of the trail, as records (its chain is checked by `standing`)."""
        return as_records(self.log.scan().records, str(self.log.path))

    def write_source(self, source: TrailSource) -> None:
        write_text_atomically(self.source_path, source.model_dump_json(indent=2) + "\n", mode=0o644)


def shared_channels(home: Path) -> list[SharedChannel]:
    """Every channel this workspace shares through a registry (it has adopted that channel's trail)."""
    root = Path(home) / "audit" / "channels"
    if not root.is_dir():
        return []
    out = []
    for path in sorted(root.glob("*/*/*.source.json")):
        out.append(SharedChannel(Path(home), path.parent.parent.name, path.parent.name, path.name[: -len(".source.json")]))
    return out


def shared_channel(home: Path, model: str, target: str, channel: str) -> SharedChannel | None:
    """The channel's shared trail, if this workspace shares it."""
    found = SharedChannel(Path(home), model, target, channel)
    return found if found.source_path.exists() else None


def as_records(raw: list[dict[str, Any]], where: str) -> list[AuditRecord]:
    out = []
    for number, fields in enumerate(raw, start=1):
        try:
            out.append(AuditRecord.model_validate(fields))
        except (ValidationError, ValueError):
            raise IntegrityError(f"{where}:{number}: not a valid trail record (edited)", path=where) from None
    return out


# --------------------------------------------------------------------------- the registry's copy


@dataclass
class RegistryCopy:
    """The registry's copy of a channel trail, read and checked on its own."""

    where: str  # oci://HOST/REPO:TAG
    digest: str
    log: bytes
    head_raw: bytes
    records: list[dict[str, Any]]
    problems: list[str]
    legacy: bool = False  # a head-only copy of one workspace's trail (before trails were shared)


def read_registry(remote: ChannelMirror, shared: SharedChannel, key: HeadKey | None) -> RegistryCopy | None:
    """The registry's copy of the channel's trail and every problem with it alone, or None when there is none."""
    copy = remote.get_channel_trail(shared.tag)
    if copy is None:
        return None
    where = f"{remote.url}:{shared.tag}"
    if copy.log is None:
        return RegistryCopy(where, copy.digest, b"", copy.head, [], [], legacy=True)
    scan = scan_bytes(copy.log, where)
    problems = list(scan.problems)
    if scan.tail:
        problems.append(f"{where}: the trail's last line is incomplete (the copy was written outside trtpipe)")
    try:
        head = json.loads(copy.head)
        if not isinstance(head, dict):
            raise ValueError
    except ValueError:
        head = {}
    n = len(scan.records)
    last = scan.records[-1].get("hash") if scan.records else None
    if head.get("log") != shared.log.log_name:
        problems.append(f"{where}: its head is not the head of channel {shared.label}'s trail (it names {str(head.get('log'))[:80]!r})")
    elif head.get("records") != n or (n and head.get("hash") != last):
        problems.append(f"{where}: its head anchors {head.get('records')} records ending {str(head.get('hash'))[:19]}, the trail "
                        f"holds {n} ending {str(last)[:19]} (records were removed, added or rewritten outside trtpipe)")
    if key is not None and not signature_verifies(head, key):
        problems.append(f"{where}: its head is not signed by the release key {key.key_id[:16]} (rewritten without the key, "
                        "or written by a workspace without it)")
    for number, fields in enumerate(scan.records, start=1):
        if (fields.get("model"), fields.get("target"), fields.get("channel")) != shared.cid \
                or fields.get("action") not in SHARED_ACTIONS:
            problems.append(f"{where}:{number}: a record that is not a move of channel {shared.label} (spliced in)")
            break
    return RegistryCopy(where, copy.digest, copy.log, copy.head, scan.records, problems)


# --------------------------------------------------------------------------- the verdict


@dataclass
class Standing:
    """This workspace's copy of a shared channel's trail against the registry's: the one verdict `channels
    --verify` and the release page render."""

    shared: SharedChannel
    state: str  # same | behind | new | legacy | absent | unreadable | damaged | shortened | rewritten
    problems: list[str] = field(default_factory=list)
    truth: list[dict[str, Any]] = field(default_factory=list)  # the records the channel's state is replayed from
    registry: RegistryCopy | None = None
    note: str | None = None  # not a problem: e.g. behind and catching up

    @property
    def consistent(self) -> bool:
        return not self.problems

    def records(self) -> list[AuditRecord]:
        """The channel's trail as the verdict reads it (the registry's when consistent, else this workspace's)."""
        where = self.registry.where if self.registry is not None and self.truth is self.registry.records else str(self.shared.log.path)
        return as_records(self.truth, where)


def _local(shared: SharedChannel, key: HeadKey | None) -> tuple[list[dict[str, Any]], list[str]]:
    log = shared.log
    if not log.path.exists() and not log.head_path.exists():
        return [], []
    problems = [p for p in log.verify(key) if "are not anchored" not in p]  # a head behind its log: mended on adoption
    return log.scan().records, problems


def standing(shared: SharedChannel, remote: ChannelMirror | None, key: HeadKey | None, *,
             fetch_error: str | None = None) -> Standing:
    """Compare this workspace's copy with the registry's (None: not reachable, `fetch_error` says why)."""
    local, local_problems = _local(shared, key)
    if remote is None:
        return Standing(shared, "unreadable", [f"{shared.label}: the registry's copy of the channel trail could not be read "
                                               f"({fetch_error or 'no registry'})"], local)
    try:
        copy = read_registry(remote, shared, key)
    except TrtpipeError as err:  # unreachable, refused, not a trail: said, never a traceback
        return Standing(shared, "unreadable", [f"{remote.url}:{shared.tag}: the registry's copy of the channel trail could "
                                               f"not be read ({err.one_line()})"], local)
    return compare(shared, local, local_problems, copy, remote.url)


def compare(shared: SharedChannel, local: list[dict[str, Any]], local_problems: list[str], copy: RegistryCopy | None,
            where_base: str) -> Standing:
    """The verdict on the local copy `local` against the registry's `copy` (pure: no I/O)."""
    where = f"{where_base}:{shared.tag}"
    if local_problems:
        return Standing(shared, "damaged", local_problems, local, copy)
    if copy is None or copy.legacy:
        if local:
            return Standing(shared, "absent", [f"{where}: the registry holds no trail of channel {shared.label}, whose "
                                               f"{len(local)} records this workspace adopted (the tag was deleted or moved)"],
                            local, copy)
        return Standing(shared, "legacy" if copy is not None else "new", [], [], copy)
    if copy.problems:
        return Standing(shared, "damaged", copy.problems, local, copy)
    mine = set(_written(shared))
    for number, (ours, theirs) in enumerate(zip(local, copy.records), start=1):
        if ours.get("hash") != theirs.get("hash"):
            # Lost to the open race only if everything from here on is this workspace's own last write: a
            # record confirmed by a later read (which adopted records after it) was there then.
            if all(r.get("hash") in mine for r in local[number - 1:]):
                why = (f"record {number}, which this workspace wrote and read back ({ours.get('action')} at {ours.get('at')}), "
                       f"is not there: another writer's copy replaced it ({theirs.get('action')} by {theirs.get('who')} at "
                       f"{theirs.get('at')}; the registry has no atomic tag update), or the trail was rewritten from there")
            else:
                why = (f"rewritten: record {number} differs from the one this workspace adopted ({ours.get('action')} "
                       f"by {ours.get('who')} at {ours.get('at')})")
            return Standing(shared, "rewritten", [f"{where}: {why}"], local, copy)
    if len(copy.records) < len(local):
        return Standing(shared, "shortened", [f"{where}: shortened: the registry's trail holds {len(copy.records)} records, "
                                              f"this workspace adopted {len(local)} (records {len(copy.records) + 1}.."
                                              f"{len(local)} are gone, or the tag was moved back)"], local, copy)
    if len(copy.records) > len(local):
        return Standing(shared, "behind", [], copy.records, copy,
                        note=f"{shared.label}: {len(copy.records) - len(local)} record(s) behind the registry's trail "
                             f"(consistent; adopted by the next promote, rollback or channels listing)")
    return Standing(shared, "same", [], copy.records, copy)


def _head_of(copy: RegistryCopy | None) -> dict[str, Any] | None:
    """The registry copy's head (what the next head's sequence follows), None when there is none to follow."""
    if copy is None or copy.legacy:
        return None
    try:
        head = json.loads(copy.head_raw)
    except ValueError:
        return None
    return head if isinstance(head, dict) else None


def _written(shared: SharedChannel) -> list[str]:
    try:
        source = shared.source()
    except IntegrityError:
        return []
    return source.written if source is not None else []


def require_consistent(found: Standing) -> None:
    if found.problems:
        raise IntegrityError(f"{found.problems[0]}; nothing was changed", path=str(found.shared.log.path),
                             fix="compare the registry's channel trail with a workspace that holds all of it, and restore the "
                                 "registry's copy from there")


def adopt(shared: SharedChannel, found: Standing, remote_url: str, *, mine: list[str] = ()) -> bool:
    """Make the registry's (consistent) copy this workspace's (the caller holds the release lock); True when
    anything changed. `mine`: hashes of records this workspace just wrote."""
    copy = found.registry
    if copy is None or copy.legacy or found.problems:
        return False
    source = shared.source()
    written = [*(source.written if source else []), *mine][-WRITTEN_KEPT:]
    log = shared.log
    changed = not log.path.exists() or log.path.read_bytes() != copy.log or log.head_bytes() != copy.head_raw
    if changed:
        log.path.parent.mkdir(parents=True, exist_ok=True)
        log.replace(copy.log, copy.head_raw)
    if changed or source is None or source.digest != copy.digest or mine:
        shared.write_source(TrailSource(remote=remote_url, tag=shared.tag, digest=copy.digest, written=written))
    return changed


# --------------------------------------------------------------------------- writing


def require_signer(copy: RegistryCopy | None, key: HeadKey | None) -> None:
    """A signed registry trail is extended only with the key: a move without it would write an unsigned head
    there, which every workspace with the key refuses from then on (and which is what a forger leaves)."""
    if copy is None or copy.legacy or (key is not None and key.can_sign):
        return
    head = _head_of(copy) or {}
    if head.get("signature"):
        raise IntegrityError(f"{copy.where}: the channel's trail is signed (key {str(head.get('key_id'))[:16]}); a move "
                             "without the release key would leave it unsigned; nothing was changed", path=copy.where,
                             fix="set TRTPIPE_SIGNING_KEY to the release key where this channel is promoted and rolled back")



FieldsFor = Callable[[list[AuditRecord]], list[dict[str, Any]]]


def append(shared: SharedChannel, remote: ChannelMirror, key: HeadKey | None, fields_for: FieldsFor, *,
           pause: Callable[[float], None] = time.sleep) -> tuple[list[AuditRecord], Standing]:
    """Append the records `fields_for(current records)` gives to the registry's copy of the channel's trail by
    compare-and-swap, retried on a lost race; adopt the result. `fields_for` sees the channel as the registry
    holds it at each attempt and raises (a Conflict) when the move it makes is no longer the one decided.
    Returns the records written and the standing after. The caller holds the release lock."""
    jitter = random.Random()
    lost: list[str] = []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        found = standing(shared, remote, key)
        require_consistent(found)
        require_signer(found.registry, key)
        adopt(shared, found, remote.url)
        copy = found.registry
        records = list(found.truth)
        written: list[dict[str, Any]] = []
        data = copy.log if copy is not None and not copy.legacy else b""
        for fields in fields_for(as_records(records, str(shared.log.path))):
            body, line = chained_line(records, fields)
            records.append(body)
            written.append(body)
            data += line
        head = head_bytes_of(head_document(shared.log.log_name, records, key, previous=_head_of(copy)))
        expect = copy.digest if copy is not None else None
        try:
            remote.put_channel_trail(shared.tag, head, data, expect=expect)
        except TagMoved as err:
            lost.append(err.message)
            pause(jitter.uniform(0.02, 0.25) * attempt)
            continue
        after = standing(shared, remote, key)
        there = after.truth if after.consistent else []
        if all(len(there) >= r["seq"] and there[r["seq"] - 1].get("hash") == r["hash"] for r in written):
            adopt(shared, after, remote.url, mine=[r["hash"] for r in written])
            return as_records(written, after.registry.where if after.registry else str(shared.log.path)), after
        lost.append(f"the copy read back from {remote.url}:{shared.tag} does not hold record {written[-1]['seq']} "
                    "(another writer moved the tag in between)")
        pause(jitter.uniform(0.02, 0.25) * attempt)
    raise Conflict(
        f"the trail of channel {shared.label} in {remote.url} kept moving: {MAX_ATTEMPTS} attempts lost to other writers "
        f"(last: {lost[-1] if lost else '?'}); nothing was changed",
        resource=f"{remote.url}:{shared.tag}", fix="try again when the other promotions of this channel have finished",
    )
