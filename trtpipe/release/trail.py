"""The trail is the truth: channel pointers are what replaying the audit trail gives, and nothing else.

Promotion and rollback append their record (fsynced) before they move a registry tag or a pointer,
so a crash can leave a pointer BEHIND the trail, never ahead of it. `replay` rebuilds every channel's
pointer (digest, ref, rollback history) from the trail; `disagreements` compares the pointer files
with it. A pointer that stands exactly where the trail stood before that channel's last move is an
interrupted move: `reconcile` completes it (registry tag, then pointer) and records a `repair`.
Any other disagreement (a pointer at a digest the trail never put there, a pointer file deleted
or written by hand) is reported by `channels --verify` and refuses promotion and rollback of that
channel, recorded as `refused`; nothing is trusted from the pointer file.

`release_key` adapts the release key (`trtpipe.release.keys`) to what signs the trail's and result
logs' heads (`trtpipe.chained.HeadKey`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trtpipe.errors import IntegrityError, TrtpipeError
from trtpipe.release.audit import AuditRecord, append_audit, read_audit
from trtpipe.release.channels import ChannelPointer, ChannelScope, ChannelStore, PointerTarget, now_iso
from trtpipe.release.keys import PrivateKey, PublicKey, load_public_key, load_signing_key, sign_bytes, verify_bytes
from trtpipe.settings import Settings
from trtpipe.store.remote import RemoteCache

ChannelId = tuple[str, str, str]  # model, target, channel
MOVES = ("promote", "force-promote", "rollback")


@dataclass(frozen=True)
class ReleaseKey:
    """The release key as a head signer (a private key) or checker (a public key file)."""

    key: PrivateKey | PublicKey

    @property
    def key_id(self) -> str:
        return self.key.key_id

    @property
    def can_sign(self) -> bool:
        return isinstance(self.key, PrivateKey)

    def sign(self, data: bytes) -> bytes:
        assert isinstance(self.key, PrivateKey)
        return sign_bytes(self.key, data)

    def verify(self, data: bytes, signature: bytes) -> bool:
        public = self.key.public if isinstance(self.key, PrivateKey) else self.key
        return verify_bytes(public, data, signature)


def release_key(settings: Settings | None, public_key: Path | None = None) -> ReleaseKey | None:
    """The key heads are signed or checked with: a public key file given to check with, else the
    TRTPIPE_SIGNING_KEY setting (the private key; its public half checks), else none."""
    if public_key is not None:
        return ReleaseKey(load_public_key(public_key))
    if settings is not None and settings.signing_key:
        return ReleaseKey(load_signing_key(settings.signing_key))
    return None


# --------------------------------------------------------------------------- replay


@dataclass
class Replayed:
    """What the trail says of every channel: its pointer, and for each its last move and the state before."""

    pointers: dict[ChannelId, ChannelPointer]
    last_move: dict[ChannelId, AuditRecord]
    before_last_move: dict[ChannelId, ChannelPointer | None]


def _id(record: AuditRecord) -> ChannelId:
    return (record.model, record.target, record.channel)


def replay(records: list[AuditRecord]) -> Replayed:
    state: dict[ChannelId, ChannelPointer] = {}
    last_move: dict[ChannelId, AuditRecord] = {}
    before: dict[ChannelId, ChannelPointer | None] = {}
    snapshots: dict[int, tuple[ChannelId, ChannelPointer | None, AuditRecord | None, ChannelPointer | None]] = {}
    for record in records:
        cid = _id(record)
        if record.action in MOVES and record.to_digest:
            prior = state.get(cid)
            snapshots[record.seq] = (cid, prior, last_move.get(cid), before.get(cid))
            state[cid] = apply(prior, record)
            last_move[cid], before[cid] = record, prior
        elif record.action == "aborted" and record.undoes in snapshots:
            cid, prior, move, prior_before = snapshots[record.undoes]
            if prior is None:
                state.pop(cid, None)
            else:
                state[cid] = prior
            if move is None:
                last_move.pop(cid, None)
                before.pop(cid, None)
            else:
                last_move[cid], before[cid] = move, prior_before
    return Replayed(state, last_move, before)


def apply(prior: ChannelPointer | None, record: AuditRecord) -> ChannelPointer:
    """The pointer a promote or rollback record puts in place over `prior`."""
    if record.action == "rollback" and prior is not None and prior.history:
        back = prior.history[-1]
        return ChannelPointer(channel=record.channel, model=record.model, target=record.target, digest=back.digest,
                              ref=back.ref, set_at=record.at, set_by=record.who, history=prior.history[:-1])
    history = list(prior.history) if prior is not None else []
    if prior is not None and record.action != "rollback":
        history.append(PointerTarget(digest=prior.digest, ref=prior.ref, set_at=prior.set_at, set_by=prior.set_by))
    return ChannelPointer(channel=record.channel, model=record.model, target=record.target, digest=record.to_digest or "",
                          ref=record.ref, set_at=record.at, set_by=record.who, history=history)


def _same(a: ChannelPointer | None, b: ChannelPointer | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.digest == b.digest and [h.digest for h in a.history] == [h.digest for h in b.history]


@dataclass(frozen=True)
class Disagreement:
    cid: ChannelId
    pointer: ChannelPointer | None
    trail: ChannelPointer | None
    interrupted: bool  # the pointer stands where the trail stood before the channel's last move

    def line(self, home: Path) -> str:
        model, target, channel = self.cid
        path = ChannelStore(home).path(ChannelScope(model=model, target=target), channel)
        says = self.pointer.digest if self.pointer else "nothing (the file is missing)"
        last = self.trail.digest if self.trail else "nothing (no promotion of this channel)"
        why = ("a promotion or rollback was interrupted after its audit record and before the pointer moved"
               if self.interrupted else "the pointer was changed outside trtpipe, or the trail lost records")
        return f"{path}: the pointer names {says}, the audit trail's last word is {last} ({why})"


def disagreements(home: Path, records: list[AuditRecord] | None = None) -> list[Disagreement]:
    """Every channel whose pointer file is not what the trail says."""
    replayed = replay(read_audit(home) if records is None else records)
    pointers = {(p.model, p.target, p.channel): p for p in ChannelStore(home).all()}
    out = []
    for cid in sorted(set(pointers) | set(replayed.pointers)):
        pointer, trail = pointers.get(cid), replayed.pointers.get(cid)
        if not _same(pointer, trail):
            interrupted = cid in replayed.last_move and _same(pointer, replayed.before_last_move.get(cid))
            out.append(Disagreement(cid, pointer, trail, interrupted))
    return out


def reconcile(home: Path, scope: ChannelScope, channel: str, *, who: str, key: ReleaseKey | None = None,
              settings: Settings | None = None) -> AuditRecord | None:
    """Bring one channel's pointer to the trail's last word if a move was interrupted (recorded as
    `repair`); refuse (recorded as `refused`) if the pointer disagrees otherwise. The caller holds
    the release lock. Returns the repair record, or None when the pointer agrees."""
    cid: ChannelId = (scope.model, scope.target, channel)
    replayed = replay(read_audit(home))
    pointer, trail = ChannelStore(home).get(scope, channel), replayed.pointers.get(cid)
    if _same(pointer, trail):
        return None
    found = Disagreement(cid, pointer, trail, cid in replayed.last_move and _same(pointer, replayed.before_last_move.get(cid)))
    if not found.interrupted or found.trail is None:
        append_audit(home, key=key, at=now_iso(), who=who, action="refused", channel=channel, model=scope.model,
                     target=scope.target, from_digest=found.pointer.digest if found.pointer else None,
                     to_digest=None, detail="channel pointer disagrees with the trail: " + found.line(home))
        raise IntegrityError(
            f"{found.line(home)}; nothing changed",
            path=str(ChannelStore(home).path(scope, channel)),
            fix="put the pointer back where the audit trail says (its last promote or rollback record for this "
                "channel names the digest), or restore the trail from a backup",
        )
    _move_registry_tag(home, found.trail, settings)
    ChannelStore(home).write(found.trail)
    return append_audit(home, key=key, at=now_iso(), who=who, action="repair", channel=channel, model=scope.model,
                        target=scope.target, from_digest=found.pointer.digest if found.pointer else None,
                        to_digest=found.trail.digest, ref=found.trail.ref,
                        detail="completed an interrupted move: the pointer now names what the trail's last record says")


def trail_head_tag(model: str, target: str, channel: str) -> str:
    """The registry tag the trail's head is kept under, beside the channel tag `<model>.<target>.<channel>`."""
    return f"trail.{model}.{target}.{channel}"[:128]


def publish_channel(home: Path, remote: RemoteCache, pinned: str, model: str, target: str, channel: str) -> str:
    """Move the registry's channel tag to `pinned` and keep the trail's (signed) head beside it, under
    `trail_head_tag`: truncating or rewriting the local trail then disagrees with the registry's copy."""
    from trtpipe.release.audit import trail_log
    from trtpipe.release.promote import channel_tag

    tag = channel_tag(model, target, channel)
    remote.point_tag(pinned, tag)
    head = trail_log(home).head_bytes()
    if head is not None:
        remote.put_trail_head(trail_head_tag(model, target, channel), head)
    return tag


def _move_registry_tag(home: Path, pointer: ChannelPointer, settings: Settings | None) -> None:
    from trtpipe.store.remote import is_remote_url, open_remote_for_ref

    if pointer.ref and is_remote_url(pointer.ref):
        publish_channel(home, open_remote_for_ref(pointer.ref, settings), pointer.ref, pointer.model, pointer.target,
                        pointer.channel)


def registry_problems(home: Path, key: ReleaseKey | None, settings: Settings | None) -> list[str]:
    """The local trail against every copy of its head the registry keeps beside a channel tag."""
    from trtpipe.release.audit import trail_log
    from trtpipe.store.remote import is_remote_url, open_remote_for_ref

    log = trail_log(home)
    seen: dict[tuple[str, str], ChannelPointer] = {}
    for pointer in [*ChannelStore(home).all(), *replay(read_audit(home)).pointers.values()]:
        if pointer.ref and is_remote_url(pointer.ref):
            seen.setdefault((pointer.ref.split("@")[0], trail_head_tag(pointer.model, pointer.target, pointer.channel)), pointer)
    problems: list[str] = []
    for (base, tag), pointer in sorted(seen.items()):
        where = f"in the registry ({base}:{tag})"
        try:
            raw = open_remote_for_ref(pointer.ref or "", settings).get_trail_head(tag)
        except TrtpipeError as err:
            problems.append(f"{base}:{tag}: the registry's copy of the trail head could not be read ({err.one_line()})")
            continue
        if raw is None:
            problems.append(f"{base}:{tag}: the registry holds no copy of the trail head for a channel it tags")
            continue
        try:
            head = json.loads(raw)
        except ValueError:
            head = {}
        problems.extend(log.check_copy(head if isinstance(head, dict) else {}, where, key))
    return problems


def verify_trail(home: Path, key: ReleaseKey | None = None, settings: Settings | None = None, *,
                 registry: bool = False) -> list[str]:
    """Everything `channels --verify` checks: the chain, the anchored head (signed, with a key), every
    pointer against the trail's last word, and (`registry`) the copies of the head the registry keeps."""
    from trtpipe.release.audit import verify_audit

    problems = verify_audit(home, key)
    try:
        problems.extend(d.line(home) for d in disagreements(home))
        if registry:
            problems.extend(registry_problems(home, key, settings))
    except IntegrityError as err:
        problems.append(err.one_line())
    return problems
